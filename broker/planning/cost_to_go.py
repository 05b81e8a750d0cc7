"""Cost to go: hedge's zone moves and queues, with its waits and its returns from on-demand decided by each move's
expected cost to go under the market model (models/cost_to_go.py) instead of hedge's thresholds.

An idle job in a spot gap waits while waiting has the lower expected cost to go (the table knows how long the
gap has lasted, the work and time left, and the prices), and leaves on-demand for spot when a run there, from a
spell just begun, has. Everything else is hedge's: spot when there is some, Uniform Progress's move in a queue,
the safety net, a lost deadline run cheapest, moves to a cheaper zone. The market's view comes from the Broker
(core/hedging.MarketHedge: `zones_of` and `planned`); without it the policy is hedge.
"""

from __future__ import annotations

import math
from datetime import datetime

from broker.domain.model import JobSpec, Tier
from broker.domain.offer import Offer
from broker.domain.plan import Plan
from broker.models.cost_to_go import IDLE, OD, SPOT
from broker.models.fit import fits
from broker.models.risk import checkpoint_hours, exclusive_hours, lost_per_preemption_h, notice_loss_h, young_interval_h
from broker.planning import register
from broker.planning.hedge import HedgePolicy
from broker.planning.option_table import PlanItem
from broker.planning.uniform_progress import Move, Progress, decide


@register("cost-to-go")
class CostToGoPolicy(HedgePolicy):
    """Hedge, with its waits and returns from on-demand by the least expected cost to go under the market model."""

    name = "cost-to-go"
    rule = "cost-to-go"

    def plan(self, items: list[PlanItem], offers: list[Offer], capacity: dict[str, int], now: datetime) -> Plan:
        self._on_demand = [o for o in offers if o.tier == Tier.on_demand]  # the fallback's price for a wait
        return super().plan(items, offers, capacity, now)

    def move(self, item: PlanItem, progress: Progress, up: bool, age_h: float, on: int, od: Offer) -> int | None:
        """The table's move for the job now (IDLE, SPOT, OD), its fallback `od`; None without a market, a deadline
        or a spot zone. The table counts work in ticks on its cheapest zone, where on-demand does `od_speed` of them a
        tick (a faster GPU: more), as quotes solve it."""
        planned, zones_of = getattr(self.hedge, "planned", None), getattr(self.hedge, "zones_of", None)
        left_h = progress.window_h - progress.elapsed_h
        if planned is None or zones_of is None or not math.isfinite(left_h):
            return None
        zones = zones_of(item.spec)
        if not zones or not math.isfinite(progress.total_h):  # no on-demand to measure the work on: hedge's rule
            return None
        tick_h = self.view(item.spec).tick_h
        spot_h = exclusive_hours(item.spec, zones[0])
        od_speed = spot_h / exclusive_hours(item.spec, od)
        interval_h = young_interval_h(checkpoint_hours(item.spec), zones[0].hazard_per_h, spot_h)  # as agents run it
        loss_h = lost_per_preemption_h(interval_h, notice_loss_h(item.spec, zones[0]))
        ticks = math.ceil(left_h / tick_h)
        moves = planned(list(zones), ticks, od.price_usd_per_h, progress.changeover_h, od_speed, loss_h)
        work = (1 - progress.done_h / progress.total_h) * spot_h / item.speed / tick_h
        return int(moves.plan.move(math.floor(left_h / tick_h + 1e-9), work, up, int(age_h / tick_h), on))

    def up_h(self, spec: JobSpec, now: datetime) -> float:
        """Hours spot has been up for the job, at least: the age of the oldest working spot agent it fits (an
        instance alive since then is capacity that has lasted). At 0 the table sees a spell just begun, and a young
        spell is the likeliest to end (spells are heavy-tailed)."""
        live = self.live_spot() if self.live_spot else []
        since = [a.registered_at for a in live if fits(spec, a.offer)]
        return max(0.0, (now - min(since)).total_seconds() / 3600) if since else 0.0

    def idle_move(self, item: PlanItem, progress: Progress, spot_available: bool, now: datetime) -> Move:
        if (
            spot_available
            or self.held_by_others(item.spec)
            or decide(progress, None, False, uniform=False) != Move.wait
        ):
            return super().idle_move(item, progress, spot_available, now)  # spot, a queue, the net, a lost deadline
        waited_h = (now - (item.idle_since or now)).total_seconds() / 3600
        od = [o for o in getattr(self, "_on_demand", []) if fits(item.spec, o)]  # set by plan()
        cheapest = min(od, key=lambda o: o.price_usd_per_h * exclusive_hours(item.spec, o), default=None)
        move = self.move(item, progress, False, waited_h, IDLE, cheapest) if cheapest else None
        if move is None:
            return super().idle_move(item, progress, spot_available, now)
        return Move.on_demand if move == OD else Move.wait

    def leaves_on_demand_to_wait(self, item: PlanItem, progress: Progress, now: datetime) -> bool:
        """Never: the table's moves take a job off on-demand only to spot (leaves_on_demand), as its futures play."""
        return False

    def leaves_on_demand(
        self, item: PlanItem, progress: Progress, spot: Offer, on_demand: Offer, now: datetime
    ) -> bool:
        if spot.tier != Tier.spot or progress.runs_cheapest(Tier.on_demand):  # a bubble or a lost deadline: hedge's
            return super().leaves_on_demand(item, progress, spot, on_demand, now)
        up_h = self.up_h(item.spec, now)
        move = self.move(item, progress, True, up_h, OD, on_demand)
        if move is None:
            return super().leaves_on_demand(item, progress, spot, on_demand, now)
        return move == SPOT
