"""Expected time and cost of a job on an offer under preemption, and its odds of meeting the deadline.

The model (DESIGN.md, "The money model"): exclusive time t from the job's work and the
offer's speed; checkpoint cost delta, restart cost R, hazard lambda; Young's interval
tau = sqrt(2 delta / lambda). Expected wall time is t (1 + delta/tau)(1 + lambda (R + tau/2))
plus the first start-up. The number of preemptions is Poisson with mean lambda t (1 + delta/tau),
each costing R + tau/2, which gives P(finish by the deadline). Where the cloud's notice leaves the
job time to checkpoint (agents/agent.py), a preemption loses the notice's lead instead of tau/2.

`expectation` is the one implementation of those formulas: it takes numpy arrays (the planner
prices millions of job x offer pairs at once) or plain numbers (a quote). Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from statistics import NormalDist
from typing import NamedTuple

import numpy as np
from scipy.special import gammaincc

from broker.domain.accelerators import ACCELERATORS
from broker.domain.model import JobSpec, Option, Tier
from broker.domain.offer import NOTICE_LEAD_S, Offer, notice_grace_s
from broker.models.launch_waits import waits_h
from broker.models.placement import transfer_usd

# Sustained checkpoint upload to object storage (a single stream to S3/GCS/Blob typically
# sustains 100-500 MB/s); 250 MB/s is the planning figure.
CHECKPOINT_WRITE_GB_PER_S = 0.25
# Launching an instance and starting the job on it (image boot, setup, process start).
STARTUP_H = 5 / 60
# After a preemption: a replacement instance, plus the job's own restore time from its spec.
RESTART_OVERHEAD_H = 5 / 60
# log sd of a speed estimate nothing has checked yet: AMP's latency model error, 23% (Pipette; papers.md)
SPEED_PRIOR_SIGMA = 0.23
# the speeds a job's work on spot is priced at while its speed is not measured: the quantile midpoints of the
# estimate's log-normal error, in sds (spot_work_usd)
SPEED_POINTS = np.array([NormalDist().inv_cdf((i + 0.5) / 7) for i in range(7)])


class Expectation(NamedTuple):
    """The money model's outputs; each field is a number or an array of the inputs' shape."""

    interval_h: object  # Young's checkpoint interval (NaN without hazard)
    running_h: object  # exclusive time plus checkpoint writes
    wall_h: object  # expected wall time, start-up and preemptions included
    cost_usd: object
    p_meet: object  # P(finish within window_h)


def exclusive_hours_on(spec: JobSpec, accelerator: str, count: int) -> float:
    """Hours the job needs on `count` x `accelerator` when never interrupted."""
    work = spec.work
    if spec.transformer is not None:
        from broker.models.parallel import exclusive_hours as laid_out  # the layout search prices model jobs

        return laid_out(spec, accelerator, count)
    if work.steps is not None:
        return work.steps / work.steps_per_hour[accelerator]
    return work.gpu_hours / (count * ACCELERATORS[accelerator].speed(work.kind))


def exclusive_hours(spec: JobSpec, offer: Offer) -> float:
    """Hours the job needs on the offer when never interrupted."""
    return exclusive_hours_on(spec, offer.accelerator, offer.accelerator_count) / offer.speed_factor


def as_fast(spec: JobSpec, offer: Offer, than: Offer) -> bool:
    """Whether the job runs at least as fast on `offer` as on `than`: a move there keeps the pace its deadline was
    planned at, and a cheaper hour there is cheaper work (on slower GPUs a cheaper hour may be dearer work and a
    missed deadline)."""
    return exclusive_hours(spec, offer) <= exclusive_hours(spec, than) * (1 + 1e-6)


def checkpoint_hours(spec: JobSpec) -> float:
    """Time to write one checkpoint of the job."""
    return spec.checkpoint.size_gb / CHECKPOINT_WRITE_GB_PER_S / 3600


def restart_hours(spec: JobSpec) -> float:
    """Time lost to a restart besides the lost work: a new instance and the restore."""
    return RESTART_OVERHEAD_H + spec.checkpoint.restore_minutes / 60


def changeover_hours(spec: JobSpec) -> float:
    """A changeover as the deadline guard counts it in its margins: the restart and the instance's start-up."""
    return restart_hours(spec) + STARTUP_H


