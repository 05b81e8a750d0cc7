"""The option table: every job priced on every offer it fits, in numpy columns.

Planning 10,000 jobs against 2,000 offers means pricing millions of (job, offer) pairs; one
Python call per pair takes minutes, so pairs are built per accelerator shape and priced with
the array form of the money model (`risk.expectation`). Each row is one pair; the planner
picks among the feasible rows. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from broker.domain.model import Job, JobSpec, Run, Tier
from broker.domain.offer import Offer
from broker.domain.plan import Unplaced
from broker.models import placement, risk
from broker.models.fit import allowed_tiers
from broker.models.launch_waits import waits_h

TIERS = list(Tier)


@dataclass
class PlanItem:
    """A job as the planner sees it: its spec, the share of work left, and where it runs now."""

    id: str
    spec: JobSpec
    remaining: float = 1.0
    current: str | None = None  # offer id of the run under way, if any
    spent_usd: float = 0.0
    submitted_at: datetime | None = None
    preempted_in: str | None = None  # region of its last run when that run was preempted or lost
    on_demand_h: float | None = None  # its whole work on the on-demand offer it was quoted against, at `speed`
    # its measured speed over the money model's estimate (measured_speed; before, its quote's speed_median: 1, or
    # as the earlier jobs of its name ran): a job slower than estimated
    # needs more time on on-demand too, which the deadline guard must know before it is too late
    speed: float = 1.0
    idle_since: datetime | None = None  # without a run: since its last run ended (or it was submitted)
    # the share of its work left the safety net keeps in reserve while its speed is not measured
    # (risk.unmeasured_margin at the spread its quote was sampled with; Progress.unsure_h): a job slower than
    # estimated finds out only once it has run
    unsure: float = 0.0
    # its quote found the deadline's odds hold with the speed measured on spot (Progress.measures_on_spot)
    measures_on_spot: bool = False
    # the log sd of its speed over `speed` while not measured (0 once it is): the spread spot_in_time prices its
    # work on spot over, where a slower speed would fall back to on-demand
    speed_sigma: float = 0.0
    # the time until the deadline guard looks at a job placed now (the server's time between its passes): what a
    # start on spot may lose to a preemption before the guard can move it, so the safety net keeps it (Progress.pass_h)
    pass_h: float = 0.0

    @classmethod
    def from_job(cls, job: Job) -> PlanItem:
        """The planner's view of a stored job: the share of work left, its speed so far, where it runs."""
        remaining = work_left(job)
        run = job.current_run
        spec = job.spec.model_copy(update={"tiers": [job.pinned_tier]}) if job.pinned_tier else job.spec
        if job.unfit_zones:  # never back to a bubble its steps do not fit
            resources = spec.resources.model_copy(update={"exclude": [*spec.resources.exclude, *job.unfit_zones]})
            spec = spec.model_copy(update={"resources": resources})
        last = job.runs[-1] if job.runs else None
        preempted_in = last.offer.region if last and last.end_reason in ("preempted", "lost") else None
        baseline = job.quote.on_demand_baseline
        measured, forecast = measured_speed(job), job.quote.forecast
        speed = measured if measured is not None else forecast.speed_median if forecast else 1.0
        sigma = (forecast.speed_sigma if forecast else None) or risk.SPEED_PRIOR_SIGMA
        unsure = 0.0 if measured is not None else risk.unmeasured_margin(sigma, job.spec.deadline_probability)
        return cls(
            job.id,
            spec,
            remaining,
            run.offer.id if run else None,
            job.cost_usd,
            job.submitted_at,
            preempted_in,
            baseline.exclusive_h / speed if baseline else None,
            speed,
            None if run else last.ended_at if last and last.ended_at else job.submitted_at,
            unsure,
            measures_on_spot=job.quote.measures_on_spot,
            speed_sigma=0.0 if measured is not None else sigma,
        )


def work_left(job: Job) -> float:
    """The share of the job's work still to do: from its newest progress report while a run is under way, else
    from the last checkpoint (work since then is lost): the ended run's own, or the one it resumed from when it wrote
    none (preempted before its first: the next run resumes there too, not from the start)."""
    for run in reversed(job.runs):
        if run.progress_total:
            if run.ended_at is None:
                done = run.progress_done
            else:
                done = run.checkpoint_step if run.checkpoint_step is not None else _resumed_at(job, run)
            return min(1.0, max(0.0, 1 - done / run.progress_total))
    return 1.0


