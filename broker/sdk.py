"""What a job imports to be preemptible: restore(), save(state), progress(done, total), should_save(),
should_stop().

The agent starts a job with:
    BROKER_JOB_ID              the job's id
    BROKER_CHECKPOINT_DIR      where this job's checkpoints go (a path or fsspec URL)
    BROKER_RESUME_FROM         the verified checkpoint to resume from ("" on a fresh start)
    BROKER_EVENTS_FILE         where progress and checkpoint events are appended (JSON lines)
    BROKER_CHECKPOINT_REQUEST  a file the agent creates when the broker wants a checkpoint now
SIGTERM means "checkpoint now and exit": should_stop() turns True, the job saves and
returns; the agent kills it after a grace period otherwise. The request file means "checkpoint
now and run on": near its deadline a preemption would lose work the job can no longer spare.
should_save() is True for either. A job written like this

    state = sdk.restore() or fresh_state()
    for step in range(state["step"], total):
        ...train one step...
        sdk.progress(step + 1, total)
        if sdk.should_save() or (step + 1) % 100 == 0:
            sdk.save(state_at(step + 1), step=step + 1)
            if sdk.should_stop():
                break

needs no other code to move between instances.
"""

from __future__ import annotations

import json
import os
import posixpath
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from broker.agents.checkpoints import CheckpointError, CheckpointStore, Manifest

STATE_FILE = "state.pt"


class _Stop:
    """Set by SIGTERM; read by should_stop()."""

    requested = False
    at: float | None = None


def _on_sigterm(signum, frame) -> None:
    _Stop.requested, _Stop.at = True, time.time()


signal.signal(signal.SIGTERM, _on_sigterm)


def job_id() -> str:
    return os.environ.get("BROKER_JOB_ID", "local")


_NOT_UNDER_AN_AGENT = "BROKER_CHECKPOINT_DIR is not set (an agent sets it; export it to keep them when run by hand)"


class _Local:
    """Run by hand (no agent): whether save() said once that it keeps nothing."""

    told = False


def _store() -> tuple[CheckpointStore, str]:
    directory = os.environ.get("BROKER_CHECKPOINT_DIR")
    if not directory:
        raise CheckpointError(f"{_NOT_UNDER_AN_AGENT}; give it to resume from BROKER_RESUME_FROM")
    return CheckpointStore(posixpath.dirname(directory.rstrip("/"))), posixpath.basename(directory.rstrip("/"))


def _emit(event: dict) -> None:
    line = json.dumps({**event, "job": job_id(), "at": time.time()})
    path = os.environ.get("BROKER_EVENTS_FILE")
    if not path:
        print(f"broker-event {line}", file=sys.stderr, flush=True)
        return
    with open(path, "a") as f:  # one short O_APPEND write per event: never interleaved
        f.write(line + "\n")


def should_stop() -> bool:
    """True once the agent asked the job to checkpoint and exit (SIGTERM)."""
    return _Stop.requested


def should_save() -> bool:
    """True when the agent asked for a checkpoint: before a stop (SIGTERM), or now, to run on (the request file)."""
    request = os.environ.get("BROKER_CHECKPOINT_REQUEST")
    return _Stop.requested or bool(request and os.path.exists(request))


def progress(done: float, total: float) -> None:
    """Report progress; the broker uses it for deadline tracking and work-lost accounting."""
    _emit({"type": "progress", "done": done, "total": total})


def save(state: Any, step: int) -> Manifest | None:
    """torch.save the state as checkpoint `step`, publish it with its manifest, and report it.

    None when the save failed (a full disk, an unreachable store): the failure is reported with its
    reason, the previous checkpoint stays the one to resume from, and the job may go on. None, said once, when
    the job runs by hand (no BROKER_CHECKPOINT_DIR): a script tried before it is submitted runs to its end."""
    if not os.environ.get("BROKER_CHECKPOINT_DIR"):  # run by hand, not by an agent: the job runs on, unsaved
        if not _Local.told:
            print(f"broker: {_NOT_UNDER_AN_AGENT}: checkpoints are not saved", file=sys.stderr, flush=True)
            _Local.told = True
        return None
    store, job = _store()
    request = os.environ.get("BROKER_CHECKPOINT_REQUEST")
    if request:  # this save answers it (a request made while it is written stays for the next)
        Path(request).unlink(missing_ok=True)
    began = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="broker-ckpt-") as tmp:
            torch.save(state, Path(tmp) / STATE_FILE)
            manifest = store.publish(job, step, Path(tmp))
    except (CheckpointError, OSError, RuntimeError) as err:  # torch.save reports a full disk as RuntimeError
        reason = str(err).splitlines()[0][:300]
        print(f"broker: checkpoint step {step} not saved: {reason}", file=sys.stderr, flush=True)
        _emit({"type": "checkpoint_failed", "step": step, "reason": reason})
        return None
    seconds = time.monotonic() - began
    _emit({"type": "checkpoint", "step": step, "url": manifest.url, "bytes": manifest.size_bytes, "seconds": seconds})
    return manifest


def restore(weights_only: bool = True) -> Any | None:
    """The state of the checkpoint to resume from, verified; None on a fresh start."""
    resume = os.environ.get("BROKER_RESUME_FROM")
    if not resume:
        return None
    store, job = _store()
    began = time.monotonic()
    manifest, problem = store.verified_at(job, resume)
    if problem:  # it broke after the agent chose it: fall back to the newest one that verifies
        manifest, _ = store.latest_verified(job)
        _emit({"type": "checkpoint_skipped", "url": resume, "reason": problem})
        if manifest is None:
            return None
    with store.open_file(manifest, STATE_FILE) as f:
        state = torch.load(f, weights_only=weights_only, map_location="cpu")
    _emit({"type": "restored", "step": manifest.step, "url": manifest.url, "seconds": time.monotonic() - began})
    return state
