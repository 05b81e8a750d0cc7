"""A job's cost and finish on sampled futures of spot capacity, run by the rule its policy follows.

The analytic money model (models/risk.py) assumes spot can always be launched and preemptions
are a constant-rate Poisson process; the traces say neither. Here the job is played out tick by
tick on each of many availability futures (one bool array per zone: futures x ticks), sampled
from the market model for a quote or cut from the traces for a backtest, the way the broker runs it:
- on spot: progress at 1 / (work_h x the zone's pace) per hour (a bubble or a slower GPU takes longer), less
  the checkpoint writes (delta every Young interval tau); when the zone loses capacity the run is preempted
  and the work since its last checkpoint is lost, at most the notice's lead where the job checkpoints on the
  cloud's notice (`notice_h`, as the agents do; none with `keeps_progress`, Can't Be Late's assumption);
- every start, on spot or on-demand, pays the changeover d before progress;
- the safety net of Can't Be Late (time left < on-demand work left + 2d, d a changeover as the live guard counts
  it: `Setting.changeover_h`): on-demand to the end; with
  `cheapest_if_late` (the spec's `if_late: cheapest`) a lost deadline (even on-demand from now misses it) runs
  cheapest instead: spot whenever a zone has a slot, on-demand while none has, left for spot as the rule leaves it;
  with `late_window_h` (the spec's `if_late: extend`) a lost deadline gets its second window instead, the rule run
  to it as to the first (each future's own window from the tick it lost the first), and cheapest once that is lost;
- near the net, a run on spot that a preemption would put past it (the work since its last checkpoint is more
  than the slack left) checkpoints now, pays the write and runs on (planning/uniform_progress.checkpoint_due, the
  live guard's request); within the guard's pass of the net (a tick; the live pass where the cloud's notice
  bounds the loss, `Setting.pass_h`) it goes to on-demand instead;
  at the horizon (the deadline) the rest is priced on on-demand;
- the rule decides on the estimate's work, keeping the live guard's reserve for a speed not yet measured
  (Progress.unsure_h), until the job has run long enough for its speed to be measured (Setting.believed_od_h), and
  on the future's true work after: a quote's futures know their speed no sooner than the guard does. A job within
  the net only by that reserve goes to on-demand, not to the end: once its speed is measured the rule may leave;
- what an idle job does, and when it leaves on-demand, is the rule's (each one a policy's):
  `greedy` waits for spot; `uniform` is Uniform Progress exactly as planning/uniform_progress.decide
  runs it (on-demand when idle and behind ep(t), back once ahead of ep(t + 2d), to spot or, with none free, to
  wait for it); `hedge` waits out
  the short no-capacity spells and pays on-demand through the long ones, the split set by what the
  market model says of spell lengths (Hedge below), and moves as `uniform` does while other jobs hold
  the capacity there is; `spot-only` (SkyPilot's managed spot) has no guard.
Launches go to the first (cheapest) zone with capacity; a move to a cheaper zone goes only where the job keeps
its pace. All futures advance together (numpy over the futures axis): 1,000 futures of a few hundred ticks
take tens of milliseconds. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from broker.models.cost_to_go import IDLE
from broker.models.cost_to_go import OD as MOVE_OD
from broker.models.cost_to_go import SPOT as MOVE_SPOT
from broker.models.hedge_view import Hedge

RULES = ("greedy", "uniform", "hedge", "cost-to-go", "spot-only")
HEDGING = ("hedge", "cost-to-go")  # the rules that read the market (Hedge): zone moves, queues, spot worth
WAIT, SPOT, OD, DONE = 0, 1, 2, 3
ON_DEMAND_NOW = -1  # Setting.running_on: the job runs on on-demand now
TIE_H = 1e-9  # exactly on a threshold is not past it (planning/uniform_progress.TIE_H)


@dataclass(frozen=True)
class Setting:
    """One job on spot zones with an on-demand fallback, in hours and USD per hour."""

    work_h: float | np.ndarray  # exclusive hours on the spot offers (one per future: a speed spread)
    od_work_h: float | np.ndarray  # exclusive hours on the on-demand fallback
    spot_prices: tuple[float, ...]  # per zone, in the order the zones' futures are given (cheapest first)
    od_price: float
    restart_h: float  # d: a new instance and the restore (paid at every start)
    checkpoint_h: float  # delta: one checkpoint write
    interval_h: float | None  # tau: hours of progress between checkpoints (None: no checkpoints)
    window_h: float  # hours to the deadline (inf: none)
    rule: str = "greedy"
    keeps_progress: bool = False  # a preemption loses no work
    # a preemption loses at most this: the job checkpoints on the cloud's notice (risk.notice_loss_h); None: no notice
    notice_h: float | None = None
    cheapest_if_late: bool = False  # a lost deadline runs cheapest, not on on-demand to the end
    # if_late: extend: where a lost deadline's second window ends (hours from now; the horizon), run to by the rule
    late_window_h: float | None = None
    net_changeovers: int = 2  # the safety net keeps this many changeovers (Can't Be Late's 2d; cost-to-go keeps 1)
    # per zone, its exclusive hours over work_h's (a bubble or a slower GPU: more than 1); empty: all 1
    zone_pace: tuple[float, ...] = ()
    # what the rule counts a changeover as in its margins: the live guard's (uniform_progress.progress_of: the
    # restart and the instance's start-up), which the futures do not pay as dead time; None: restart_h
    changeover_h: float | None = None
    # what the rule believes the on-demand work is until the job has run `measured_after_h` productive hours (its
    # speed measured: planning/option_table.measured_speed): the estimate, `od_estimate_h`, with
    # `unmeasured_margin` of it in reserve (the live guard's PlanItem.unsure); None: the rule knows od_work_h
    od_estimate_h: float | None = None
    unmeasured_margin: float = 0.0
    measured_after_h: float = 0.0
    # the quote found the deadline's odds hold with the speed measured on spot (Forecast.measures_on_spot): the
    # reserve sends the job to on-demand only while it waits with no spot free, not off spot or from a start there
    measures_on_spot: bool = False
    # where the job runs now (an outlook of a job under way): the zone's index, ON_DEMAND_NOW for on-demand; None:
    # nowhere yet, so it starts by the rule and pays the changeover
    running_on: int | None = None
    # the live guard's pass (seconds apart: core/server.GUARD_EVERY_S) where the cloud's notice bounds what a
    # preemption loses (`notice_h`): the net keeps that, not a tick, off on-demand; None: a tick, as in the
    # simulated world, whose server looks once a tick
    pass_h: float | None = None

    @property
    def counted_h(self) -> float:
        """A changeover as the rule counts it (changeover_h, else the restart paid)."""
        return self.restart_h if self.changeover_h is None else self.changeover_h

    def believed_od_h(self, run_h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the whole work on on-demand as the rule believes it, the share more it keeps in reserve) per future,
        after `run_h` productive hours: the estimate and its margin until the speed is measured, then the truth."""
        if self.od_estimate_h is None:
            return np.broadcast_to(self.od_work_h, run_h.shape), np.zeros_like(run_h)
        measured = run_h >= self.measured_after_h - TIE_H
        return np.where(measured, self.od_work_h, self.od_estimate_h), np.where(measured, 0.0, self.unmeasured_margin)