def work_unsaved(job: Job) -> float:
    """The share of the job's work its run under way did since its newest checkpoint (or since it resumed): what
    a preemption now would lose. 0 without a run under way that reports progress."""
    run = job.current_run
    if run is None or not run.progress_total:
        return 0.0
    saved = run.checkpoint_step if run.checkpoint_step is not None else _resumed_at(job, run)
    return min(1.0, max(0.0, (run.progress_done - saved) / run.progress_total))


def _resumed_at(job: Job, run: Run) -> float:
    """The step a run resumed from: its checkpoint's (written by an earlier run); 0 from the start."""
    if run.resume_from is None:
        return 0.0
    return next((r.checkpoint_step or 0 for r in job.runs if r.checkpoint_url == run.resume_from), 0)


MIN_MEASURED_H = 0.5  # productive hours the runs need before their rate says more than noise
POOLED_H = 4.0  # the newest runs' productive hours the rate is measured over
SPEED_BOUNDS = (0.25, 4.0)


def measured_speed(job: Job) -> float | None:
    """The job's speed over the estimate from its newest runs, pooled whole until they hold POOLED_H productive hours
    (fewer when the job has run less; None under MIN_MEASURED_H): the share of work they did per productive hour (after
    the restart, less checkpoint writes: the periodic ones the estimate expects, or those the guard asked for when
    more, since each restarts the interval) against the share the estimate says. Pooled, a write or a short run moves
    it little: one run's first half hour read a long job's speed a few percent off, hours of its deadline."""
    share = expected = wall = 0.0
    checkpoint_h, restart_h = risk.checkpoint_hours(job.spec), risk.restart_hours(job.spec)
    for run in reversed(job.runs):
        if not run.progress_total or run.started_at is None or run.last_progress_at is None:
            continue
        wall_h = (run.last_progress_at - run.started_at).total_seconds() / 3600 - restart_h
        exclusive_h = risk.exclusive_hours(job.spec, run.offer)
        interval = risk.young_interval_h(checkpoint_h, run.offer.hazard_per_h, exclusive_h)
        periodic = wall_h / (interval + checkpoint_h) if interval else 0.0
        # a write the guard asks for restarts the interval: asked every pass near the net, none periodic come
        productive_h = wall_h - checkpoint_h * max(run.checkpoints_asked, periodic)
        if productive_h <= 0:
            continue
        share += (run.progress_done - _resumed_at(job, run)) / run.progress_total
        expected += productive_h / exclusive_h
        wall += productive_h
        if wall >= POOLED_H:
            break
    if wall < MIN_MEASURED_H or share <= 0:
        return None
    return min(max(share / expected, SPEED_BOUNDS[0]), SPEED_BOUNDS[1])


@dataclass
class OptionTable:
    """One row per fitting (job, offer) pair; `fallback` is the on-demand offer index kept in reserve, or -1."""

    job: np.ndarray
    offer: np.ndarray
    cost: np.ndarray
    wall_h: np.ndarray
    p_meet: np.ndarray
    feasible: np.ndarray
    fallback: np.ndarray
    current: np.ndarray  # per job: offer index of its run under way, or -1
    unfit: dict[int, Unplaced] = field(default_factory=dict)  # job index -> why no row is feasible

    def __len__(self) -> int:
        return len(self.job)


def _offer_columns(offers: list[Offer]) -> dict[str, np.ndarray]:
    return {
        "price": np.array([o.price_usd_per_h for o in offers], dtype=float),
        "hazard": np.array([o.hazard_per_h for o in offers], dtype=float),
        "tier": np.array([TIERS.index(o.tier) for o in offers], dtype=np.int8),
        "gpu_mem": np.array([o.gpu_memory_gb for o in offers], dtype=float),
        "vcpus": np.array([o.vcpus or 0 for o in offers], dtype=float),
        "mem": np.array([o.memory_gb or 0 for o in offers], dtype=float),
        "speed": np.array([o.speed_factor for o in offers], dtype=float),
        "availability": np.array([o.availability for o in offers], dtype=float),
        "waits": np.array([waits_h(o) for o in offers], dtype=float).reshape(len(offers), 2),
        "notice": np.array([risk.notice_window_h(o) for o in offers], dtype=float).reshape(len(offers), 2),
    }


