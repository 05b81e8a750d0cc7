"""Uniform Progress, the deadline guard of "Can't Be Late" (NSDI'24), and the policy built on it.

C(t) is the work left (hours on on-demand), R(t) the time left, d the changeover delay.
- Safety net: when R(t) < C(t) + 2d, go on-demand and stay.
- Expected progress ep(t) = t C(0) / R(0); done cp(t) = C(0) - C(t).
- Idle and behind (cp < ep): on-demand. Idle and ahead: wait for spot.
- Spot available: take it, even when behind, and stay until preempted.
- On on-demand: stay until cp(t) >= ep(t + 2d) (hysteresis), then back to spot when there is some.
- On spot with less slack than the work since the newest checkpoint: checkpoint now; within one guard pass of the
  net: on-demand, since a checkpoint each pass no longer keeps a preemption from crossing it; an idle job there
  starts on on-demand, not on spot it would leave a pass later (broker's, not the paper's).
- Until the job's speed is measured (half an hour of runs), C(t) is the estimate's, and the net keeps the work more
  that a speed at the deadline probability's quantile of the estimate's error would need (Progress.unsure_h;
  broker's: the paper knows the job's length). Where the quote found the deadline's odds hold with the speed
  measured on spot (Progress.measures_on_spot), that reserve sends the job to on-demand only from a wait with no
  spot to take: a run on spot measures the speed as well as one on on-demand.
Bubbles count as spot here: cheap capacity that can vanish. Pure: state and time are passed in.

Once a deadline is lost (even on-demand from now finishes after it), the paper's net keeps the job on on-demand to
finish soonest. A job whose spec says `if_late: cheapest` (the default) runs cheapest instead: it stays on spot, takes
spot that no job still in time waits for, and pays on-demand only while there is none, never idle. With `if_late:
extend` it gets a second window as long as the first and runs to it by the rule, waiting for spot while ahead
(bench/results/cost.md: its bill for twice the lateness). Such jobs are planned last, so they never take the slot
of a job that can still make its deadline.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum

from broker.domain.model import IfLate, JobSpec, Option, Tier
from broker.domain.offer import Offer, tier_of
from broker.domain.plan import Plan, Unplaced
from broker.models.fit import fit_key, fits
from broker.models.placement import transfer_usd
from broker.models.risk import changeover_hours, evaluate, exclusive_hours, restart_hours, spot_work_usd, window_hours
from broker.planning import register
from broker.planning.cheapest import CheapestFeasible
from broker.planning.option_table import PlanItem

SPEEDS_DIFFER = 1.05  # offers whose hours for a job differ by more are of different speeds (spot_in_time)
TIE_H = 1e-9  # exactly on a threshold (ep(t), the safety net) is not past it: float sums of equal steps land there


class Move(str, Enum):
    spot = "spot"
    on_demand = "on_demand"
    wait = "wait"


@dataclass(frozen=True)
class Progress:
    """Where a job stands against its deadline, in hours (Can't Be Late's C(0), cp(t), t, R(0), d)."""

    total_h: float
    done_h: float
    elapsed_h: float
    window_h: float
    changeover_h: float
    cheapest_if_late: bool = False  # the spec's `if_late: cheapest` (or `extend`, in its second window)
    extends: bool = False  # the spec's `if_late: extend`: a lost deadline gets a second window (in_window)
    extended: bool = False  # `window_h` is that second window
    # the time until the guard looks again: what a run on spot (or a start there) may lose to a preemption before it
    # can be asked for a checkpoint or moved, so the net off on-demand keeps that much more
    pass_h: float = 0.0
    # hours of work more the net keeps while the job's speed is not measured (PlanItem.unsure): were it as slow as
    # the estimate's error allows, on-demand from the net's edge would still be in time
    unsure_h: float = 0.0
    # the quote found the deadline's odds hold with the speed measured on spot (Forecast.measures_on_spot): the
    # reserve then keeps the job off spot only while it waits with no spot to take
    measures_on_spot: bool = False
    # what a start on spot spends before its first step (the restart), kept by the net for an idle job: with less
    # slack it would start on spot only to be moved to on-demand before it gains anything (0: the paper's setting)
    start_h: float = 0.0

    def slack_h(self) -> float:
        """Hours the job can still lose beyond its on-demand work left (and the margin for a speed not yet measured)
        and the safety net's 2d."""
        return self.window_h - self.elapsed_h - (self.total_h - self.done_h) - self.unsure_h - 2 * self.changeover_h

    def lost(self, on: Tier | None) -> bool:
        """Whether even on-demand from now (after a changeover, unless already on it) finishes after the deadline."""
        changeover_h = 0.0 if on == Tier.on_demand else self.changeover_h
        return self.window_h - self.elapsed_h < self.total_h - self.done_h + changeover_h - TIE_H

    def runs_cheapest(self, on: Tier | None) -> bool:
        """Whether the job now runs cheapest, not soonest: its deadline is lost and its spec says so."""
        return self.cheapest_if_late and self.lost(on)

    def in_window(self, on: Tier | None) -> Progress:
        """The Progress the rule decides by where the job runs (`on`): with `extends` and its deadline lost, the
        second window, as long again as the first (lost in turn, it runs cheapest)."""
        if self.extends and not self.extended and self.lost(on):
            return replace(self, window_h=2 * self.window_h, extended=True)
        return self

    def planned_last(self) -> bool:
        """Whether its deadline is lost (run cheapest, or to its second window): planned after the jobs in time."""
        return self.extended or self.runs_cheapest(None)

    def expected_done_h(self, at_h: float) -> float:
        """ep(t): the work a job progressing uniformly to its deadline has done at time t."""
        return min(self.total_h, at_h * self.total_h / self.window_h) if self.window_h > 0 else self.total_h


