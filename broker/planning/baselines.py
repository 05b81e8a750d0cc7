"""What users have today, as policies the backtest compares broker with: everything on on-demand, and
SkyPilot's managed spot jobs (cheapest spot by price, EAGER_NEXT_REGION recovery, no deadline)."""

from __future__ import annotations

from datetime import datetime

from broker.domain.model import JobSpec, Option, Tier
from broker.domain.offer import Offer
from broker.domain.plan import Plan, Unplaced
from broker.models.fit import fits
from broker.planning import register
from broker.planning.cheapest import CheapestFeasible
from broker.planning.option_table import PlanItem


@register("on-demand")
class AllOnDemand(CheapestFeasible):
    """Every job on its cheapest on-demand offer: the reference that savings are measured against."""

    name = "on-demand"
    deadline_guard = False  # never on spot: nothing to guard

    def options(self, spec: JobSpec, offers: list[Offer], now: datetime) -> list[Option]:
        return super().options(spec, [o for o in offers if o.tier == Tier.on_demand], now)


@register("skypilot-eager")
class EagerNextRegion(CheapestFeasible):
    """SkyPilot's managed spot job: the cheapest spot offer by price; after a preemption, another region first."""

    name = "skypilot-eager"
    deadline_guard = False  # SkyPilot knows no deadlines or budgets
    rule = "spot-only"

    def options(self, spec: JobSpec, offers: list[Offer], now: datetime) -> list[Option]:
        """Spot offers by catalog price; the deadline and budget are not part of its model."""
        blind = spec.model_copy(update={"deadline": None, "budget_usd": None})
        spot = [o for o in offers if o.tier == Tier.spot]
        return sorted(super().options(blind, spot, now), key=lambda o: (o.offer.price_usd_per_h, o.offer.id))

    def plan(self, items: list[PlanItem], offers: list[Offer], capacity: dict[str, int], now: datetime) -> Plan:
        """Each job in order on the cheapest spot offer with room, leaving the region that just preempted it
        when another region has room; without spot anywhere it waits (SkyPilot keeps retrying)."""
        left = {o.id: capacity.get(o.id, 10**9) for o in offers}
        by_price = sorted((o for o in offers if o.tier == Tier.spot), key=lambda o: (o.price_usd_per_h, o.id))
        plan = Plan(policy=self.name)
        for item in items:
            room = [o for o in by_price if left[o.id] > 0 and fits(item.spec, o)]
            elsewhere = [o for o in room if o.region != item.preempted_in]
            chosen = (elsewhere or room or [None])[0]
            if chosen is None:
                plan.unplaced[item.id] = Unplaced.waiting
                continue
            plan.assignments[item.id] = chosen.id
            left[chosen.id] -= 1
        return plan
