"""The broker's own fleet as the market a quote meets: its agents are the capacity it can dispatch to, the other active
jobs ahead of a new one in the queue and those still to come hold slots in it (models/contention.py), and its
measured jobs say how far a speed estimate is off, for its kind of estimate and for a job run again
(`Fleet.speed_prior`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import NamedTuple

import numpy as np

from broker.domain.jobspec import JobSpec
from broker.domain.model import Job, Tier
from broker.domain.offer import Offer, offer_id, tier_of
from broker.models.contention import arrivals, launchable
from broker.models.risk import SPEED_PRIOR_SIGMA, window_hours
from broker.planning.option_table import measured_speed, work_left

SPEED_PRIOR_JOBS = 5  # the prior weighs as much as this many finished jobs' measured speeds
REPEAT_PRIOR_RUNS = 1  # a run again is as far off as any job (the whole spread) until as many repeats show otherwise
ARRIVALS_H = 24.0  # the recent submissions whose rate and kind say what will arrive
RUNNING = -math.inf  # a running job's place in the queue (Fleet.others): ahead of any new job, its slot its own


class SpeedPrior(NamedTuple):
    """A job's speed over the estimate before it is measured: the median, its log sd, and the earlier jobs of its
    name and the measured jobs of its kind of estimate it was learned from (Fleet.speed_prior)."""

    median: float
    sigma: float
    runs: int
    kind_runs: int = 0  # the measured jobs whose work was estimated the same way, which the median starts from


@dataclass(frozen=True)
class Fleet:
    """The broker's own capacity at quote time: live agents per offer id, and per other active job that may use
    spot or bubble capacity, where it holds a slot (the offer it runs on, or while it waits the ones it may use),
    the hours it has left there (_spot_hours) and its place in the queue (Job.urgency; RUNNING while it runs)."""

    agents: dict[str, int] = field(default_factory=dict)
    others: list[tuple[frozenset[str], float, float]] = field(default_factory=list)
    speed_sigma: float = SPEED_PRIOR_SIGMA  # spread (log) of the true speed over the estimate (speed_spread)
    arrivals_per_h: float = 0.0  # jobs submitted per hour lately
    # per job submitted lately that may use spot: the offer ids it may use, hours held, hours to its deadline
    arrived: list[tuple[frozenset[str], float, float]] = field(default_factory=list)
    # per job name, the log speeds over the estimate measured of its jobs, less their kind's bias (speed_prior)
    repeats: dict[str, list[float]] = field(default_factory=dict)
    # per kind of estimate (estimate_kind), how far off it runs: the log median speed over it, and the jobs measured
    bias: dict[str, tuple[float, int]] = field(default_factory=dict)
    # per kind of estimate, the spread of its measured jobs about that median (speed_spread of that kind alone): rates
    # a user measured may miss by 2% where a datasheet's ratio misses by 30%; a kind not yet measured: speed_sigma
    spread: dict[str, float] = field(default_factory=dict)
    # per spot offer id, the agents our fleet had there lately while it had any (pool_sizes): a zone's slots while up
    sizes: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(
        cls, agents: list, jobs: list[Job], now: datetime, recent: list[Job] = (), sizes: dict[str, float] | None = None
    ) -> Fleet:
        """From the live agents (AgentInfo), the active jobs and the newest ones (`recent`); a job pinned to or
        running on on-demand holds no spot slot. The estimate's error is learned from every job whose speed was
        measured (speed_spread), running or done: a run's rate counts after its first half hour of progress
        (option_table.measured_speed), so quotes learn it hours before the first jobs finish. The jobs to come are
        like those submitted in the last ARRIVALS_H hours: their rate (from the first of them to now) and kind.
        `sizes`: pool_sizes of our fleet's spot capacity lately."""
        count: dict[str, int] = {}
        for agent in agents:
            count[agent.offer.id] = count.get(agent.offer.id, 0) + 1
        others = [(_holds(job), work_left(job) * _spot_hours(job), _queued(job)) for job in jobs if _on_spot(job)]
        seen = {job.id: job for job in [*recent, *jobs]}  # a job both recent and active counts once
        measured = [
            (job.spec.name, estimate_kind(job.spec), math.log(v))
            for job in seen.values()
            if (v := measured_speed(job)) is not None
        ]
        kinds: dict[str, list[float]] = {}
        for _, kind, x in measured:
            kinds.setdefault(kind, []).append(x)
        # each kind's log median, shrunk toward the estimate as if SPEED_PRIOR_JOBS more jobs had run at it
        bias = {kind: (sum(x) / (SPEED_PRIOR_JOBS + len(x)), len(x)) for kind, x in kinds.items()}
        repeats: dict[str, list[float]] = {}
        for name, kind, x in measured:
            repeats.setdefault(name, []).append(x - bias[kind][0])
        lately = [j for j in recent if j.submitted_at >= now - timedelta(hours=ARRIVALS_H)]
        span_h = (now - min((j.submitted_at for j in lately), default=now)).total_seconds() / 3600
        rate = (len(lately) - 1) / span_h if len(lately) >= 2 and span_h > 0 else 0.0
        arrived = [
            (_zones(j), _spot_hours(j), window_hours(j.spec, j.submitted_at))
            for j in lately
            if j.quote.chosen.offer.tier != Tier.on_demand
        ]
        spread = {kind: speed_spread({kind: x}) for kind, x in kinds.items()}
        return cls(count, others, speed_spread(kinds), rate, arrived, repeats, bias, spread, sizes or {})

    def speed_prior(self, spec: JobSpec) -> SpeedPrior:
        """A new job's speed over the estimate before it is measured. Estimates made the same way (estimate_kind) may
        all be off alike (a datasheet's ratio that this code or these GPUs do not reach): the median starts from what
        the measured jobs of its kind ran at, shrunk toward the estimate as if SPEED_PRIOR_JOBS more had run at it.
        Jobs of the same name that ran before (a nightly inference, an evaluation run again) tell more, as far as the
        fleet shows that repeats hold: a random-effects model, each job's log speed its kind's, plus its name's, plus a
        part of its own. The whole spread is its kind's (`spread`; the fleet's, speed_sigma, for a kind not yet
        measured). The own part's variance is pooled over the names measured more than once, with speed_sigma as its
        prior, REPEAT_PRIOR_RUNS strong; the names' share is the rest. With no repeats seen the job's own part is the
        whole spread, and its name's earlier jobs tell nothing: its kind's median at its kind's spread, as for any
        job of its kind."""
        kind = estimate_kind(spec)
        base, kind_runs = self.bias.get(kind, (0.0, 0))
        sigma = self.spread.get(kind, self.speed_sigma)
        total, own = sigma**2, self._own_variance
        logs = self.repeats.get(spec.name, [])
        if not logs or own <= 0 or total - own <= 0:
            return SpeedPrior(math.exp(base), sigma, 0, kind_runs)
        precision = 1 / (total - own) + len(logs) / own
        return SpeedPrior(
            math.exp(base + sum(logs) / own / precision), math.sqrt(1 / precision + own), len(logs), kind_runs
        )

    @cached_property
    def _own_variance(self) -> float:
        """The run-to-run part of a job's log speed (speed_prior), pooled once per fleet over the names measured more
        than once: a quote asks for it several times, and most names ran once."""
        total = self.speed_sigma**2
        again = [v for v in self.repeats.values() if len(v) > 1]
        within = sum(sum((x - sum(v) / len(v)) ** 2 for x in v) for v in again)
        df = sum(len(v) - 1 for v in again)
        return min(total, (REPEAT_PRIOR_RUNS * total + within) / (REPEAT_PRIOR_RUNS + df))

    def slots(self, zones: list[Offer]) -> np.ndarray | None:
        """Slots per zone while up: its agents now, or as many as it had lately while it had any where that is more
        (a pool shrunk at quote time fills again when capacity comes back: the count now held for the whole future
        once made a zone down to 1 of its 16 instances full for every job quoted then), or for a zone with neither the
        most any of them has; None when the fleet has no agent in any of them (nothing known: capacity is not the
        limit)."""
        now = np.asarray([max(self.agents.get(o.id, 0), self.sizes.get(o.id, 0)) for o in zones])
        if now.sum() == 0:
            return None
        return np.where(now > 0, now, now.max())

    def arriving(self, zones: list[Offer], tick_h: float, ticks: int, futures: int, rng, window_h: float):
        """Slots held per future and tick in `zones`, ahead of a job due in `window_h`, by jobs still to arrive: at
        the rate jobs came lately, like those of them that may use one of the zones (models/contention.arrivals);
        None when none is expected."""
        ids = {o.id for o in zones}
        like = [(held, due) for offers, held, due in self.arrived if offers & ids]
        if not like or self.arrivals_per_h <= 0:
            return None
        held, due = (np.asarray(x, dtype=float) for x in zip(*like))
        per_tick = self.arrivals_per_h * tick_h * len(like) / len(self.arrived)
        hold_ticks = np.maximum(1, np.ceil(held / tick_h)).astype(int)
        return arrivals(rng, futures, ticks, per_tick, hold_ticks, due / tick_h, window_h / tick_h)

    def free(
        self, zones: list[Offer], available: np.ndarray, tick_h: float, rng, window_h: float, urgency: float = math.inf
    ) -> np.ndarray:
        """Where a slot is free for the job (zones x futures x ticks) once the other jobs ahead of it (running, or
        waiting before it in the queue: `urgency`, its Job.urgency) and those to come take theirs, each tier apart: a
        job that runs only on spot holds no bubble (contention.launchable fills the cheapest zones first, and bubbles
        are free)."""
        free = available.copy()
        _, futures, ticks = available.shape
        for tier in sorted({o.tier for o in zones}):
            rows = [i for i, o in enumerate(zones) if o.tier == tier]
            group = [zones[i] for i in rows]
            slots = self.slots(group)
            if slots is not None:
                coming = self.arriving(group, tick_h, ticks, futures, rng, window_h)
                pinned, pooled = self.held(group, tick_h, ticks, pin=tier == Tier.bubble, before=urgency)
                free[rows] = launchable(available[rows], slots, pooled, coming, pinned)
        return free

    def held(
        self, zones: list[Offer], tick_h: float, ticks: int, pin: bool, before: float = math.inf
    ) -> tuple[np.ndarray, np.ndarray]:
        """The slots other jobs hold in `zones`: per zone and tick those of the jobs running there, and with `pin`
        (bubbles: no market takes them back) of those waiting for one of them alone; and the ticks each other waiting
        job holds one of them (at least one), the cheapest free. A run holds its slot where it runs: pooled, a
        job running in a dear zone took the cheap zone's slot in the futures (a backtest's fill quoted $3.09, on
        spot in 99.6% of its futures, ran in the cheap zone at once for $1.22). A job waiting behind `before` (an
        urgency: the queue goes by it, store/jobs.py) holds none ahead of it."""
        ids = [o.id for o in zones]
        pinned, pooled, known = np.zeros((len(zones), ticks)), [], set(ids)
        for offers, hours, queued in self.others:
            if not offers & known or queued > before:
                continue
            held = max(1, math.ceil(hours / tick_h))
            if (pin or queued == RUNNING) and len(offers) == 1:
                pinned[ids.index(next(iter(offers))), :held] += 1
            else:
                pooled.append(held)
        return pinned, np.asarray(pooled, dtype=int)