def decide(p: Progress, on: Tier | None, spot_available: bool, uniform: bool = True) -> Move:
    """The guard's rule for a job now on `on` (None: idle, e.g. just preempted). With uniform=False it is
    Can't Be Late's Greedy: an idle job waits for spot however far behind, until the safety net. A lost deadline
    run cheapest takes spot whenever there is some, on-demand otherwise (a job in a bubble goes on to the net)."""
    if on != Tier.bubble and p.runs_cheapest(on):
        return Move.spot if on == Tier.spot or spot_available else Move.on_demand
    left_h, time_left_h = p.total_h - p.done_h, p.window_h - p.elapsed_h
    exposed_h = p.pass_h if on != Tier.on_demand else 0.0
    exposed_h += p.start_h if on is None else 0.0  # idle: it would start on spot
    on_spot = on in (Tier.spot, Tier.bubble) or (on is None and spot_available)
    unsure_h = 0.0 if p.measures_on_spot and on_spot else p.unsure_h
    if time_left_h < left_h + unsure_h + 2 * p.changeover_h + exposed_h - TIE_H:
        return Move.on_demand  # safety net
    if on == Tier.on_demand:
        if p.done_h < p.expected_done_h(p.elapsed_h + 2 * p.changeover_h) - TIE_H:
            return Move.on_demand  # hysteresis: not far enough ahead to give it up yet
        return Move.spot if spot_available else Move.wait
    if on in (Tier.spot, Tier.bubble) or spot_available:
        return Move.spot
    return Move.on_demand if uniform and p.done_h < p.expected_done_h(p.elapsed_h) - TIE_H else Move.wait


def checkpoint_due(p: Progress, unsaved_h: float, checkpoint_h: float, notice_h: float | None = None) -> bool:
    """Whether a job on spot (or in a bubble) should checkpoint now and run on: it is in time, but a preemption
    before the guard looks again (in `p.pass_h`), losing the `unsaved_h` hours of work (on on-demand) since its
    newest checkpoint and what it does until then, would put it past the safety net, where on-demand no longer has
    the changeovers' margin. Not within one pass of the net (decide moves it to on-demand there), nor when the write
    (`checkpoint_h`) takes longer than the work it keeps. The preemption at the net's edge is rare: a checkpoint there
    costs less than on-demand for every job that comes near it (bench/results/forecast.md). Where the job checkpoints
    on the cloud's notice, a preemption loses at most the notice's lead (`notice_h`, risk.notice_loss_h)."""
    margin_h = p.slack_h()
    at_risk_h = unsaved_h if notice_h is None else min(unsaved_h, notice_h)
    return p.pass_h - TIE_H <= margin_h < at_risk_h + p.pass_h - TIE_H and unsaved_h > checkpoint_h


