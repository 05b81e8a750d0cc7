"""The simulated fleet of a backtest: agents that keep the live contract with the real store.

Each agent stands for one instance of a market offer and keeps the contract every agent keeps
(broker/agents/contract.py): it registers, takes its assignments from its own stream (acked after
the start), learns of fences and the deadline guard's moves from its views, resumes from the
checkpoint the server chose, runs the job at its true speed (the workload's truth: the money model's estimate
for the offer, off by the job's own factor, which no policy sees), writes real checkpoints
(to an in-memory fsspec store, verified by the server) at Young's interval, and reports started,
progress, checkpoint and exited with the simulated time of each. A run pays the restart time
(a new instance and the restore) before it progresses and the checkpoint write time each time it
saves. A spot instance taken back gives its cloud's notice first, and the agent checkpoints the job within the lead
when the write fits (agents/agent.py): the run loses the lead's work; otherwise (or in a market without `notices`)
the work since its last checkpoint. Where a pool shrinks, the instances that
go are drawn at random among the pool's agents, idle or busy: a trace says how many instances a pool held, not
which of them went, and an idle agent is an instance held like any other. A market marked `idle_first` takes the
idle ones first instead: the world the bounds assume, to measure what the random victims cost.
"""

from __future__ import annotations

import json
import random
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from broker.agents.checkpoints import CheckpointStore
from broker.agents.contract import Contract, Verdict
from broker.domain.model import JobSpec
from broker.domain.offer import Offer
from broker.models.risk import checkpoint_hours, exclusive_hours, notice_loss_h, restart_hours, young_interval_h
from broker.sim.market import Market
from broker.store.capacity import CapacityHistory
from broker.store.jobs import Store

PROGRESS_UNITS = 1_000_000  # a job's work in progress units (checkpoint steps)
LEASE_MS = 10**10  # a simulated agent is alive until the fleet removes it: its lease outlasts any backtest
EPS = 1e-9


@dataclass
class SimRun:
    """A job running on a simulated agent."""

    job: str
    fence: int
    offer: Offer
    spec: JobSpec
    rate: float  # progress units per productive hour
    done: float
    dead_h: float  # hours still to spend before progress resumes (restart, checkpoint writes)
    since_checkpoint_h: float
    interval_h: float | None


