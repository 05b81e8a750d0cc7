"""An Offer: a place a job can run (a tier at a location, with a price, a hazard and a shape), its id, and what a
cloud's notice gives a job before a spot instance is taken back."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from broker.domain.jobspec import Tier

# How long before a spot instance is taken back its cloud says so (EC2's interruption notice, GCE's preemption, Azure's
# Preempt event): the agent checkpoints and stops the job within it (agents/agent.py), keeping a margin of
# NOTICE_MARGIN_S (a quarter of a shorter notice) for the instance to go.
NOTICE_LEAD_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
NOTICE_MARGIN_S = 2.0


def notice_grace_s(left_s: float) -> float:
    """How long a job may take to checkpoint and stop on a notice that comes `left_s` seconds before its instance
    goes: all of it but the margin."""
    return max(0.5, left_s - min(NOTICE_MARGIN_S, left_s / 4))


def offer_id(cloud: str, zone_or_region: str, instance_type: str, tier: Tier) -> str:
    """An offer's id: cloud/zone (or region)/instance type/tier; price rows and history use it too."""
    return f"{cloud}/{zone_or_region}/{instance_type}/{tier.value}"


def tier_of(offer_id_: str) -> Tier:
    """The tier an offer id names (its last part)."""
    return Tier(offer_id_.rsplit("/", 1)[-1])


class Offer(BaseModel):
    """A place a job can run: a tier at a location with a price, a hazard and a shape."""

    model_config = ConfigDict(frozen=True)

    cloud: str
    region: str
    zone: str | None
    instance_type: str
    tier: Tier
    accelerator: str
    accelerator_count: int
    gpu_memory_gb: float  # per GPU
    vcpus: float | None
    memory_gb: float | None
    price_usd_per_h: float
    hazard_per_h: float = 0.0  # preemptions per hour (0 for on-demand)
    hazard_source: str = "none"
    availability: float = Field(1.0, gt=0, le=1)  # share of time spot capacity can be had
    # hours a spell without it lasts, where measured (models/launch_waits.down_hours)
    mean_down_h: float | None = Field(None, ge=0)
    launch_waits_h: tuple[float, float] | None = None  # a start's and a restart's wait for it (models/launch_waits.py)
    speed_factor: float = Field(1.0, gt=0, le=1)  # share of exclusive speed a job gets (a bubble's fill throughput)

    @property
    def id(self) -> str:
        return offer_id(self.cloud, self.zone or self.region, self.instance_type, self.tier)


def exponential_down_h(availability: float, hazard_per_h: float) -> float:
    """Mean hours a spell without spot capacity lasts where spells up and down are exponential: up 1 / hazard on
    average, down so that capacity is there `availability` of the time (a zone no trace measured)."""
    return (1 - availability) / (availability * hazard_per_h) if hazard_per_h > 0 and availability < 1 else 0.0