def progress_of(item: PlanItem, on_demand_h: float, submitted_at: datetime, now: datetime) -> Progress:
    """A job's Progress, with its work measured on the on-demand offer it would fall back to. With `if_late:
    extend`, once even on-demand from where it runs now would miss the deadline, the window is the second one (twice
    the first, from submit), lost in turn run cheapest."""
    progress = Progress(
        total_h=on_demand_h,
        done_h=on_demand_h * (1 - item.remaining),
        unsure_h=on_demand_h * item.remaining * item.unsure,
        elapsed_h=(now - submitted_at).total_seconds() / 3600,
        window_h=window_hours(item.spec, submitted_at),
        changeover_h=changeover_hours(item.spec),
        cheapest_if_late=item.spec.if_late in (IfLate.cheapest, IfLate.extend),
        extends=item.spec.if_late == IfLate.extend,
        pass_h=item.pass_h,
        measures_on_spot=item.measures_on_spot,
        start_h=restart_hours(item.spec),
    )
    return progress.in_window(tier_of(item.current) if item.current else None)


def spot_in_time(
    item: PlanItem,
    offers: list[Offer],
    progress: Progress | None,
    fallback: Callable[[], Option | None] = lambda: None,
) -> list[Offer]:
    """The spot and bubble offers, cheapest work first, less the spot ones where the job's work left, at its speed,
    would not be done by its deadline even if never interrupted (`progress`: its window; None without a deadline).
    Can't Be Late's rule has one instance type; with several, one too slow for the deadline is no spot for the job.
    A bubble stays: its work is free, and the guard moves the job off when it falls behind. A lost deadline run
    cheapest takes any spot, no bubble (the guard would move it off at once). The cost of the work is the money
    model's, preemptions and, where the window may run out first, the move to the `fallback` on-demand Option paid
    (risk.spot_work_usd, over the speeds a job not yet measured may have; asked for only where there are offers to
    rank): a cheaper hour on slower GPUs may be dearer work; among free bubbles the fastest."""
    hours = [item.remaining * exclusive_hours(item.spec, o) / item.speed for o in offers]
    if progress is not None and progress.runs_cheapest(None):
        kept = [i for i, o in enumerate(offers) if o.tier == Tier.spot]
    elif progress is not None:
        time_left_h = progress.window_h - progress.elapsed_h - progress.changeover_h
        kept = [i for i, o in enumerate(offers) if o.tier == Tier.bubble or hours[i] <= time_left_h]
    else:
        kept = list(range(len(offers)))
    offers, hours = [offers[i] for i in kept], [hours[i] for i in kept]
    if len(offers) < 2:
        return offers
    window_h = progress.window_h - progress.elapsed_h if progress is not None else float("inf")
    # the fall back separates offers of different speeds (a slow one barely in time); between zones of one speed
    # it is the hazard's alone, which the market model's zone moves weigh better (12 backtests: +0.3% with it)
    speeds_differ = max(hours) > SPEEDS_DIFFER * min(hours)
    reserve = fallback() if math.isfinite(window_h) and speeds_differ else None
    cost = spot_work_usd(item.spec, offers, hours, window_h, reserve, item.speed_sigma)
    order = sorted(range(len(offers)), key=lambda i: (cost[i], offers[i].price_usd_per_h, hours[i]))
    return [offers[i] for i in order]


def on_demand_option(item: PlanItem, offers: list[Offer], progress: Progress | None, now: datetime) -> Option | None:
    """The on-demand offer the rule would send the job to (on_demand_in_time), priced for its work left: what a
    spot offer whose window may run out falls back to (spot_in_time ranks by it)."""
    if not offers:
        return None
    return evaluate(item.spec, on_demand_in_time(item, offers, progress, now), now, item.remaining)


