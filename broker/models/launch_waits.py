"""How long a spot start waits for capacity: until any zone the rule may launch the job in is up, not its own.

The rule (planning/uniform_progress.py) places a job on whatever spot offer of its speed has capacity, so a start
waits only while every such zone is down. Zones of one region go down together in the traces
(bench/results/forecast.md), so a region counts once, as its zone up the most. Regions are taken as independent; they
are not quite (bench/region_waits.py: the traces' waits are up to 3x these, still minutes).
With each region r up a share a_r of the time in spells down of D_r hours on average (down_hours):
    a start waits  prod_r (1 - a_r) / sum_r (1 / D_r)   (all down; the first region back ends the wait)
    a restart      prod_(r != own) (1 - a_r) / sum_r (1 / D_r)   (a preemption: its own region's capacity gone)
One zone alone: (1 - a) D and D. The money model priced a start as 1/a paid launch attempts of 5 minutes; one zone's
own spells alone (bfffb71) made a 1x L4 up 62% of the time 10 hours slower, where the packaged catalog has 1x L4 spot
in 70 zones of 29 regions.
"""

from __future__ import annotations

import math
from collections import defaultdict

from broker.domain.model import Tier
from broker.domain.offer import Offer, exponential_down_h


def down_hours(offer: Offer) -> float:
    """Mean hours a spell without spot capacity lasts in the offer's zone: the market model's where it measured it
    (core/broker.with_market_spells), else those of exponential spells for an untraced zone (up 1 / hazard)."""
    if offer.mean_down_h is not None:
        return offer.mean_down_h
    return exponential_down_h(offer.availability, offer.hazard_per_h)


def waits_h(offer: Offer) -> tuple[float, float]:
    """Hours a start and a restart on the offer wait for spot capacity, NaN where not known (no Broker set them):
    the money model then prices a start as launch attempts (risk.expectation)."""
    return offer.launch_waits_h if offer.launch_waits_h is not None else (math.nan, math.nan)


def with_launch_waits(offers: list[Offer]) -> list[Offer]:
    """The offers, each spot one with the hours its start and a restart after a preemption wait for capacity."""
    groups: dict[tuple, list[Offer]] = defaultdict(list)
    for offer in offers:
        if offer.tier == Tier.spot:
            groups[offer.accelerator, offer.accelerator_count, offer.speed_factor].append(offer)
    waits: dict[str, tuple[float, float]] = {}
    for group in groups.values():
        best: dict[tuple[str, str], Offer] = {}  # per region, its zone up the most
        for offer in group:
            region = (offer.cloud, offer.region)
            if region not in best or offer.availability > best[region].availability:
                best[region] = offer
        downs = [down_hours(o) for o in best.values()]
        back_per_h = sum(1 / d for d in downs if d > 0)
        for offer in group:
            own = (offer.cloud, offer.region)
            if min(downs) <= 0:  # a region always up
                waits[offer.id] = (0.0, 0.0)
                continue
            others = math.prod(1 - b.availability for region, b in best.items() if region != own)
            waits[offer.id] = ((1 - best[own].availability) * others / back_per_h, others / back_per_h)
    return [o.model_copy(update={"launch_waits_h": waits[o.id]}) if o.id in waits else o for o in offers]
