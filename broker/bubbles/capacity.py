"""Bubble profiles as Offers of tier `bubble` for the planner.

One offer per main job and stage: the stage's accelerator, the free memory its windows nearly
always have, one fill executor (capacity 1), an internal price (0 USD/h unless the main job's
owner sets one), the main job's own end or preemption rate as hazard, and a speed factor: the
share of the iteration in usable windows (p10 lengths) times the fill efficiency, since a fill
job runs only inside windows and loses their edges (PipeFill measured ~30% of exclusive speed).
Once a fill job's steps are measured, `measured_speed` replaces that guess with what Algorithm 1's
packing (`fill_plan.fill_throughput`) gives steps of that length in the stage's windows.
"""

from __future__ import annotations

from broker.bubbles.fill_plan import Node, fill_throughput
from broker.domain.bubbles import BubbleProfile, stage_agent_id
from broker.domain.model import Tier
from broker.domain.offer import Offer

FILL_EFFICIENCY = 0.9  # share of a usable window spent in fill steps (step granularity, pause latency)


def bubble_offer(
    bubble: BubbleProfile,
    cloud: str,
    region: str,
    accelerator: str,
    price_usd_per_h: float = 0.0,
    hazard_per_h: float = 0.0,
    min_window_s: float = 0.05,
) -> Offer | None:
    """The stage's idle windows as an offer, or None when no window is long enough to use."""
    usable = [w for w in bubble.windows if w.p10_s >= min_window_s]
    if not usable:
        return None
    share = min(1.0, bubble.usable_s(min_window_s) / bubble.iteration_s * FILL_EFFICIENCY)
    return Offer(
        cloud=cloud,
        region=region,
        zone=stage_agent_id(bubble.main_job, bubble.stage),
        instance_type=f"bubble:{bubble.main_job}",
        tier=Tier.bubble,
        accelerator=accelerator,
        accelerator_count=1,
        gpu_memory_gb=min(w.free_bytes for w in usable) / 1e9,
        vcpus=None,
        memory_gb=None,
        price_usd_per_h=price_usd_per_h,
        hazard_per_h=hazard_per_h,
        hazard_source=f"main job {bubble.main_job}",
        speed_factor=share,
    )


def measured_speed(window_s: list[float], iteration_s: float, step_s: float) -> float:
    """The share of exclusive speed a fill job whose steps take `step_s` gets in windows of these usable
    lengths each iteration: whole steps packed into each window (PipeFill's Algorithm 1), none across."""
    if step_s <= 0 or iteration_s <= 0:
        raise ValueError("step_s and iteration_s: give measured times > 0 s")
    return fill_throughput([(w, 0) for w in window_s], iteration_s, [Node(step_s, 0)])