def _job_columns(items: list[PlanItem], now: datetime, offer_index: dict[str, int]) -> dict[str, np.ndarray]:
    specs = [i.spec for i in items]
    allowed = np.zeros((len(items), len(TIERS)), dtype=bool)
    for row, spec in enumerate(specs):
        allowed[row, [TIERS.index(t) for t in allowed_tiers(spec)]] = True
    return {
        "allowed": allowed,
        "gpu_mem": np.array([s.resources.gpu_memory_gb or 0 for s in specs], dtype=float),
        "cpus": np.array([s.resources.cpus or 0 for s in specs], dtype=float),
        "mem": np.array([s.resources.memory_gb or 0 for s in specs], dtype=float),
        "delta": np.array([risk.checkpoint_hours(s) for s in specs]),
        "restart": np.array([risk.restart_hours(s) for s in specs]),
        "window": np.array([risk.window_hours(s, now) for s in specs]),
        "target": np.array([s.deadline_probability if s.deadline else 0.0 for s in specs]),
        "budget": np.array(
            [(s.budget_usd if s.budget_usd is not None else math.inf) - i.spent_usd for s, i in zip(specs, items)]
        ),
        "remaining": np.array([i.remaining for i in items], dtype=float),
        "current": np.array([offer_index.get(i.current, -1) if i.current else -1 for i in items], dtype=np.int64),
    }