def unmeasured_margin(speed_sigma: float, probability: float) -> float:
    """The share of its estimated work a job whose speed is not yet measured keeps in reserve: what it needs more
    should its speed be at the (1 - `probability`) quantile of the estimate's log-normal error (log sd
    `speed_sigma`). 23% off (the prior) at 0.95: 46% more; 15% off: 28%."""
    return math.exp(NormalDist().inv_cdf(probability) * speed_sigma) - 1.0


def window_hours(spec: JobSpec, now: datetime) -> float:
    """Hours from now to the job's deadline (infinite without one)."""
    return math.inf if spec.deadline is None else (spec.deadline - now).total_seconds() / 3600


def young_interval_h(checkpoint_h: float, hazard_per_h: float, exclusive_h: float) -> float | None:
    """Young's checkpoint interval sqrt(2 delta / lambda), capped at the job's length; None without hazard."""
    tau = expectation(exclusive_h, checkpoint_h, 0.0, hazard_per_h, 0.0, math.inf).interval_h
    return None if math.isnan(tau) else float(tau)


def notice_window_h(offer: Offer) -> tuple[float, float]:
    """(lead, grace) in hours of the notice a preemption of the offer comes with (domain NOTICE_LEAD_S): the time
    from the notice to the instance's end, and how much of it a checkpoint may take; NaN for both where none comes
    (on-demand is not preempted, a bubble ends with its main job's need)."""
    lead_s = NOTICE_LEAD_S.get(offer.cloud, math.nan) if offer.tier == Tier.spot else math.nan
    return lead_s / 3600, notice_grace_s(lead_s) / 3600 if math.isfinite(lead_s) else math.nan


def notice_loss(delta_h, lead_h, grace_h):
    """The work a preemption loses when the job checkpoints on the cloud's notice (agents/agent.py `_leave`): the
    notice's lead, in which the job writes its checkpoint (`delta_h`) and stops, where the write fits in the lead's
    grace; NaN where it does not or no notice comes (`notice_window_h`'s NaN): the work since the newest periodic
    checkpoint is lost then. Numbers or arrays (the option table's pairs)."""
    with np.errstate(invalid="ignore"):
        return np.where(np.asarray(delta_h, dtype=float) <= grace_h, lead_h, np.nan)


def _notice_h(spec: JobSpec, offer: Offer) -> float:
    """`notice_loss` for the job on the offer, as `expectation` takes it (NaN: none)."""
    return float(notice_loss(checkpoint_hours(spec), *notice_window_h(offer)))


def notice_loss_h(spec: JobSpec, offer: Offer) -> float | None:
    """`notice_loss` for the job on the offer; None where no notice checkpoint comes."""
    lost = _notice_h(spec, offer)
    return None if math.isnan(lost) else lost


def lost_per_preemption_h(interval_h: float | None, notice_h: float | None = None) -> float:
    """The work a preemption loses on average: half a checkpoint interval (it strikes anywhere between two
    checkpoints), or the notice's lead where the job checkpoints on the notice (`notice_loss_h`), whichever is
    less; none where nothing is expected to preempt (no interval)."""
    lost = interval_h / 2 if interval_h else 0.0
    return lost if notice_h is None else min(lost, notice_h)


def poisson_cdf(k, mean):
    """P(N <= k) for N ~ Poisson(mean); k and mean may be arrays (k < 0 gives 0)."""
    k, mean = np.asarray(k, dtype=float), np.asarray(mean, dtype=float)
    with np.errstate(invalid="ignore"):
        p = np.where(k < 0, 0.0, np.where(mean <= 0, 1.0, gammaincc(np.maximum(k, 0) + 1, np.maximum(mean, 1e-300))))
    return p.item() if p.ndim == 0 else p


