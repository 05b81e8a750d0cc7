"""The job contract on the agent side: start a job as a process, read its events, stop it politely.

The job runs in its own process group (so `torchrun` and its workers all get the signal),
with its argv (bash only when the spec says `shell: true`; the spec's setup first, in the same process), the
spec's env and the BROKER_* variables of `broker.sdk`. Stopping sends SIGTERM ("checkpoint now and exit"),
waits the grace period, then SIGKILLs the group. A checkpoint without a stop is asked for with a
file (BROKER_CHECKPOINT_REQUEST), not a signal: a job that does not use the SDK ignores a file,
where a signal it does not handle would kill it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from broker.domain.model import JobSpec

DEFAULT_GRACE_S = 30.0


# The spec's setup runs first in the job's own process (bash, then exec of the job): the agent goes on turning
# (lease, notices, a stop) through a setup of minutes, which inside its turn outlasted the lease.
SETUP_THEN_RUN = 'bash -c "$0" || { code=$?; echo "broker: setup exited with $code" >&2; exit $code; }; exec "$@"'


def job_argv(spec: JobSpec) -> list[str]:
    """The argv that runs the spec: its own argv, or bash -c for `shell: true`; after its setup, if any."""
    argv = ["bash", "-c", spec.run[0]] if spec.shell else list(spec.run)
    return ["bash", "-c", SETUP_THEN_RUN, spec.setup, *argv] if spec.setup else argv


class JobProcess:
    """One run of a job on this machine."""

    def __init__(
        self,
        spec: JobSpec,
        job_id: str,
        checkpoint_dir: str,
        run_dir: Path,
        resume_from: str | None = None,
        extra_env: dict[str, str] | None = None,
    ):
        self.spec = spec
        self.job_id = job_id
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.events_file = self.run_dir / "events.jsonl"
        self.log_file = self.run_dir / "output.log"
        self.checkpoint_request = self.run_dir / "checkpoint-request"
        # The agent's Python environment is the job's default one (`python` in argv means it); the
        # agent's own BROKER_* settings (its Redis URL and password among them) never reach the job.
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
        inherited["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        self.env = {
            **inherited,
            **(extra_env or {}),
            **spec.env,
            "BROKER_JOB_ID": job_id,
            "BROKER_CHECKPOINT_DIR": checkpoint_dir,
            "BROKER_RESUME_FROM": resume_from or "",
            "BROKER_EVENTS_FILE": str(self.events_file),
            "BROKER_CHECKPOINT_REQUEST": str(self.checkpoint_request),
        }
        self.proc: subprocess.Popen | None = None
        self._events_offset = 0
        self._output_offset = 0

    @property
    def cwd(self) -> str | None:
        """The spec's workdir; `~` is this instance's home (load_spec already made a relative one absolute)."""
        return os.path.expanduser(self.spec.workdir) if self.spec.workdir else None

    def start(self) -> None:
        """Start the job (its setup first, in its process); raises OSError if it cannot start."""
        self.events_file.touch()
        log = open(self.log_file, "ab")
        try:
            self.proc = subprocess.Popen(
                job_argv(self.spec),
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def poll(self) -> int | None:
        """The exit code once the job ended, else None."""
        return self.proc.poll() if self.proc else None

    def events(self) -> list[dict]:
        """Events the job reported since the last call (progress, checkpoint, restored, ...)."""
        with open(self.events_file, "rb") as f:
            f.seek(self._events_offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for next time
        self._events_offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def request_checkpoint(self) -> None:
        """Ask the job to checkpoint at its next step and run on (sdk.should_save turns True; save() clears it)."""
        self.checkpoint_request.touch()

    def stop(
        self, grace_s: float = DEFAULT_GRACE_S, tick: Callable[[], None] | None = None, tick_s: float = 1.0
    ) -> int:
        """SIGTERM the job's process group, SIGKILL it after `grace_s`; returns the exit code. `tick` is called every
        `tick_s` while the job saves: its agent keeps its lease and forwards the job's events meanwhile."""
        if self.proc is None:
            raise RuntimeError("stop() before start()")
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self.proc.poll() is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    break
                try:
                    self.proc.wait(timeout=min(left, tick_s))
                except subprocess.TimeoutExpired:
                    if tick:
                        tick()
        return self.proc.wait()

    def kill(self) -> None:
        """SIGKILL the whole process group now."""
        self._signal(signal.SIGKILL)
        self.proc.wait()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout=timeout)

    def output(self, limit_bytes: int = 64_000) -> list[str]:
        """Whole lines the job printed since the last call (at most about `limit_bytes` a call: the rest next time)."""
        try:
            with open(self.log_file, "rb") as f:
                f.seek(self._output_offset)
                data = f.read(limit_bytes)
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1] if len(data) < limit_bytes else data
        self._output_offset += len(complete)
        return complete.decode(errors="replace").splitlines()

    def log_tail(self, lines: int = 20) -> list[str]:
        """The last lines the job printed (for the failure report)."""
        try:
            with open(self.log_file, errors="replace") as f:
                return [line.rstrip("\n") for line in deque(f, maxlen=lines)]
        except FileNotFoundError:
            return []