def pool_sizes(counts: dict[tuple[str, str, str], np.ndarray]) -> dict[str, float]:
    """Per spot offer id, the agents our fleet had in its zone on average over the ticks it had any (`counts`: per
    (cloud, zone, instance type) the least each tick, store/capacity.fleet_seen read as the market model reads it),
    rounded; a zone it never had one in is left out."""
    return {
        offer_id(cloud, zone, kind, Tier.spot): float(max(1, round(float(seen[seen > 0].mean()))))
        for (cloud, zone, kind), seen in counts.items()
        if (np.asarray(seen) > 0).any()
    }


def estimate_kind(spec: JobSpec) -> str:
    """How the job's work was estimated, whose error the fleet learns apart (Fleet.speed_prior): a transformer's
    layout model, rates the user measured (`work.steps_per_hour`), or GPU-hours at a datasheet's ratio, per kind of
    work."""
    if spec.transformer is not None:
        return "transformer layout"
    return "measured rates" if spec.work.steps is not None else f"gpu-hours ({spec.work.kind})"


def speed_spread(kinds: dict[str, list[float]]) -> float:
    """The log sd of true speed over the estimate, about each kind of estimate's own median (`kinds`: the measured
    log speeds per estimate_kind): the prior, pooled with the measured speeds' own spread as jobs finish (its weight
    SPEED_PRIOR_JOBS against n - 1 for n measured of one kind). A quote made before any job finished is as unsure
    of the speed as an untested performance model is; one made after many says what they showed."""
    squares = sum(float(np.sum((np.asarray(x) - np.mean(x)) ** 2)) for x in kinds.values())
    weight = sum(len(x) - 1 for x in kinds.values())
    return math.sqrt((SPEED_PRIOR_JOBS * SPEED_PRIOR_SIGMA**2 + squares) / (SPEED_PRIOR_JOBS + weight))