def on_demand_in_time(item: PlanItem, offers: list[Offer], progress: Progress | None, now: datetime) -> Offer:
    """The on-demand offer a job the rule sends there runs on: the cheapest work (price x hours, its input's move
    too) of those that do its work left, with the reserve for a speed not yet measured, in the time left; none doing
    so (or a lost deadline run soonest): the fastest. The cheapest whatever its speed sent a job whose progress is
    measured on an A100 to an L4 2.5 times slower, where it missed. A lost deadline run cheapest takes the cheapest."""
    hours = [item.remaining * exclusive_hours(item.spec, o) / item.speed for o in offers]
    kept = range(len(offers))
    if progress is not None and not progress.runs_cheapest(None):
        room_h = progress.window_h - progress.elapsed_h - progress.changeover_h
        kept = [i for i in kept if hours[i] * (1 + item.unsure) <= room_h]
    if not kept:
        return offers[min(range(len(offers)), key=lambda i: (hours[i], offers[i].price_usd_per_h))]  # the fastest
    return offers[
        min(kept, key=lambda i: (offers[i].price_usd_per_h * hours[i] + transfer_usd(item.spec, offers[i]), hours[i]))
    ]


def progress_on(item: PlanItem, offers: list[Offer], now: datetime) -> Progress | None:
    """The job's Progress with its work on the on-demand offer it was quoted against (`on_demand_h`, as the guard
    measures it), else on the fastest of the on-demand `offers`; None without a deadline. A round's offers are its
    idle agents': were no on-demand agent idle, the work would look endless and every deadline lost."""
    if item.spec.deadline is None:
        return None
    on_demand_h = item.on_demand_h
    if on_demand_h is None:  # a quote's item: priced on the offers (a transformer's layout search, so only then)
        od = [exclusive_hours(item.spec, o) for o in offers if o.tier == Tier.on_demand]
        on_demand_h = min(od, default=float("inf")) / item.speed
    return progress_of(item, on_demand_h, item.submitted_at or now, now)


def starts_on_demand(
    spec: JobSpec,
    offers: list[Offer],
    now: datetime,
    unsure: float,
    speed: float = 1.0,
    on_demand_h: float | None = None,
) -> bool:
    """Whether the rule puts a new job on on-demand at once, whatever spot there is: its window does not hold the
    safety net with the reserve (`unsure`, PlanItem.unsure) for a speed not yet measured (expected at `speed` over
    the estimate), the work taking `on_demand_h` at the estimate on the on-demand offer it is quoted against (else
    on the fastest of `offers`). A quote then says so: the spot offer the money model chose is not where it starts."""
    progress = _new_job_progress(spec, offers, now, unsure, speed, on_demand_h)
    return progress is not None and decide(progress, None, spot_available=True) == Move.on_demand


def holds_reserve(
    spec: JobSpec,
    offers: list[Offer],
    now: datetime,
    unsure: float,
    speed: float = 1.0,
    on_demand_h: float | None = None,
) -> bool:
    """Whether a new job's window holds its work on on-demand with the reserve for a speed not yet measured (the
    arguments as starts_on_demand's) and the safety net's two changeovers: the rule would not start it on on-demand
    at once, nor lose the deadline at the estimate (then it runs the job cheapest: no reserve is held there)."""
    progress = _new_job_progress(spec, offers, now, unsure, speed, on_demand_h)
    if progress is None:
        return True
    return progress.slack_h() >= 0 and decide(progress, None, spot_available=True) != Move.on_demand


def _new_job_progress(spec, offers, now, unsure, speed, on_demand_h) -> Progress | None:
    od_h = on_demand_h / speed if on_demand_h is not None else None
    item = PlanItem(id=spec.name, spec=spec, submitted_at=now, unsure=unsure, speed=speed, on_demand_h=od_h)
    return progress_on(item, [o for o in offers if fits(spec, o)] if od_h is None else [], now)  # od_h: unread