def simulate(
    setting: Setting,
    available: np.ndarray,
    tick_h: float,
    hedge: Hedge | None = None,
    launchable: np.ndarray | None = None,
) -> Outcomes:
    """Play the job out on `available` (zones x futures x ticks, bool: a run there survives the tick); the horizon
    is the ticks given. `launchable` (same shape) is where the job can start or move to: a slot free for it where
    other jobs hold some of the capacity, and a zone whose pool took back the job's instance as it shrank, still up
    (a run lost there may start again at once); `available` everywhere when not given."""
    s = setting
    if s.rule not in RULES:
        raise ValueError(f"rule: {s.rule!r}; one of {', '.join(RULES)}")
    if s.rule in HEDGING and hedge is None:
        raise ValueError(f"rule {s.rule!r} needs the market's Hedge (Hedge.from_spells)")
    if s.rule == "cost-to-go" and hedge.plan is None:
        raise ValueError("rule 'cost-to-go' needs the Hedge's moves (Hedge.planned)")
    zones, n, ticks = available.shape
    prices = np.asarray(s.spot_prices, dtype=float)
    pace = np.asarray(s.zone_pace or (1.0,) * zones, dtype=float)
    state = np.full(n, WAIT if s.running_on is None else OD if s.running_on == ON_DEMAND_NOW else SPOT)
    zone = np.full(n, max(s.running_on or 0, 0), dtype=int)
    done = np.zeros(n)  # share of the work done (0-1), checkpointed or not
    saved = np.zeros(n)  # share of the work in the newest checkpoint
    dead = np.zeros(n)  # hours of changeover still to pay before progress
    down_age = up_age = 0  # ticks since no zone had capacity, since some zone had
    waited = np.zeros(n, dtype=int)  # ticks the job has been idle
    run_h = np.zeros(n)  # productive hours run so far (after changeovers): what the job's speed is measured over
    cost, spot_h, od_h = np.zeros(n), np.zeros(n), np.zeros(n)
    preemptions = np.zeros(n, dtype=int)
    finish = np.full(n, math.inf)
    writes = 1 + (s.checkpoint_h / s.interval_h if s.interval_h else 0.0)  # wall hours per hour of spot progress
    guard = s.rule != "spot-only" and math.isfinite(s.window_h)
    window = np.full(n, s.window_h)  # each future's: the first, or the second once it lost the first (late_window_h)
    pass_h = s.pass_h if s.pass_h is not None and s.notice_h is not None else tick_h  # the guard's pass
    idx = np.arange(n)
    for t in range(ticks):
        now = t * tick_h
        up = available[:, :, t]  # zones x futures
        free = up if launchable is None else launchable[:, :, t]
        any_up = free.any(axis=0)
        down_age = np.where(any_up, 0, down_age + 1)
        up_age = np.where(any_up, up_age + 1, 0)
        hold = np.zeros(n, dtype=bool)  # waits although a slot is free (a spell too young to pay a start)
        lost = (state == SPOT) & ~up[zone, idx]
        preemptions += lost
        done = np.where(lost, saved, done)  # preempted: back to the last checkpoint
        state = np.where(lost, WAIT, state)
        waited = np.where(state == WAIT, waited + 1, 0)  # ticks idle, as the live rule counts from idle_since
        believed_h, unsure = s.believed_od_h(run_h)
        if guard and s.late_window_h is not None:
            window = np.where(_lost(s, window, now, done, believed_h, state), s.late_window_h, window)
        left_h = (1 - done) * believed_h * (1 + unsure)  # the on-demand work left the rule keeps time for
        slack = window - now - left_h - 2 * s.counted_h  # what it can lose beyond that and the net's 2d
        if guard:
            margin = s.net_changeovers * s.counted_h
            # off on-demand the net keeps the guard's pass more: a preemption before it looks again (Progress.pass_h);
            # a waiting job also the restart a start on spot pays before its first step (Progress.start_h)
            exposed = np.where(state == OD, 0.0, pass_h + np.where(state == WAIT, s.restart_h, 0.0))
            exposed = exposed if not s.keeps_progress else 0.0
            held = (state != DONE) & (window - now < left_h + margin + exposed - TIE_H)
            net = held & (window - now < (1 - done) * believed_h + margin + exposed - TIE_H)
            # within the net only by the reserve for a speed not yet measured: on-demand until it is measured, then
            # the rule may leave (the live guard pins it there only while its Progress says so)
            reserved = held & ~net
            late = np.zeros(n, dtype=bool)
            if s.cheapest_if_late:  # lost even on on-demand: runs cheapest below, not on on-demand to the end
                late = net & _lost(s, window, now, done, believed_h, state)
                net &= ~late
            # on-demand to the end: a running job is checkpointed first, a waiting one resumes from its checkpoint
            kept = np.where(state == WAIT, saved, done)
            hours = np.where(state == OD, dead, s.restart_h) + (1 - kept) * s.od_work_h
            finish = np.where(net, now + hours, finish)
            cost = np.where(net, cost + s.od_price * hours, cost)
            od_h = np.where(net, od_h + hours, od_h)
            state = np.where(net, DONE, state)
            if not s.keeps_progress:  # near the net, a checkpoint now keeps a preemption from crossing it
                unsaved_h = (done - saved) * believed_h
                margin_h = window - now - left_h - margin
                due = (state == SPOT) & (margin_h >= pass_h - TIE_H) & (margin_h < unsaved_h + pass_h - TIE_H)
                due &= unsaved_h > s.checkpoint_h
                saved = np.where(due, done, saved)
                dead = np.where(due, dead + s.checkpoint_h, dead)
            if s.rule == "cost-to-go":
                ages = np.where(any_up, up_age, down_age) - 1
                moves = _planned_moves(s, hedge, now, tick_h, window, done, dead, state, any_up, up.any(axis=0), ages)
                to_od, leave_od, hold = moves
            else:
                to_od, leave_od = _rule_moves(
                    s,
                    hedge,
                    now,
                    window,
                    done,
                    slack,
                    state,
                    any_up,
                    up.any(axis=0),
                    waited,
                    zone,
                    prices,
                    0.0 if s.keeps_progress else pass_h,
                )
            if late.any():
                to_od, leave_od = _cheapest_moves(s, hedge, late, state, any_up, zone, prices, to_od, leave_od)
            kept_off = (state == WAIT) & ~any_up if s.measures_on_spot else (state == WAIT) | (state == SPOT)
            to_od = to_od | (reserved & kept_off)  # new arrays: a rule's may be one
            leave_od = leave_od & ~reserved
            saved = np.where(leave_od, done, saved)  # on-demand is left at a checkpoint
            state = np.where(leave_od, WAIT, state)
            dead = np.where(to_od, s.restart_h, dead)
            state = np.where(to_od, OD, state)
        if s.rule in HEDGING and zones > 1:
            move = _cheaper_zone(s, hedge, done, slack, state, free & (pace[:, None] <= pace[zone]), zone, prices)
            saved = np.where(move, done, saved)  # a voluntary move checkpoints first
            state = np.where(move, WAIT, state)
        launch = (state == WAIT) & any_up & ~hold
        zone = np.where(launch, np.argmax(free, axis=0), zone)
        dead = np.where(launch, s.restart_h, dead)
        state = np.where(launch, SPOT, state)
        running = (state == SPOT) | (state == OD)
        if not running.any():
            if (state == DONE).all():
                break
            continue
        on_od = state == OD
        paid = np.minimum(dead, tick_h)
        per_h = np.where(on_od, 1.0, writes)  # on-demand is not preempted: no periodic checkpoints
        progress_h = (tick_h - paid) / per_h  # hours of exclusive progress this tick
        whole_h = np.where(on_od, s.od_work_h, s.work_h * pace[zone])  # the whole work where it runs
        need_h = (1 - done) * whole_h
        finishing = running & (progress_h >= need_h - TIE_H)  # float sums of ticks: within TIE_H is done
        used = np.where(finishing, paid + need_h * per_h, tick_h)
        price = np.where(on_od, s.od_price, prices[zone])
        cost = np.where(running, cost + price * used, cost)
        spot_h = np.where(running & ~on_od, spot_h + used, spot_h)
        od_h = np.where(on_od, od_h + used, od_h)
        finish = np.where(finishing, now + used, finish)
        new_done = np.where(running, np.minimum(1.0, done + progress_h / whole_h), done)
        if s.keeps_progress:
            saved = new_done
        else:
            if s.interval_h:
                step = s.interval_h / whole_h  # share of the work between checkpoints
                periodic = np.floor(new_done / step + 1e-9) * step
                saved = np.where(running & ~on_od, np.maximum(saved, periodic), saved)
            if s.notice_h is not None:  # a preemption now would keep all but the notice's lead
                saved = np.where(running & ~on_od, np.maximum(saved, new_done - s.notice_h / whole_h), saved)
        saved = np.where(on_od, new_done, saved)
        done = new_done
        dead = np.where(running, dead - paid, dead)
        run_h = np.where(running, run_h + used - paid, run_h)
        state = np.where(finishing, DONE, state)
        if (state == DONE).all():
            break
    # on on-demand at the horizon, or a lost deadline run cheapest (guarded jobs do not wait past it): on-demand
    rest = (state == OD) | (guard & (state != DONE))
    hours = np.where(state == OD, dead, s.restart_h) + (1 - done) * s.od_work_h
    finish = np.where(rest, ticks * tick_h + hours, finish)
    cost = np.where(rest, cost + s.od_price * hours, cost)
    od_h = np.where(rest, od_h + hours, od_h)
    return Outcomes(cost, finish, spot_h, od_h, preemptions)