def expectation(
    t,
    delta,
    restart,
    hazard,
    price,
    window_h,
    availability=1.0,
    notice_h=math.nan,
    start_wait_h=math.nan,
    restart_wait_h=math.nan,
) -> Expectation:
    """The money model for exclusive hours t, checkpoint hours delta, restart hours R, hazard per hour,
    price per hour and hours until the deadline (inf for none). Arrays broadcast; numbers give numbers.
    A preemption loses tau/2 of work, or `notice_h` where the job checkpoints on the cloud's notice
    (`notice_loss_h`; NaN: no such checkpoint), whichever is less.

    A start waits `start_wait_h` for spot capacity and each restart after a preemption `restart_wait_h`
    (launch_waits.waits_h): unbilled, but they spend the window. Where those are not known (NaN), spot `availability`
    a < 1 makes each launch succeed with probability a: a start and every restart take 1/a paid launch attempts."""
    given = (t, delta, restart, hazard, price, window_h, availability, notice_h, start_wait_h, restart_wait_h)
    t, delta, restart, hazard, price, window_h, availability, notice_h, start_wait_h, restart_wait_h = (
        np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in given))
    )
    known = np.isfinite(start_wait_h)
    attempts = STARTUP_H * (1 / availability - 1)
    waiting, rewaiting = np.where(known, start_wait_h, attempts), np.where(known, restart_wait_h, attempts)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # a hazard of 1e-300 divides to inf
        tau = np.where(hazard > 0, np.minimum(np.sqrt(2 * delta / hazard), t), np.nan)
        writes = np.where(tau > 0, delta / tau, 0.0)  # share of time spent checkpointing
        running = t * (1 + writes)
        lost = restart + np.fmin(np.where(hazard > 0, tau, 0.0) / 2, notice_h)  # fmin: NaN is none
        per_preemption = lost + rewaiting
        mean_preemptions = hazard * running
        wall = STARTUP_H + waiting + running + mean_preemptions * per_preemption
        paid = np.where(known, STARTUP_H + running + mean_preemptions * lost, wall)  # attempts are billed start-ups
        slack = window_h - STARTUP_H - waiting - running
        allowed = np.where(np.isfinite(slack), np.floor(slack / per_preemption), 0.0)
        p_meet = np.where(np.isinf(window_h), 1.0, np.where(slack < 0, 0.0, poisson_cdf(allowed, mean_preemptions)))
    out = Expectation(tau, running, wall, price * paid, p_meet)
    return Expectation(*(float(x) for x in out)) if t.ndim == 0 else out


def fallback_expectation(spot: Expectation, spot_price, spot_t, od_cost, od_t, restart, window_h) -> Expectation:
    """Spot with an on-demand fallback: the deadline guard moves the job to on-demand when its safety
    net fires (Can't Be Late's R < C + 2d, d = restart + start-up). With probability p_meet the job
    finishes on spot. Otherwise it progressed at its expected pace on spot, od_t / wall_h on-demand
    hours per hour, until the net fired: at s = slack / (1 - pace) with slack = window - od_t - 2d;
    it paid spot until then and on-demand for the work left, which its checkpoint takes along. The
    deadline then holds whenever on-demand alone fits with that margin."""
    window = np.asarray(window_h, dtype=float)
    margin = 2 * (np.asarray(restart, dtype=float) + STARTUP_H)
    late = spot.p_meet < 1  # 0 x inf is NaN: only a job that can be late has a switch point
    with np.errstate(divide="ignore", invalid="ignore"):
        pace = np.clip(np.asarray(od_t) / spot.wall_h, 0.0, 1.0)
        slack = np.where(late, np.maximum(window - np.asarray(od_t) - margin, 0.0), 0.0)
        switch_h = np.where(pace < 1, np.minimum(slack / (1 - pace), np.maximum(window - margin, 0.0)), slack)
        left = np.where(late, np.clip((window - switch_h - margin) / np.asarray(od_t), 0.0, 1.0), 0.0)
    late_cost = np.where(late, spot_price * switch_h + od_cost * left, 0.0)
    cost = spot.p_meet * spot.cost_usd + (1 - spot.p_meet) * late_cost
    wall = np.where(
        late,
        spot.p_meet * spot.wall_h + (1 - spot.p_meet) * (switch_h + restart + left * od_t + STARTUP_H),
        spot.wall_h,
    )
    on_time = np.where(np.asarray(od_t) + margin <= window, 1.0, spot.p_meet)
    return Expectation(spot.interval_h, spot.running_h, wall, cost, on_time)