class SimFleet:
    """The agents of every offer in the market, provisioned to its capacity at each tick."""

    def __init__(
        self,
        store: Store,
        checkpoints: CheckpointStore,
        market: Market,
        bubbles: bool,
        speed: dict | None = None,
        seed: int = 0,
    ):
        self.store, self.checkpoints, self.market = store, checkpoints, market
        self.victims = random.Random(seed)  # which instances of a shrinking pool go
        self.speed = speed or {}  # job id -> its true speed over the money model's estimate (1 when not given)
        self.bubble_offers = market.bubbles if bubbles else []
        self.on_offer: dict[str, list[str]] = {}  # offer id -> its agents, oldest first
        self.offer_of: dict[str, Offer] = {}  # agent id -> offer
        self.contracts: dict[str, Contract] = {}  # agent id -> its side of the contract
        self.runs: dict[str, SimRun] = {}  # agent id -> the run it holds
        self._scratch = Path(tempfile.mkdtemp(prefix="broker-backtest-"))
        self._count = 0
        CapacityHistory(store).watch([s.offer for s in market.spot])  # a pool in every traced zone, from the start

    # -- capacity -------------------------------------------------------------------------

    def provision(self, tick: int, now: datetime, pending: int) -> None:
        """Spot agents to the traces' capacity (preempting runs where it shrank), on-demand agents for every
        pending job, one agent per bubble executor."""
        for series in self.market.spot:
            self._resize(series.offer, series.at(tick), now)
        for offer in self.market.on_demand:
            busy = sum(1 for a in self.on_offer.get(offer.id, []) if a in self.runs)
            self._resize(offer, max(len(self.on_offer.get(offer.id, [])), busy + pending), now)
        for offer in self.bubble_offers:
            self._resize(offer, 1, now)

    def _resize(self, offer: Offer, target: int, now: datetime) -> None:
        agents = self.on_offer.setdefault(offer.id, [])
        while len(agents) > target:
            idle = [a for a in agents if a not in self.runs] if self.market.idle_first else []
            among = idle or agents
            agent = among[self.victims.randrange(len(among))]
            if agent in self.runs:
                if self.market.notices:
                    self._on_notice(agent, self.runs[agent], now)
                self._end(agent, now, "preempted")
            agents.remove(agent)
            self.contracts.pop(agent).remove()
        while len(agents) < target:
            self._count += 1
            agent = f"sim-{self._count:06d}"
            self.contracts[agent] = Contract(self.store, agent)
            self.contracts[agent].register(offer, LEASE_MS, host="backtest", pid=0, at=now)
            agents.append(agent)
            self.offer_of[agent] = offer

    # -- the contract ---------------------------------------------------------------------

    def take(self, dispatched: list[tuple[str, str]], now: datetime) -> None:
        """Start the assignments the server just sent: read, resume from the checkpoint, report, ack."""
        for _job, agent in dispatched:
            job = self.contracts[agent].take(block_ms=None)
            if job is None:
                continue
            offer = self.offer_of[agent]
            exclusive_h = exclusive_hours(job.spec, offer) / self.speed.get(job.job, 1.0)
            self.runs[agent] = SimRun(
                job.job,
                job.fence,
                offer,
                job.spec,
                PROGRESS_UNITS / exclusive_h,
                self._resume(job.job, job.resume_from),
                restart_hours(job.spec),
                0.0,
                young_interval_h(checkpoint_hours(job.spec), offer.hazard_per_h, exclusive_h),
            )
            self.contracts[agent].started(job, at=now.timestamp())

    def _resume(self, job_id: str, url: str | None) -> float:
        """Progress saved in the checkpoint at `url` (0 without one), read from the store after verifying it."""
        if url is None:
            return 0.0
        manifest, _ = self.checkpoints.verified_at(job_id, url)
        if manifest is None:
            return 0.0
        with self.checkpoints.open_file(manifest, "state.json") as f:
            return float(json.load(f)["done"])

    def obey(self, now: datetime) -> int:
        """Act on the views of the running jobs, as live agents do between steps: hand back (checkpoint, end
        `moved`) the jobs the deadline guard moves, stop those fenced, checkpoint those it asks to (the write's
        time is paid before progress goes on); returns how many ended."""
        running = list(self.runs.items())
        views = self.store.ownerships([(agent, run.job) for agent, run in running])
        ended = 0
        for (agent, run), view in zip(running, views):
            verdict = self.contracts[agent].verdict_of(view, run.job, run.fence)
            if verdict == Verdict.checkpoint:
                self._checkpoint(agent, run, now)
                run.since_checkpoint_h, run.dead_h = 0.0, run.dead_h + checkpoint_hours(run.spec)
                continue
            if verdict == Verdict.moved:
                self._checkpoint(agent, run, now)
            if verdict != Verdict.run:
                self._end(agent, now, verdict.value)
                ended += 1
        return ended

    def advance(self, start: datetime, hours: float) -> None:
        """Run every job for `hours` from `start`: restart and checkpoint time first, then progress;
        a checkpoint each interval; report progress at the end, or the finish when it comes."""
        for agent, run in list(self.runs.items()):
            t = 0.0
            while t < hours - EPS:
                if run.dead_h > EPS:
                    used = min(run.dead_h, hours - t)
                    run.dead_h, t = run.dead_h - used, t + used
                    continue
                to_finish = (PROGRESS_UNITS - run.done) / run.rate
                to_checkpoint = run.interval_h - run.since_checkpoint_h if run.interval_h else float("inf")
                step = max(0.0, min(hours - t, to_finish, to_checkpoint))
                run.done, run.since_checkpoint_h, t = (
                    run.done + run.rate * step,
                    run.since_checkpoint_h + step,
                    t + step,
                )
                at = start + timedelta(hours=t)
                if run.done >= PROGRESS_UNITS - 1e-6:
                    self._progress(agent, run, at)
                    self._end(agent, at, "finished")
                    break
                if run.interval_h and run.since_checkpoint_h >= run.interval_h - EPS:
                    self._checkpoint(agent, run, at)
                    run.since_checkpoint_h, run.dead_h = 0.0, checkpoint_hours(run.spec)
            else:
                self._progress(agent, run, start + timedelta(hours=hours))

    def _on_notice(self, agent: str, run: SimRun, now: datetime) -> None:
        """The instance goes now: its agent had the cloud's notice a lead ago and checkpointed the job then, if the
        write fits in the lead (risk.notice_loss_h); the lead's work is lost, less when a checkpoint is newer."""
        lead_h = notice_loss_h(run.spec, run.offer)
        if lead_h is None or run.since_checkpoint_h <= lead_h:
            return
        run.done -= run.rate * lead_h
        self._checkpoint(agent, run, now)

    def _progress(self, agent: str, run: SimRun, at: datetime) -> None:
        done = min(run.done, PROGRESS_UNITS)
        self.contracts[agent].report(run.job, run.fence, "progress", at=at.timestamp(), done=done, total=PROGRESS_UNITS)

    def _checkpoint(self, agent: str, run: SimRun, at: datetime) -> None:
        (self._scratch / "state.json").write_text(json.dumps({"done": run.done}))
        manifest = self.checkpoints.publish(run.job, int(run.done), self._scratch)
        self.contracts[agent].report(
            run.job, run.fence, "checkpoint", at=at.timestamp(), url=manifest.url, step=int(run.done)
        )

    def _end(self, agent: str, at: datetime, reason: str) -> None:
        run = self.runs.pop(agent)
        code = 0 if reason == "finished" else None
        self.contracts[agent].exited(run.job, run.fence, reason, code=code, at=at.timestamp())

    def close(self) -> None:
        for path in self._scratch.iterdir():
            path.unlink()
        self._scratch.rmdir()