def _on_spot(job: Job) -> bool:
    """Whether an active job may hold a spot or bubble slot (not pinned to or running on on-demand)."""
    run = job.current_run
    return not (job.state.terminal or job.pinned_tier == Tier.on_demand or (run and run.offer.tier == Tier.on_demand))


def _zones(job: Job) -> frozenset[str]:
    """The offers a job may run in: its forecast's zones of its chosen tier where it has some (a fill job waiting for a
    bubble is on spot only when none frees up: 51 h on spot against 2,955 h in bubbles in the 12 backtests of
    bench/results/forecast.md), else all of them (or its chosen offer), and where it runs now."""
    zones = job.quote.forecast.zones if job.quote.forecast else [job.quote.chosen.offer.id]
    offers = {z for z in zones if tier_of(z) == job.quote.chosen.offer.tier} or set(zones)
    if job.current_run is not None:
        offers.add(job.current_run.offer.id)
    return frozenset(offers)


def _spot_hours(job: Job) -> float:
    """The hours a job's quote expects it to hold a slot: its wall time's share on spot or bubbles in its futures
    (the rest on on-demand, where it holds none)."""
    share = job.quote.forecast.spot_share if job.quote.forecast else 1.0
    return job.quote.chosen.expected_wall_h * share


def _queued(job: Job) -> float:
    """A job's place in the queue (Job.urgency) while it waits; RUNNING while it runs."""
    return RUNNING if job.current_run is not None else job.urgency


def _holds(job: Job) -> frozenset[str]:
    """Where a job holds a slot: the offer it runs on; while it waits, any of those it may launch in."""
    return frozenset({job.current_run.offer.id}) if job.current_run is not None else _zones(job)