def _rule_moves(
    s: Setting, hedge: Hedge | None, now, window, done, slack, state, any_up, market_up, waited, zone, prices, pass_h
):
    """(to on-demand, leave on-demand) per future under the rule, after the safety net. `slack`: hours the job can
    still lose beyond the on-demand work the rule keeps time for and the net's 2d; `any_up`: a slot free for
    the job in some zone; `market_up`: some zone has capacity (free or held by other jobs); `pass_h`: what the net
    keeps off on-demand for the guard's next pass."""
    idle = (state == WAIT) & ~any_up
    nothing = np.zeros_like(idle)

    # on on-demand past ep(t + 2d): back to spot, or, with none free, to wait for it (Can't Be Late's rule;
    # planning/uniform_progress.leaves_on_demand_to_wait)
    ahead = (state == OD) & ~_behind(s, now + 2 * s.counted_h, window, done)
    if s.rule == "uniform":
        return idle & _behind(s, now, window, done), ahead
    if s.rule != "hedge":
        return nothing, nothing
    longest_wait = hedge.longest_wait(slack, (1 - done) * s.work_h, s.counted_h, _zone_up(hedge, zone))
    worth = hedge.spot_worth(s.od_price, prices[zone], s.counted_h)
    back = (state == OD) & any_up & worth & (slack >= s.counted_h + pass_h)  # as planning/hedge.leaves_on_demand
    queued = idle & market_up  # other jobs hold the capacity: Uniform Progress's move (planning/hedge.py)
    # as Uniform Progress, where it would then wait: a queue, or a gap it waits out a tick of at least, counted from
    # the leave (planning/hedge.leaves_on_demand_to_wait)
    waits = ahead & ~any_up & (market_up | (longest_wait >= 1))
    return (queued & _behind(s, now, window, done)) | (idle & ~market_up & (waited > longest_wait)), back | waits


