"""Bubbles from a user's own DeepSpeed training script, in three calls:

    engine, *_ = deepspeed.initialize(model=pipeline_module, ...)
    bubbles = attach(engine, "llm-7b", redis_url=..., checkpoints=...)
    for step in range(steps):
        with bubbles.iteration():
            engine.train_batch(data_iter=data)
    bubbles.close()

`attach` makes the engine mark its bubbles (instrument.py). After `profile_steps` measured
iterations the stage publishes its profile and serves the broker's fill jobs in its bubbles as an
agent of tier bubble (agent.py); a stage whose windows are still too short keeps measuring and tries
again every `retry_steps`. `close` stops every stage taking work, then hands a running fill job
back with its checkpoint, so the broker moves it to spot or on-demand.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import torch

from broker.agents.checkpoints import CheckpointStore
from broker.bubbles.agent import FillAgent, serve_stage
from broker.bubbles.instrument import instrument
from broker.bubbles.recorder import BubbleRecorder
from broker.store.shards import ShardedStore


class Bubbles:
    """One pipeline stage's bubbles, offered to the broker while its engine trains."""

    def __init__(
        self,
        engine,
        main_job: str,
        store: ShardedStore,
        checkpoints: CheckpointStore,
        accelerator: str,
        profile_steps: int = 2,
        retry_steps: int = 20,
        min_window_s: float = 0.05,
        memory_budget_bytes: int = 2 * 1024**3,
        token: str | None = None,
    ):
        self.engine, self.main_job, self.store, self.checkpoints = engine, main_job, store, checkpoints
        self.token = token
        self.accelerator, self.min_window_s = accelerator, min_window_s
        self.profile_steps, self.retry_steps = profile_steps, retry_steps
        self.recorder = BubbleRecorder(memory_budget_bytes=memory_budget_bytes)
        self.iterations: list[tuple[float, float]] = []
        self.agent: FillAgent | None = None
        instrument(engine, self.recorder)

    @contextmanager
    def iteration(self):
        """Around one `train_batch`: registers the stage when it is due, and times the iteration."""
        done = len(self.iterations)
        if self.agent is None and done >= self.profile_steps and (done - self.profile_steps) % self.retry_steps == 0:
            self.agent = self._register()
        started = time.monotonic()
        yield
        self.iterations.append((started, time.monotonic()))
        if self.agent is not None:
            self.agent.iteration(self.iterations[-1][1] - started)

    def _register(self) -> FillAgent | None:
        return serve_stage(
            self.store,
            self.checkpoints,
            self.main_job,
            self.engine.stage_id,
            self.recorder,
            self.iterations,
            self.accelerator,
            self.min_window_s,
            self.token,
        )

    @property
    def served(self) -> list[str]:
        """The fill jobs this stage ran, in order."""
        return self.agent.served if self.agent else []

    def close(self) -> None:
        """Training is over: every stage stops taking work before any hands its job back."""
        if self.agent is not None:
            self.agent.leaving()
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
        if self.agent is not None:
            self.agent.stop()


def attach(
    engine,
    main_job: str,
    *,
    redis_url: str,
    checkpoints: str,
    prefix: str = "broker:",
    accelerator: str = "H100",
    shards: int | None = None,
    token: str | None = None,
    **options,
) -> Bubbles:
    """Offer a DeepSpeed PipelineEngine's bubbles to the broker at `redis_url` (checkpoints: an fsspec URL); each
    stage's executor is an agent in the shard its id hashes to, of the broker's `shards` (BROKER_SHARDS; None: as
    the store is split). A broker with BROKER_AGENT_SECRET set admits the stages with a pool token for the main job
    (`broker agents token --pool MAIN_JOB`): `token`, else BROKER_AGENT_TOKEN."""
    store = ShardedStore(redis_url, prefix, shards)
    token = token or os.environ.get("BROKER_AGENT_TOKEN")
    return Bubbles(engine, main_job, store, CheckpointStore(checkpoints), accelerator, token=token, **options)