def _pairs(items: list[PlanItem], offers: list[Offer]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(job, offer, exclusive hours) for every pair whose accelerator shape matches, before tier and memory checks."""
    groups: dict[tuple[str, int], list[int]] = {}
    for index, offer in enumerate(offers):
        groups.setdefault((offer.accelerator, offer.accelerator_count), []).append(index)
    wanted: dict[tuple[str, int], tuple[list[int], list[float]]] = {}
    for row, item in enumerate(items):
        for a in item.spec.resources.accelerators:
            if (a.name, a.count) in groups:
                jobs, hours = wanted.setdefault((a.name, a.count), ([], []))
                jobs.append(row)
                hours.append(risk.exclusive_hours_on(item.spec, a.name, a.count))
    parts = []
    for shape, (jobs, hours) in wanted.items():
        on = np.array(groups[shape])
        parts.append((np.repeat(jobs, len(on)), np.tile(on, len(jobs)), np.repeat(hours, len(on))))
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    return tuple(np.concatenate(column) for column in zip(*parts))


def _placement(items: list[PlanItem], offers: list[Offer], job: np.ndarray, offer: np.ndarray):
    """Per pair: whether the offer is where the job may run, and what moving its input there costs. Only jobs
    that name a place or their data's are looked at one pair at a time."""
    here, moving = np.ones(len(job), dtype=bool), np.zeros(len(job))
    placed_jobs = [i for i, item in enumerate(items) if _has_placement(item.spec)]
    if placed_jobs:
        for row in np.flatnonzero(np.isin(job, placed_jobs)):
            spec, o = items[job[row]].spec, offers[offer[row]]
            here[row], moving[row] = placement.placed(spec, o), placement.transfer_usd(spec, o)
    return here, moving


def _has_placement(spec) -> bool:
    r = spec.resources
    return bool(r.cloud or r.region or r.zone or r.exclude or spec.data)


def option_table(items: list[PlanItem], offers: list[Offer], now: datetime) -> OptionTable:
    """Price every job on every offer it fits; infeasible rows stay, marked, so reasons can be given."""
    o = _offer_columns(offers)
    j = _job_columns(items, now, {offer.id: index for index, offer in enumerate(offers)})
    job, offer, hours = _pairs(items, offers)
    here, moving_data = _placement(items, offers, job, offer)
    job, offer, hours, moving_data = job[here], offer[here], hours[here], moving_data[here]
    shaped = np.bincount(job, minlength=len(items)) > 0
    keep = j["allowed"][job, o["tier"][offer]]
    tiered = np.bincount(job[keep], minlength=len(items)) > 0
    keep &= (
        (j["gpu_mem"][job] <= o["gpu_mem"][offer])
        & (j["cpus"][job] <= o["vcpus"][offer])
        & (j["mem"][job] <= o["mem"][offer])
    )
    keep &= np.isfinite(hours)  # a transformer job whose every layout overflows these GPUs
    job, offer, hours, moving_data = job[keep], offer[keep], hours[keep], moving_data[keep]

    t = hours * j["remaining"][job] / o["speed"][offer]
    restart, window = j["restart"][job], j["window"][job]
    notice_h = risk.notice_loss(j["delta"][job], o["notice"][offer, 0], o["notice"][offer, 1])
    e = risk.expectation(
        t,
        j["delta"][job],
        restart,
        o["hazard"][offer],
        o["price"][offer],
        window,
        o["availability"][offer],
        notice_h,
        o["waits"][offer, 0],
        o["waits"][offer, 1],
    )
    staying = j["current"][job] == offer  # its input is there already
    cost, wall, p_meet = e.cost_usd + np.where(staying, 0.0, moving_data), e.wall_h.copy(), e.p_meet.copy()
    moving = (j["current"][job] >= 0) & (j["current"][job] != offer)
    cost += np.where(moving, o["price"][offer] * restart, 0.0)  # a migration pays a restart on the new offer

    fallback = np.full(len(job), -1, dtype=np.int64)
    target = j["target"][job]
    on_demand = (o["tier"][offer] == TIERS.index(Tier.on_demand)) & (p_meet >= target)
    best = _cheapest_per_job(job[on_demand], cost[on_demand], len(items))  # row into the on_demand subset
    has_reserve = best >= 0
    reserve_rows = np.r_[np.flatnonzero(on_demand), -1][np.where(has_reserve, best, -1)]
    late = ~on_demand & (p_meet < target) & has_reserve[job] & (o["tier"][offer] != TIERS.index(Tier.on_demand))
    if late.any():
        r = reserve_rows[job[late]]
        spot = risk.Expectation(*(np.asarray(x)[late] for x in e))
        fb = risk.fallback_expectation(
            spot, o["price"][offer[late]], t[late], cost[r], t[r], restart[late], window[late]
        )
        cost[late], wall[late], p_meet[late], fallback[late] = fb.cost_usd, fb.wall_h, fb.p_meet, offer[r]

    on_time = p_meet >= target
    feasible = on_time & (cost <= j["budget"][job]) | (j["current"][job] == offer)  # staying put is always allowed
    unfit = _reasons(len(items), job, shaped, tiered, on_time, feasible)
    return OptionTable(job, offer, cost, wall, p_meet, feasible, fallback, j["current"], unfit)


def smallest_per_job(job: np.ndarray, key: np.ndarray, per_job: int = 1) -> np.ndarray:
    """Positions of the `per_job` entries with the smallest key for each job (ties: first)."""
    if len(job) == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((key, job))
    jobs = job[order]
    starts = np.r_[0, np.flatnonzero(jobs[1:] != jobs[:-1]) + 1]
    rank = np.arange(len(jobs)) - np.repeat(starts, np.diff(np.r_[starts, len(jobs)]))
    return order[rank < per_job]


def _cheapest_per_job(job: np.ndarray, cost: np.ndarray, n_jobs: int) -> np.ndarray:
    """For each job, the index (into these arrays) of its cheapest row, or -1."""
    best = np.full(n_jobs, -1, dtype=np.int64)
    first = smallest_per_job(job, cost)
    best[job[first]] = first
    return best


def _reasons(n_jobs: int, job, shaped, tiered, on_time, feasible) -> dict[int, Unplaced]:
    fitting = np.bincount(job, minlength=n_jobs) > 0
    timely = np.bincount(job[on_time], minlength=n_jobs) > 0
    ok = np.bincount(job[feasible], minlength=n_jobs) > 0
    reasons = {}
    for row in np.flatnonzero(~ok):
        if not shaped[row] or not tiered[row]:
            reasons[int(row)] = Unplaced.resources
        elif not fitting[row]:
            reasons[int(row)] = Unplaced.memory
        else:
            reasons[int(row)] = Unplaced.budget if timely[row] else Unplaced.deadline
    return reasons
