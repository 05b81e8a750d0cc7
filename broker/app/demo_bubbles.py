"""`broker demo --bubbles`: a fill job in the bubbles of a real pipeline-parallel training job, then elsewhere.

A 4-stage DeepSpeed pipeline (examples/bubbles/train_gpt.py, CPU, gloo, torchrun) publishes its
bubble profiles and serves fill jobs as agents of tier bubble; one local agent stands for an
on-demand T4. The fill job (examples/bubbles/fill-mlp.yaml) is quoted on the bubbles (free), runs
in them step by step, and when the training job ends (the demo ends it once the fill job has a
checkpoint from the bubbles) it is checkpointed, handed back and finished on the on-demand agent from
that checkpoint. Real time (no compressed clock).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from broker.agents.checkpoints import CheckpointStore
from broker.agents.provision import LocalProvisioner
from broker.app.demo import job_summary, start_clean, totals
from broker.app.run import wait_for_agents
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.core.server import BrokerServer
from broker.domain.bubbles import stage_agent_id
from broker.domain.errors import BrokerError
from broker.domain.model import Tier
from broker.domain.specfile import load_spec
from broker.domain.stops import stops_held
from broker.pricing.catalog import PriceCatalog
from broker.store.jobs import Store
from broker.store.profiles import load_profiles
from broker.store.shards import ShardedStore

PREFIX = "broker-demo-bubbles:"
MAIN_JOB = "demo-llm"
STAGES = 4


def wait_for_a_stage(store: Store, training: subprocess.Popen, timeout_s: float, log_path: Path) -> None:
    """Until a pipeline stage serves its bubbles as an agent. A stage registers once one of its idle windows is
    long enough to fill; one whose windows stay short (a busy machine) may never, and the others still serve."""
    stages = [stage_agent_id(MAIN_JOB, s) for s in range(STAGES)]
    deadline = time.monotonic() + timeout_s
    while not any(store.lease_alive(s) for s in stages):
        if training.poll() is not None or time.monotonic() > deadline:
            raise BrokerError(f"demo: no pipeline stage registered its bubbles; see {log_path}")
        time.sleep(0.1)


def run_bubbles_demo(
    redis_url: str,
    home: Path,
    examples: Path,
    catalog: PriceCatalog,
    policy,
    timeout_s: float,
    training_steps: int = 3000,
    progress=None,
    show_in: ShardedStore | None = None,
) -> dict:
    """Run the training job and the fill job to the end (or the timeout); the summary. Training ends (its stop
    file; `training_steps` is a cap) once the fill job has a checkpoint from the bubbles, so the job moves on
    from there on any machine: a fast one would otherwise finish it in the bubbles. The ended fill job is
    copied, tagged demo-bubbles, to the store `show_in` (the user's)."""
    store, work, checkpoints = start_clean(redis_url, PREFIX, home / "demo-bubbles")
    stop = work / "stop-training"
    clock = SystemClock()
    server = BrokerServer(store, policy, clock, CheckpointStore(checkpoints))
    provisioner = LocalProvisioner(redis_url, checkpoints, work / "runs", prefix=PREFIX)
    on_demand = min(
        (o for o in catalog.offers if o.tier == Tier.on_demand and o.accelerator == "T4" and o.accelerator_count == 1),
        key=lambda o: o.price_usd_per_h,
    )
    env = {
        **os.environ,
        "BROKER_REDIS_URL": redis_url,
        "BROKER_PREFIX": PREFIX,
        "BROKER_CHECKPOINTS": checkpoints,
        "OMP_NUM_THREADS": "1",
    }
    torchrun = Path(sys.executable).with_name("torchrun")
    work.mkdir(parents=True, exist_ok=True)
    training = None
    try:
        # a stop as it starts would leave the training running, not yet held for the clean-up (domain/stops.py)
        with open(work / "training.log", "wb") as log, stops_held():
            training = subprocess.Popen(
                [
                    str(torchrun),
                    "--nproc_per_node",
                    str(STAGES),
                    str(examples / "bubbles" / "train_gpt.py"),
                    "--steps",
                    str(training_steps),
                    "--stop-file",
                    str(stop),
                    "--out",
                    str(work / "training"),
                    "--broker",
                    MAIN_JOB,
                ],
                env=env,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )
        provisioner.start("ondemand-t4", on_demand)
        wait_for_agents(store, ["ondemand-t4"], timeout_s, provisioner.run_root)
        wait_for_a_stage(store, training, timeout_s, work / "training.log")
        spec = load_spec(examples / "bubbles" / "fill-mlp.yaml", clock.now())
        job = Broker(store, catalog, policy, clock).submit(spec)
        deadline, stopping = time.monotonic() + timeout_s, False
        while time.monotonic() < deadline:
            server.round(block_ms=50)
            current = store.get_job(job.id)
            if not stopping and any(r.offer.tier == Tier.bubble and (r.checkpoint_step or 0) > 0 for r in current.runs):
                stop.touch()
                stopping = True
            if progress:
                progress(current, training.poll() is None)
            if current.state.terminal:
                break
        profiles = sorted((p for p in load_profiles(store) if p.main_job == MAIN_JOB), key=lambda p: p.stage)
        finished = store.get_job(job.id)
    finally:
        if training is not None and training.poll() is None:
            training.terminate()
            training.wait(timeout=30)
        provisioner.stop_all()
    if show_in is not None:
        show_in.publish_jobs(store, [job.id], tag="demo-bubbles")
    runs = [
        {
            "agent": r.agent,
            "tier": r.offer.tier.value,
            "end": r.end_reason,
            "checkpoint_step": r.checkpoint_step,
            "resume_from": r.resume_from,
            "seconds": round(r.hours(finished.updated_at) * 3600, 1),
        }
        for r in finished.runs
    ]
    stages = [
        {
            "stage": p.stage,
            "iteration_s": round(p.iteration_s, 4),
            "bubble_fraction": round(p.bubble_fraction(), 3),
            "usable_share": round(p.usable_s(0.001) / p.iteration_s, 3),
        }
        for p in profiles
    ]
    row = job_summary(finished)
    return {"main_job": MAIN_JOB, "stages": stages, "fill_job": {**row, "runs": runs}, **totals([row])}