def _cheapest_moves(s: Setting, hedge: Hedge | None, late, state, any_up, zone, prices, to_od, leave_od):
    """A lost deadline run cheapest (planning/uniform_progress.decide): idle without a slot, on-demand; on on-demand
    with a slot, back to spot (under hedge when a spell there pays the changeovers; Greedy never leaves)."""
    to_od = np.where(late, (state == WAIT) & ~any_up, to_od)
    back = (state == OD) & any_up
    if s.rule in HEDGING:
        back &= hedge.spot_worth(s.od_price, prices[zone], s.counted_h)
    return to_od, np.where(late, back if s.rule != "greedy" else False, leave_od)


def _behind(s: Setting, at_h: float, window: np.ndarray, done: np.ndarray) -> np.ndarray:
    """done < ep(at): behind Uniform Progress's line to each future's `window`, as planning/uniform_progress.decide
    has it."""
    expected = np.where(window > 0, np.minimum(1.0, at_h / np.maximum(window, TIE_H)), 1.0)
    return done * s.od_work_h < expected * s.od_work_h - TIE_H


def _lost(s: Setting, window: np.ndarray, now: float, done, believed_h, state) -> np.ndarray:
    """Per future, whether even on-demand from now (after a changeover, unless on it) misses `window`
    (uniform_progress.Progress.lost)."""
    changeover = np.where(state == OD, 0.0, s.counted_h)
    return (state != DONE) & (window - now < (1 - done) * believed_h + changeover - TIE_H)


