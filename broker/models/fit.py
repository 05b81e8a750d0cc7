"""Whether an offer satisfies a job's resources, and what it lacks: one table of checks (FIT_CHECKS), each with the
spec field it names, read by the planner (fits), by a queued job's reason (unfit) and by the quote."""

from __future__ import annotations

import math

from broker.domain.model import JobSpec, Tier
from broker.domain.offer import Offer
from broker.models.placement import placed
from broker.models.risk import exclusive_hours_on


def fits(spec: JobSpec, offer: Offer) -> bool:
    """Whether the offer's tier, hardware and place satisfy the job's resources."""
    for ok, _ in FIT_CHECKS:  # a loop, not all(): the planner asks it of every job kind and offer
        if not ok(spec, offer):
            return False
    return True


def unfit(spec: JobSpec, offer: Offer) -> str | None:
    """What the offer lacks of the job's asks, naming the spec's field (a queued job says it of the agents it waits
    beside: "agents have L4:1" told a job asking for L4:1 and 32 GB nothing); None when it fits."""
    return next((says(spec, offer) for ok, says in FIT_CHECKS if not ok(spec, offer)), None)


def fit_key(spec: JobSpec) -> str:
    """What `fits` reads of a spec, as a key: jobs alike in it fit the same offers (a plan checks each kind once)."""
    return spec.model_dump_json(include={"resources", "tiers", "fill", "transformer"})


def allowed_tiers(spec: JobSpec) -> set[Tier]:
    """The tiers the job accepts; bubbles only for jobs that implement the fill step interface."""
    return {t for t in spec.tiers if t != Tier.bubble or spec.fill}


def shape_fits(spec: JobSpec, offer: Offer) -> bool:
    """Whether the offer has one of the accelerator shapes (name and count) the job accepts."""
    return any(a.name == offer.accelerator and a.count == offer.accelerator_count for a in spec.resources.accelerators)


def tier_fits(spec: JobSpec, offer: Offer) -> bool:
    return offer.tier in allowed_tiers(spec)


def gpu_memory_fits(spec: JobSpec, offer: Offer) -> bool:
    asked = spec.resources.gpu_memory_gb
    return not asked or offer.gpu_memory_gb >= asked


def cpus_fit(spec: JobSpec, offer: Offer) -> bool:
    asked = spec.resources.cpus
    return not asked or (offer.vcpus or 0) >= asked


def host_memory_fits(spec: JobSpec, offer: Offer) -> bool:
    asked = spec.resources.memory_gb
    return not asked or (offer.memory_gb or 0) >= asked


def memory_fits(spec: JobSpec, offer: Offer) -> bool:
    """Whether the offer has the GPU memory, host memory and CPUs the job asks for."""
    return all(ok(spec, offer) for ok in (gpu_memory_fits, model_fits, cpus_fit, host_memory_fits))


def model_fits(spec: JobSpec, offer: Offer) -> bool:
    """Whether a job with a `transformer:` model has a parallel layout that fits in the offer's GPUs' memory."""
    return spec.transformer is None or math.isfinite(
        exclusive_hours_on(spec, offer.accelerator, offer.accelerator_count)
    )


def _shape(offer: Offer) -> str:
    return f"{offer.accelerator}:{offer.accelerator_count}"


# what `fits` checks, in order, each with what `unfit` says when it fails (the spec's field named)
FIT_CHECKS = (
    (
        tier_fits,
        lambda s, o: f"{o.tier.value} is not among its tiers ({', '.join(t.value for t in allowed_tiers(s))})",
    ),
    (
        shape_fits,
        lambda s, o: (
            f"{_shape(o)} is not among its accelerators "
            f"({', '.join(f'{a.name}:{a.count}' for a in s.resources.accelerators)})"
        ),
    ),
    (
        gpu_memory_fits,
        lambda s, o: f"{o.gpu_memory_gb:g} GB a GPU, it asks gpu_memory_gb: {s.resources.gpu_memory_gb:g}",
    ),
    (model_fits, lambda s, o: f"no layout of its transformer: model fits in {_shape(o)}'s memory"),
    (cpus_fit, lambda s, o: f"{o.vcpus or 0:g} vCPUs, it asks cpus: {s.resources.cpus:g}"),
    (host_memory_fits, lambda s, o: f"{o.memory_gb or 0:g} GB of memory, it asks memory_gb: {s.resources.memory_gb:g}"),
    (placed, lambda s, o: f"{o.zone or o.region} is not where its resources place it (cloud, region, zone, exclude)"),
)
