"""Hedge: spot when there is some; wait out a short gap, pay on-demand through a long one, the split set by the
market model (the rule the quote's futures play as `hedge`, models/futures.py).

Spot gaps are heavy-tailed: the longer one has lasted, the longer it goes on. With slack S (time left beyond
the on-demand work and the safety net's 2d) and about N more gaps before the work is done, a job can afford to
wait a* per gap (Hedge.longest_wait); one idle longer than a* is in a long gap and goes on-demand, where
Uniform Progress would have gone at once when behind and Greedy not before the safety net. That split is the
market's: a job idle because the fleet's spot agents that fit it are all busy (other jobs hold them) waits for a
slot, not for the market, and there it follows Uniform Progress. It leaves on-demand for an idle spot agent
when a mean up-spell there saves more than the two changeovers cost and the slack pays one and the guard's pass
(the planner keeps that pass for a start on spot), and moves a run on spot to a cheaper idle spot agent when the
saving over that zone's mean up-spell pays the changeover (SpotHedge's idea). A lost deadline run cheapest leaves
on-demand whenever the spell pays the changeovers, whatever the slack. Without a market model it is Uniform
Progress.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from broker.domain.model import AgentInfo, JobSpec, Tier
from broker.domain.offer import Offer
from broker.domain.plan import Plan
from broker.models.fit import fits
from broker.models.futures import Hedge
from broker.planning import register
from broker.planning.option_table import PlanItem
from broker.planning.uniform_progress import Move, Progress, UniformProgress, decide


@register("hedge")
class HedgePolicy(UniformProgress):
    """Spot when there is some; waits out a gap as long as the market model says the slack affords, then on-demand."""

    name = "hedge"
    rule = "hedge"

    def __init__(
        self,
        hedge: Callable[[JobSpec], Hedge | None] | None = None,
        live_spot: Callable[[], list[AgentInfo]] | None = None,
    ):
        self.hedge = hedge  # the market's view for a job's spot zones (core/hedging.MarketHedge)
        self.live_spot = live_spot  # the fleet's working spot agents, busy or idle (core/broker.py)
        self._live: list[AgentInfo] = []  # read once a plan

    def plan(self, items: list[PlanItem], offers: list[Offer], capacity: dict[str, int], now: datetime) -> Plan:
        self._live = self.live_spot() if self.live_spot else []
        return super().plan(items, offers, capacity, now)

    def held_by_others(self, spec: JobSpec) -> bool:
        """Whether the fleet has spot agents that fit the job (so the market has capacity), all busy now."""
        return any(fits(spec, agent.offer) for agent in self._live)

    def view(self, spec: JobSpec) -> Hedge | None:
        """The market's view for the job's spot zones; None without a market model or a spot zone it fits."""
        return self.hedge(spec) if self.hedge else None

    def idle_move(self, item: PlanItem, progress: Progress, spot_available: bool, now: datetime) -> Move:
        view = self.view(item.spec)
        if (
            spot_available
            or view is None
            or decide(progress, None, False, uniform=False) == Move.on_demand
            or self.held_by_others(item.spec)
        ):
            return super().idle_move(item, progress, spot_available, now)  # spot, the net, no model, or a queue
        waited_h = (now - (item.idle_since or now)).total_seconds() / 3600
        return Move.on_demand if waited_h > self._wait_ticks(view, progress) * view.tick_h else Move.wait

    def _wait_ticks(self, view: Hedge, progress: Progress) -> int:
        """a*: the ticks of a gap the job's slack affords waiting out (-1: none)."""
        left_h = progress.total_h - progress.done_h
        zone_up_h = view.zone_up_h[0] if view.zone_up_h else view.mean_up_h  # it launches in the cheapest first
        return int(view.longest_wait(progress.slack_h(), left_h, progress.changeover_h, zone_up_h))

    def leaves_on_demand(
        self, item: PlanItem, progress: Progress, spot: Offer, on_demand: Offer, now: datetime
    ) -> bool:
        view = self.view(item.spec)
        if view is None:
            return super().leaves_on_demand(item, progress, spot, on_demand, now)
        worth = view.spot_worth(on_demand.price_usd_per_h, spot.price_usd_per_h, progress.changeover_h)
        room_h = progress.changeover_h + progress.pass_h  # the changeover back, and the pass kept for a start on spot
        affords = progress.slack_h() >= room_h or progress.runs_cheapest(Tier.on_demand)
        return bool(worth) and affords

    def leaves_on_demand_to_wait(self, item: PlanItem, progress: Progress, now: datetime) -> bool:
        """As Uniform Progress (past ep(t + 2d), no spot free), where the job would then wait: in a queue, or in a gap
        its slack affords waiting out for a tick at least (with a* = 0 it would be back on on-demand at the next
        round, two changeovers for nothing)."""
        if not super().leaves_on_demand_to_wait(item, progress, now):
            return False
        view = self.view(item.spec)
        return view is None or self.held_by_others(item.spec) or self._wait_ticks(view, progress) >= 1

    def moves_zone(self, item: PlanItem, progress: Progress, now_on: Offer, there: Offer) -> bool:
        """SpotHedge's idea: cheap zones come and go, follow them when the saving pays the changeover."""
        view = self.view(item.spec)
        if view is None or there.price_usd_per_h >= now_on.price_usd_per_h:
            return False
        left_h = progress.total_h - progress.done_h
        worth = view.zone_move_worth(
            now_on.price_usd_per_h,
            there.price_usd_per_h,
            view.up_h(there.id),
            left_h,
            progress.slack_h(),
            progress.changeover_h,
        )
        return bool(worth)
