"""Expected time and cost of a job on an offer under preemption, and its odds of meeting the deadline.

The model (DESIGN.md, "The money model"): exclusive time t from the job's work and the
offer's speed; checkpoint cost delta, restart cost R, hazard lambda; Young's interval
tau = sqrt(2 delta / lambda). Expected wall time is t (1 + delta/tau)(1 + lambda (R + tau/2))
plus the first start-up. The number of preemptions is Poisson with mean lambda t (1 + delta/tau),
each costing R + tau/2, which gives P(finish by the deadline). Pure functions: no clock, no I/O.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from broker.model import JobSpec, Offer, Option
from broker.pricing.accelerators import ACCELERATORS

# Sustained checkpoint upload to object storage (a single stream to S3/GCS/Blob typically
# sustains 100-500 MB/s); 250 MB/s is the planning figure.
CHECKPOINT_WRITE_GB_PER_S = 0.25
# Launching an instance and starting the job on it (image boot, setup, process start).
STARTUP_H = 5 / 60
# After a preemption: a replacement instance, plus the job's own restore time from its spec.
RESTART_OVERHEAD_H = 5 / 60


def fits(spec: JobSpec, offer: Offer) -> bool:
    """Whether the offer's tier and hardware satisfy the job's resources."""
    res = spec.resources
    if offer.tier not in spec.tiers:
        return False
    if not any(a.name == offer.accelerator and a.count == offer.accelerator_count for a in res.accelerators):
        return False
    if res.gpu_memory_gb and offer.gpu_memory_gb < res.gpu_memory_gb:
        return False
    if res.cpus and (offer.vcpus or 0) < res.cpus:
        return False
    return not (res.memory_gb and (offer.memory_gb or 0) < res.memory_gb)


def exclusive_hours(spec: JobSpec, offer: Offer) -> float:
    """Hours the job needs on the offer when never interrupted."""
    work = spec.work
    if work.steps is not None:
        return work.steps / work.steps_per_hour[offer.accelerator]
    speed = ACCELERATORS[offer.accelerator].speed(work.kind)
    return work.gpu_hours / (offer.accelerator_count * speed)


def checkpoint_hours(spec: JobSpec) -> float:
    """Time to write one checkpoint of the job."""
    return spec.checkpoint.size_gb / CHECKPOINT_WRITE_GB_PER_S / 3600


def restart_hours(spec: JobSpec) -> float:
    """Time lost to a restart besides the lost work: a new instance and the restore."""
    return RESTART_OVERHEAD_H + spec.checkpoint.restore_minutes / 60


def young_interval_h(checkpoint_h: float, hazard_per_h: float, exclusive_h: float) -> float | None:
    """Young's checkpoint interval sqrt(2 delta / lambda), capped at the job's length; None without hazard."""
    if hazard_per_h <= 0:
        return None
    return min(math.sqrt(2 * checkpoint_h / hazard_per_h), exclusive_h)


def poisson_cdf(k: int, mean: float) -> float:
    """P(N <= k) for N ~ Poisson(mean)."""
    if k < 0:
        return 0.0
    if mean <= 0 or k > mean + 12 * math.sqrt(mean) + 30:
        return 1.0
    log_mean = math.log(mean)
    return min(1.0, sum(math.exp(-mean + i * log_mean - math.lgamma(i + 1)) for i in range(k + 1)))


def evaluate(spec: JobSpec, offer: Offer, now: datetime) -> Option:
    """Price the job on the offer: expected wall time and cost, and P(meet deadline)."""
    t = exclusive_hours(spec, offer)
    delta = checkpoint_hours(spec)
    tau = young_interval_h(delta, offer.hazard_per_h, t)
    running_h = t * (1 + delta / tau) if tau else t
    per_preemption_h = restart_hours(spec) + (tau or 0) / 2
    mean_preemptions = offer.hazard_per_h * running_h
    expected_wall_h = STARTUP_H + running_h + mean_preemptions * per_preemption_h
    cost = offer.price_usd_per_h * expected_wall_h

    p_meet = 1.0
    if spec.deadline is not None:
        slack_h = (spec.deadline - now).total_seconds() / 3600 - STARTUP_H - running_h
        if slack_h < 0:
            p_meet = 0.0
        elif mean_preemptions > 0:
            p_meet = poisson_cdf(math.floor(slack_h / per_preemption_h), mean_preemptions)
    return Option(
        offer=offer,
        exclusive_h=t,
        checkpoint_interval_h=tau,
        expected_wall_h=expected_wall_h,
        expected_cost_usd=cost,
        p_meet_deadline=p_meet,
        expected_finish=now + timedelta(hours=expected_wall_h),
        meets_deadline=spec.deadline is None or p_meet >= spec.deadline_probability,
        within_budget=spec.budget_usd is None or cost <= spec.budget_usd,
    )