def _planned_moves(
    s: Setting, hedge: Hedge, now: float, tick_h: float, window, done, dead, state, any_up, market_up, ages
):
    """(to on-demand, leave on-demand, hold) per future, from the cost-to-go moves: the state is the ticks left, the
    work left in spot ticks (with the changeover still to pay), a slot free or not and for how long, and the tier.
    In a queue (capacity there, held by other jobs) it takes Uniform Progress's move, as hedge does."""
    od_speed = hedge.plan.od_speed
    on = np.select([state == SPOT, state == OD], [MOVE_SPOT, MOVE_OD], IDLE)
    paying = np.where(state == OD, od_speed, 1.0) * np.where((state == SPOT) | (state == OD), dead, 0.0)
    work = ((1 - done) * s.work_h + paying) / tick_h
    move = hedge.plan.move(np.round((window - now) / tick_h), work, any_up, ages, on)
    idle = state == WAIT
    to_od = (idle | (state == SPOT)) & (move == MOVE_OD)
    to_od = np.where(idle & ~any_up & market_up, _behind(s, now, window, done), to_od)
    return to_od, (state == OD) & any_up & (move == MOVE_SPOT), idle & any_up & (move == IDLE)


def _cheaper_zone(s: Setting, hedge: Hedge, done, slack, state, up, zone, prices) -> np.ndarray:
    """Runs on spot that should move to the cheapest zone with capacity (Hedge.zone_move_worth)."""
    best = np.argmax(up, axis=0)
    left_h = (1 - done) * s.work_h
    worth = hedge.zone_move_worth(prices[zone], prices[best], _zone_up(hedge, best), left_h, slack, s.counted_h)
    return (state == SPOT) & up.any(axis=0) & worth


def _zone_up(hedge: Hedge, zone: np.ndarray):
    """The mean up-spell of each future's zone (the market's as a whole without per-zone figures)."""
    return np.asarray(hedge.zone_up_h)[zone] if hedge.zone_up_h else hedge.mean_up_h


@dataclass(frozen=True)
class Outcomes:
    """Per future: what the job cost, when it finished (hours from now; inf if not by the horizon), the hours it
    ran on spot and on-demand, and the runs spot took back (a zone's capacity gone, or its pool's shrink)."""

    cost_usd: np.ndarray
    finish_h: np.ndarray
    spot_h: np.ndarray
    od_h: np.ndarray
    preemptions: np.ndarray