@register("uniform-progress")
class UniformProgress(CheapestFeasible):
    """Can't Be Late's Uniform Progress as a placement policy: spot when there is some, on-demand when behind."""

    name = "uniform-progress"
    uniform = True
    rule = "uniform"
    # each round it places a job by its rule (spot_in_time), whatever tier the quote chose: quotes play the same
    spot_while_in_time = True

    def plan(self, items: list[PlanItem], offers: list[Offer], capacity: dict[str, int], now: datetime) -> Plan:
        """Place each job (in the given order, lost deadlines last) on the cheapest fitting spot offer,
        or on-demand when behind."""
        left = {o.id: capacity.get(o.id, 10**9) for o in offers}
        plan = Plan(policy=self.name)
        fit_by_kind: dict[str, list[Offer]] = {}
        for item in items:
            if fit_key(item.spec) not in fit_by_kind:
                fit_by_kind[fit_key(item.spec)] = [o for o in offers if fits(item.spec, o)]

        def late(item: PlanItem) -> bool:
            progress = progress_on(item, fit_by_kind[fit_key(item.spec)], now)
            return progress is not None and progress.planned_last()

        for item in sorted(items, key=late):  # stable: the given order otherwise
            fitting = [o for o in fit_by_kind[fit_key(item.spec)] if left[o.id] > 0]
            od = [o for o in fitting if o.tier == Tier.on_demand]
            progress = progress_on(item, fitting, now)
            fallback = functools.partial(on_demand_option, item, od, progress, now)  # priced only when it ranks
            spot = spot_in_time(item, [o for o in fitting if o.tier != Tier.on_demand], progress, fallback)
            if progress is None:
                move = Move.spot if spot else Move.on_demand
            else:
                move = self.idle_move(item, progress, bool(spot), now)
            if move == Move.spot and spot:
                chosen = spot[0]
            elif move == Move.on_demand and od:  # priced only when chosen: most jobs take spot or wait
                chosen = on_demand_in_time(item, od, progress, now)
            else:
                plan.unplaced[item.id] = Unplaced.capacity if move != Move.wait else Unplaced.waiting
                continue
            plan.assignments[item.id] = chosen.id
            left[chosen.id] -= 1
        return plan

    def idle_move(self, item: PlanItem, progress: Progress, spot_available: bool, now: datetime) -> Move:
        """What a job without a run does now: the rule's choice (`decide`)."""
        return decide(progress, None, spot_available, self.uniform)

    def leaves_on_demand(
        self, item: PlanItem, progress: Progress, spot: Offer, on_demand: Offer, now: datetime
    ) -> bool:
        """Whether a job running on on-demand goes back to `spot` (an idle spot or bubble agent that fits it) `now`:
        once it is past ep(t + 2d), as the paper's rule; Greedy never leaves (on-demand only at its safety net)."""
        return self.uniform and decide(progress, Tier.on_demand, spot_available=True) == Move.spot

    def leaves_on_demand_to_wait(self, item: PlanItem, progress: Progress, now: datetime) -> bool:
        """Whether a job running on on-demand, with no idle spot agent to go to, goes back to the queue to wait for
        spot: the paper's rule once it is past ep(t + 2d) (`decide` says wait), where the rule would then have it wait
        (`idle_move`); the work it puts off can run on spot that frees up before it falls behind. Greedy never
        leaves."""
        return (
            self.uniform
            and decide(progress, Tier.on_demand, spot_available=False) == Move.wait
            and self.idle_move(item, progress, False, now) == Move.wait
        )

    def moves_zone(self, item: PlanItem, progress: Progress, now_on: Offer, there: Offer) -> bool:
        """Whether a job running on spot moves to `there`, a cheaper idle spot agent: not under this rule (a job on
        spot stays until preempted)."""
        return False


@register("cbl-greedy")
class GreedySafetyNet(UniformProgress):
    """Can't Be Late's Greedy: spot whenever there is some, else wait; on-demand only at the safety net."""

    name = "cbl-greedy"
    uniform = False
    rule = "greedy"