def spot_work_usd(
    spec: JobSpec, offers: list[Offer], hours: list[float], window_h: float, fallback=None, speed_sigma: float = 0.0
):
    """The expected cost of `hours` of the job's work on each spot (or bubble) offer, with its preemptions paid and,
    where the window may run out first, the share the deadline guard moves to the `fallback` on-demand Option (the
    money model's fallback_expectation): price x hours ranked first an 8x A100 spot whose work barely fit the window
    and fell back to an 8x H100 at $46 an hour. With a fallback, the cost is the mean over the speeds the job may
    turn out to have (log sd `speed_sigma`; 0 once measured): at the estimate an 8x A100 spot fit a 3.1-hour window
    with 0.8 hours to spare, but at a speed 20% slower its futures moved to the 8x H100 on-demand."""
    prices = np.array([o.price_usd_per_h for o in offers], dtype=float)
    notices: dict[tuple, float] = {}  # the notice's loss depends on the cloud and tier only
    for o in offers:
        if (o.cloud, o.tier) not in notices:
            notices[o.cloud, o.tier] = _notice_h(spec, o)
    falls_back = fallback is not None and math.isfinite(window_h)
    # one row a speed (the estimate alone without a fallback to move to), one column an offer
    slower = np.exp(speed_sigma * SPEED_POINTS)[:, None] if falls_back and speed_sigma > 0 else np.ones((1, 1))
    work_h = np.asarray(hours, dtype=float)[None, :] * slower
    spot = expectation(
        work_h,
        checkpoint_hours(spec),
        restart_hours(spec),
        np.array([o.hazard_per_h for o in offers], dtype=float),
        prices,
        window_h,
        np.array([o.availability for o in offers], dtype=float),
        np.array([notices[o.cloud, o.tier] for o in offers], dtype=float),
        *np.array([waits_h(o) for o in offers], dtype=float).reshape(len(offers), 2).T,
    )
    if not falls_back:
        return spot.cost_usd[0]
    od_cost, od_h = fallback.expected_cost_usd * slower, fallback.exclusive_h * slower
    return fallback_expectation(spot, prices, work_h, od_cost, od_h, restart_hours(spec), window_h).cost_usd.mean(0)


def evaluate(spec: JobSpec, offer: Offer, now: datetime, remaining: float = 1.0) -> Option:
    """Price the job on the offer: expected wall time and cost, and P(meet deadline).

    `remaining` is the share of the job's work still to do (1 for a job that has not started).
    """
    t = exclusive_hours(spec, offer) * remaining
    e = expectation(
        t,
        checkpoint_hours(spec),
        restart_hours(spec),
        offer.hazard_per_h,
        offer.price_usd_per_h,
        window_hours(spec, now),
        offer.availability,
        _notice_h(spec, offer),
        *waits_h(offer),
    )
    return _option(spec, offer, now, t, e)


def evaluate_with_fallback(
    spec: JobSpec, spot: Offer, on_demand: Option, now: datetime, remaining: float = 1.0
) -> Option:
    """Price the job on a spot (or bubble) offer with `on_demand` kept in reserve by the deadline guard."""
    t = exclusive_hours(spec, spot) * remaining
    restart, window = restart_hours(spec), window_hours(spec, now)
    alone = expectation(
        t,
        checkpoint_hours(spec),
        restart,
        spot.hazard_per_h,
        spot.price_usd_per_h,
        window,
        spot.availability,
        _notice_h(spec, spot),
        *waits_h(spot),
    )
    e = fallback_expectation(
        alone, spot.price_usd_per_h, t, on_demand.expected_cost_usd, on_demand.exclusive_h, restart, window
    )
    return _option(spec, spot, now, t, Expectation(*(float(x) for x in e)), fallback=on_demand.offer)


def _option(
    spec: JobSpec, offer: Offer, now: datetime, t: float, e: Expectation, fallback: Offer | None = None
) -> Option:
    cost = e.cost_usd + transfer_usd(spec, offer)
    return Option(
        offer=offer,
        fallback=fallback,
        exclusive_h=t,
        checkpoint_interval_h=None if math.isnan(e.interval_h) else e.interval_h,
        expected_wall_h=e.wall_h,
        expected_cost_usd=cost,
        p_meet_deadline=e.p_meet,
        expected_finish=now + timedelta(hours=e.wall_h),
        meets_deadline=spec.deadline is None or e.p_meet >= spec.deadline_probability,
        within_budget=spec.budget_usd is None or cost <= spec.budget_usd,
    )
