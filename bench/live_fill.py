"""A replayed stage's bubbles served through the live broker, for `bench/bubbles.py --live`.

The fill work reaches the stage the way a user's does: a private redis-server, a `broker server` process, the
fill job submitted with `broker submit` (its own process), and the stage's FillAgent in the stage's process
(broker.bubbles.agent.serve_stage, as `attach` starts it): assignment from the stream, the configuration probe,
progress and checkpoint reports, the heartbeat lease. What the stage pays for all of that shows in its iterations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import yaml

from broker.agents.checkpoints import CheckpointStore
from broker.bubbles.agent import serve_stage
from broker.store import embedded
from broker.store.shards import ShardedStore

ROOT = Path(__file__).resolve().parents[1]
FILL_SPEC = ROOT / "examples" / "bubbles" / "fill-mlp.yaml"
PREFIX = "broker-bench-bubbles:"
MAIN_JOB = "bench-llm"
ACCELERATOR = "T4"  # a label the stage's offer and the fill job share (the demo's), whatever the device


class LiveBroker:
    """Redis and a broker server for the bench's whole run; each stage's fill job is submitted to them."""

    def __init__(self):
        self._stack = ExitStack()
        self.home = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="broker-bench-")))
        self.redis_url = self._stack.enter_context(embedded.scratch())
        self.checkpoints = str(self.home / "checkpoints")
        self.env = {
            **os.environ,
            "BROKER_HOME": str(self.home),
            "BROKER_REDIS_URL": self.redis_url,
            "BROKER_PREFIX": PREFIX,
            "BROKER_CHECKPOINTS": self.checkpoints,
            "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}",
        }
        self.log = open(self.home / "server.log", "wb")
        self.server = subprocess.Popen(
            [sys.executable, "-m", "broker", "server", "--metrics-port", "0"],
            env=self.env,
            stdout=self.log,
            stderr=self.log,
            stdin=subprocess.DEVNULL,
        )
        self.store = ShardedStore(self.redis_url, PREFIX)

    def submit(self, stage: int, fill_config: dict) -> subprocess.Popen:
        """`broker submit` of a fill job that outlasts the run, for the bubbles alone, its task configured by env."""
        spec = yaml.safe_load(FILL_SPEC.read_text())
        spec["name"] = f"fill-stage{stage}"
        spec["run"] = [sys.executable, str(ROOT / "examples" / "bubbles" / "fill_mlp.py")]
        spec["tiers"] = ["bubble"]
        spec["work"]["steps"] = 10**7
        spec["env"] = {"STEPS": str(10**7), **{k: str(v) for k, v in fill_config.items()}}
        path = self.home / f"fill-stage{stage}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return subprocess.Popen(
            [sys.executable, "-m", "broker", "submit", str(path), "--json"],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def ended_run(self, job_id: str, timeout_s: float = 30.0):
        """The job once the server has applied its run's end (the agent's exit report), or as it stands then."""
        store, deadline = self.store.of_job(job_id), time.monotonic() + timeout_s
        job = store.get_job(job_id)
        while not (job.runs and job.runs[-1].end_reason) and time.monotonic() < deadline:
            time.sleep(0.2)
            job = store.get_job(job_id)
        return job

    def cancel(self, job_id: str) -> None:
        subprocess.run(
            [sys.executable, "-m", "broker", "cancel", job_id], env=self.env, capture_output=True, check=True
        )

    def close(self) -> None:
        if self.server.poll() is not None:  # it died during the run: say why
            self.log.flush()
            sys.stderr.write((self.home / "server.log").read_text()[-3000:])
        self.server.terminate()
        self.server.wait(timeout=30)
        self.log.close()
        self._stack.close()


class BrokerFill:
    """One stage's agent serving its bubbles, and the fill job submitted to it; `finish` reports as Filler does."""

    def __init__(self, live: LiveBroker, recorder, stage: int, iterations: list, fill_config: dict):
        self.live, self.stage = live, stage
        checkpoints = CheckpointStore(live.checkpoints)
        # any window is offered: what the agent makes of the windows is measured, not where the product draws the line
        self.agent = serve_stage(live.store, checkpoints, MAIN_JOB, stage, recorder, iterations, ACCELERATOR, 0.001)
        if self.agent is None:
            raise SystemExit(f"stage {stage}: no window long enough to offer; nothing to fill")
        self.registered_at = datetime.now(UTC)
        self.submitting = live.submit(stage, fill_config)

    def _since(self, at: datetime | None) -> float | None:
        return round((at - self.registered_at).total_seconds(), 1) if at else None

    def finish(self) -> dict:
        """Hand the job back (training is over), then what it did: the executor's steps, its chosen split."""
        out, err = self.submitting.communicate(timeout=120)
        if self.submitting.returncode:
            raise SystemExit(f"stage {self.stage}: broker submit failed: {err.strip()[-500:]}")
        job_id = json.loads(out)["job"]
        executor = self.agent.executor
        steps = list(executor.steps) if executor else []
        micro_steps, probing = (executor.micro_steps if executor else None), self.agent.probe is not None
        chosen_at = self.agent.chosen_at
        self.agent.leaving()
        self.agent.stop()
        job = self.live.ended_run(job_id)
        self.live.cancel(job_id)  # else the next stage's agent could be handed this job back
        return {
            "steps": steps,
            "kills": executor.kills if executor else 0,
            "missed_windows": self.agent.stats.missed,  # usable windows gone before the agent was free for them
            "job": job_id,
            "state": job.state.value,
            "runs": [{"agent": r.agent, "end": r.end_reason, "checkpoint_step": r.checkpoint_step} for r in job.runs],
            # from the stage's registration (the submit's process, the server's round, the fill process's start)
            "dispatched_s": self._since(job.runs[0].dispatched_at) if job.runs else None,
            "started_s": self._since(job.runs[0].started_at) if job.runs else None,
            "micro_steps": micro_steps,  # the split it ran on (1: as submitted)
            "probing": probing,  # still timing its configurations when training ended
            "chosen_at": chosen_at,
        }
