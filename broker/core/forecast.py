"""Quotes by simulation: the chosen option played out by the policy's rule on futures of the market model.

The policy picks an option with the analytic money model (fast enough to price millions of pairs);
the forecast then says what that choice may really cost: it samples `futures` availability paths
of every spot zone the job may launch in (pricing/availability.py, learned from the traces), runs
the job through the policy's rule on each (models/futures.py: waits, launches, preemptions, lost
work, the guard's move to on-demand) and reports percentiles and odds.

The broker's own fleet is part of the market a job meets (`Fleet`): its agents are the capacity it can
dispatch to, so a zone with an agent now has spot now and one without has none, and the other active jobs
hold slots for the hours they have left (models/contention.py), so the job starts where one is free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np

from broker.core.hedging import MAX_ZONES, MarketHedge
from broker.domain.model import Forecast, IfLate, Job, JobSpec, Offer, Quote, Tier, tier_of
from broker.models.accounting import productive_hours, spend_usd
from broker.models.contention import arrivals, launchable
from broker.models.futures import HEDGING, ON_DEMAND_NOW, Setting, simulate
from broker.models.placement import transfer_usd
from broker.models.risk import (
    SPEED_PRIOR_SIGMA,
    as_fast,
    changeover_hours,
    checkpoint_hours,
    exclusive_hours,
    fits,
    lost_per_preemption_h,
    notice_loss_h,
    restart_hours,
    unmeasured_margin,
    window_hours,
    young_interval_h,
)
from broker.planning.option_table import MIN_MEASURED_H, PlanItem, measured_speed, work_left
from broker.planning.uniform_progress import progress_on, spot_in_time
from broker.pricing.availability import MarketModel

FUTURES = 1000
SPEED_PRIOR_JOBS = 5  # the prior weighs as much as this many finished jobs' measured speeds
NO_DEADLINE_H = 7 * 24.0  # horizon of a job without a deadline
ARRIVALS_H = 24.0  # the recent submissions whose rate and kind say what will arrive


@dataclass(frozen=True)
class Fleet:
    """The broker's own capacity at quote time: live agents per offer id, and per other active job that may use
    spot or bubble capacity, where it holds a slot (the offer it runs on, or while it waits the ones it may use) and
    the hours it has left."""

    agents: dict[str, int] = field(default_factory=dict)
    others: list[tuple[frozenset[str], float]] = field(default_factory=list)
    speed_sigma: float = SPEED_PRIOR_SIGMA  # spread (log) of the true speed over the estimate (speed_spread)
    arrivals_per_h: float = 0.0  # jobs submitted per hour lately
    # per job submitted lately that may use spot: the offer ids it may use, hours held, hours to its deadline
    arrived: list[tuple[frozenset[str], float, float]] = field(default_factory=list)

    @classmethod
    def of(cls, agents: list, jobs: list[Job], now: datetime, recent: list[Job] = ()) -> Fleet:
        """From the live agents (AgentInfo), the active jobs and the newest ones (`recent`); a job pinned to or
        running on on-demand holds no spot slot. The estimate's error is learned from every job whose speed was
        measured (speed_spread), running or done: a run's rate counts after its first half hour of progress
        (option_table.measured_speed), so quotes learn it hours before the first jobs finish. The jobs to come are
        like those submitted in the last ARRIVALS_H hours: their rate (from the first of them to now) and kind."""
        count: dict[str, int] = {}
        for agent in agents:
            count[agent.offer.id] = count.get(agent.offer.id, 0) + 1
        others = [(_holds(job), work_left(job) * job.quote.chosen.expected_wall_h) for job in jobs if _on_spot(job)]
        seen = {job.id: job for job in [*recent, *jobs]}  # a job both recent and active counts once
        sigma = speed_spread([v for v in map(measured_speed, seen.values()) if v is not None])
        lately = [j for j in recent if j.submitted_at >= now - timedelta(hours=ARRIVALS_H)]
        span_h = (now - min((j.submitted_at for j in lately), default=now)).total_seconds() / 3600
        rate = (len(lately) - 1) / span_h if len(lately) >= 2 and span_h > 0 else 0.0
        arrived = [
            (_zones(j), j.quote.chosen.expected_wall_h, window_hours(j.spec, j.submitted_at))
            for j in lately
            if j.quote.chosen.offer.tier != Tier.on_demand
        ]
        return cls(count, others, sigma, rate, arrived)

    def slots(self, zones: list[Offer]) -> np.ndarray | None:
        """Slots per zone while up: its agents now, or for a zone with none now the most any of them has;
        None when the fleet has no agent in any of them (nothing known: capacity is not the limit)."""
        now = np.asarray([self.agents.get(o.id, 0) for o in zones])
        if now.sum() == 0:
            return None
        return np.where(now > 0, now, now.max())

    def arriving(self, zones: list[Offer], tick_h: float, ticks: int, futures: int, rng, window_h: float):
        """Slots held per future and tick in `zones`, ahead of a job due in `window_h`, by jobs still to arrive: at
        the rate jobs came lately, like those of them that may use one of the zones (models/contention.arrivals);
        None when none is expected."""
        ids = {o.id for o in zones}
        like = [(held, due) for offers, held, due in self.arrived if offers & ids]
        if not like or self.arrivals_per_h <= 0:
            return None
        held, due = (np.asarray(x, dtype=float) for x in zip(*like))
        per_tick = self.arrivals_per_h * tick_h * len(like) / len(self.arrived)
        hold_ticks = np.maximum(1, np.ceil(held / tick_h)).astype(int)
        return arrivals(rng, futures, ticks, per_tick, hold_ticks, due / tick_h, window_h / tick_h)

    def free(self, zones: list[Offer], available: np.ndarray, tick_h: float, rng, window_h: float) -> np.ndarray:
        """Where a slot is free for the job (zones x futures x ticks) once the other jobs and those to come take
        theirs, each tier apart: a job that runs only on spot holds no bubble (contention.launchable fills the
        cheapest zones first, and bubbles are free)."""
        free = available.copy()
        _, futures, ticks = available.shape
        for tier in sorted({o.tier for o in zones}):
            rows = [i for i, o in enumerate(zones) if o.tier == tier]
            group = [zones[i] for i in rows]
            slots = self.slots(group)
            if slots is not None:
                coming = self.arriving(group, tick_h, ticks, futures, rng, window_h)
                pinned, pooled = self.held(group, tick_h, ticks, pin=tier == Tier.bubble)
                free[rows] = launchable(available[rows], slots, pooled, coming, pinned)
        return free

    def held(self, zones: list[Offer], tick_h: float, ticks: int, pin: bool) -> tuple[np.ndarray, np.ndarray]:
        """The slots other jobs hold in `zones`: with `pin` (bubbles: no market takes them back), per zone and tick
        those of the jobs running there (one offer each); and the ticks each other job still holds one of them (at
        least one), the cheapest free: on spot, a run preempted in its zone starts again in the cheapest with room."""
        ids = [o.id for o in zones]
        pinned, pooled, known = np.zeros((len(zones), ticks)), [], set(ids)
        for offers, hours in self.others:
            if not offers & known:
                continue
            held = max(1, math.ceil(hours / tick_h))
            if pin and len(offers) == 1:
                pinned[ids.index(next(iter(offers))), :held] += 1
            else:
                pooled.append(held)
        return pinned, np.asarray(pooled, dtype=int)


@dataclass(frozen=True)
class Underway:
    """Where a job under way stands, for its outlook (Broker.outlook): the share of its work left, its speed over the
    estimate once measured (None: not yet), the productive hours it has run, what it has cost so far, and the offer
    its run under way runs on (None: none runs)."""

    left: float
    speed: float | None
    run_h: float
    spent_usd: float
    on: Offer | None = None

    @classmethod
    def of(cls, job: Job, now: datetime) -> Underway:
        run = job.current_run
        on = run.offer if run is not None and run.started_at is not None else None
        return cls(work_left(job), measured_speed(job), productive_hours(job, now), spend_usd(job, now), on)

    def running_on(self, zones: list[Offer]) -> int | None:
        """Where the futures find it (Setting.running_on): on-demand, one of their zones, or nowhere."""
        if self.on is None:
            return None
        if self.on.tier == Tier.on_demand:
            return ON_DEMAND_NOW
        return next((i for i, o in enumerate(zones) if o.id == self.on.id), None)


def speed_spread(speeds: list[float]) -> float:
    """The log sd of true speed over the estimate: the prior, pooled with the measured speeds' own spread as jobs
    finish (its weight SPEED_PRIOR_JOBS against n - 1 for n measured). A quote made before any job finished is
    as unsure of the speed as an untested performance model is; one made after many says what they showed."""
    logs = np.log(np.asarray(speeds, dtype=float))
    squares = float(np.sum((logs - logs.mean()) ** 2)) if len(logs) >= 2 else 0.0
    weight = max(len(logs) - 1, 0)
    return math.sqrt((SPEED_PRIOR_JOBS * SPEED_PRIOR_SIGMA**2 + squares) / (SPEED_PRIOR_JOBS + weight))


def _on_spot(job: Job) -> bool:
    """Whether an active job may hold a spot or bubble slot (not pinned to or running on on-demand)."""
    run = job.current_run
    return not (job.state.terminal or job.pinned_tier == Tier.on_demand or (run and run.offer.tier == Tier.on_demand))


def _zones(job: Job) -> frozenset[str]:
    """The offers a job may run in: its forecast's zones of its chosen tier where it has some (a fill job waiting for a
    bubble is on spot only when none frees up: 51 h on spot against 2,955 h in bubbles in the 12 backtests of
    bench/results/forecast.md), else all of them (or its chosen offer), and where it runs now."""
    zones = job.quote.forecast.zones if job.quote.forecast else [job.quote.chosen.offer.id]
    offers = {z for z in zones if tier_of(z) == job.quote.chosen.offer.tier} or set(zones)
    if job.current_run is not None:
        offers.add(job.current_run.offer.id)
    return frozenset(offers)


def _holds(job: Job) -> frozenset[str]:
    """Where a job holds a slot: the offer it runs on; while it waits, any of those it may launch in."""
    return frozenset({job.current_run.offer.id}) if job.current_run is not None else _zones(job)


def zones_for(spec: JobSpec, chosen: Offer, offers: list[Offer], ceiling_usd_per_h: float) -> list[Offer]:
    """The offers of the chosen one's tier a job may launch in, then and after each preemption: every one it fits
    that is cheaper than its fallback, no further from its data and at least as fast for it (the policies take the
    cheapest with room, wherever it is, and the guard moves a job only where it keeps its pace; the futures play the
    chosen one's speed, so an 8x A100 zone is not one for a job chosen on 8x H200), cheapest first, at most
    MAX_ZONES. Every bubble it fits is one, however fast: the policies take any free bubble (free work), and the
    guard moves the job off one where it falls behind."""
    moving = transfer_usd(spec, chosen)
    same = [
        o
        for o in offers
        if o.tier == chosen.tier
        and o.id != chosen.id
        and fits(spec, o)
        and o.price_usd_per_h < ceiling_usd_per_h
        and transfer_usd(spec, o) <= moving  # no further from its data
        and (as_fast(spec, o, chosen) or o.tier == Tier.bubble)
    ]
    return sorted([chosen, *same], key=lambda o: (o.price_usd_per_h, o.id))[:MAX_ZONES]


def zones_in_time(
    spec: JobSpec,
    chosen: Offer,
    offers: list[Offer],
    ceiling_usd_per_h: float,
    now: datetime,
    underway: Underway | None = None,
):
    """The offers a policy that places a job every round by Uniform Progress's rule may give it, whatever tier its
    quote chose: those `spot_in_time` keeps at quote time (every bubble it fits, and every spot offer on which it
    could still finish in time uninterrupted: the work `underway` has left, at its speed once measured), cheaper by
    the hour than its fallback and no further from its data than the chosen one, cheapest work first, at most
    MAX_ZONES. The futures play each at its own pace."""
    fitting = [o for o in offers if fits(spec, o)]
    left, speed = (underway.left, underway.speed or 1.0) if underway else (1.0, 1.0)
    item = PlanItem(id=spec.name, spec=spec, submitted_at=now, remaining=left, speed=speed)
    moving = transfer_usd(spec, chosen)
    spot = [
        o
        for o in fitting
        if o.tier != Tier.on_demand and o.price_usd_per_h < ceiling_usd_per_h and transfer_usd(spec, o) <= moving
    ]
    return spot_in_time(item, spot, progress_on(item, fitting, now))[:MAX_ZONES]


def forecast(
    spec: JobSpec,
    quote: Quote,
    offers: list[Offer],
    model: MarketModel,
    rule: str,
    now: datetime,
    futures: int = FUTURES,
    seed: int = 0,
    fleet: Fleet | None = None,
    hedges: MarketHedge | None = None,
    spot_while_in_time: bool = False,
    underway: Underway | None = None,
    measures_on_spot: bool = False,
) -> Forecast:
    """The quote's chosen option on `futures` sampled futures of its zones (an offer without traces is modelled
    from its own hazard and availability, which the catalog's hazard model set), against the other jobs of
    `fleet` where it has agents in those zones. `hedges` gives the hedge rule's view of the zones and the cost-to-go
    moves (core/hedging.MarketHedge: the Broker's keeps them; one of its own on `model` when not given).
    `spot_while_in_time`: the policy places the job every round by its rule (Uniform Progress's family), so it
    runs on the spot and bubble offers still in time (`zones_in_time`) even where the quote chose on-demand, with
    that on-demand offer as its fallback. `underway`: the job's outlook from where it stands now (the work left, at its
    speed once measured, with what it has spent; every future finds it where its run under way runs, without the
    changeover a start pays). `measures_on_spot`: the job may measure its speed on spot (Forecast.measures_on_spot)."""
    chosen = quote.chosen.offer
    fallback = quote.chosen.fallback or (quote.on_demand_baseline.offer if quote.on_demand_baseline else None)
    window = window_hours(spec, now)
    rng = np.random.default_rng(seed)
    # each future's true speed over the estimate (median 1), spread as finished jobs showed, or the prior's
    sigma = (fleet or Fleet()).speed_sigma
    speed = np.exp(rng.normal(0.0, sigma, futures)) if sigma > 0 else np.ones(1)
    if underway is not None and underway.speed is not None:  # measured: the futures differ only in the market
        sigma, speed = 0.0, np.array([underway.speed])
    left = underway.left if underway else 1.0
    spent = underway.spent_usd if underway else transfer_usd(spec, chosen)  # its input moved where it starts
    if chosen.tier == Tier.on_demand:
        fallback = chosen
    od_offer = fallback or chosen
    ceiling = od_offer.price_usd_per_h if fallback else float("inf")
    zones = zones_in_time(spec, chosen, offers, ceiling, now, underway) if spot_while_in_time else []
    if not zones and chosen.tier == Tier.on_demand:
        return _on_demand(spec, quote, chosen, now, speed, sigma, left, spent)
    zones = zones or zones_for(spec, chosen, offers, ceiling)
    played = chosen if chosen in zones else zones[0]  # the offer whose speed and hazard the futures are told in
    tick_h = model.tick_h
    horizon_h = window if math.isfinite(window) else NO_DEADLINE_H
    ticks = max(1, math.ceil(horizon_h / tick_h))
    zone_models = [model.for_offer(o) for o in zones]
    slots = fleet.slots(zones) if fleet else None
    up_now = [None] * len(zones) if slots is None else [fleet.agents.get(o.id, 0) > 0 for o in zones]
    available = np.stack([z.sample(rng, futures, ticks, up, shrinks=True) for z, up in zip(zone_models, up_now)])
    free = None if slots is None else fleet.free(zones, available, tick_h, rng, window)
    work_h = exclusive_hours(spec, played)
    measured = underway is not None and underway.speed is not None
    setting = Setting(
        work_h=work_h * left / speed,
        od_work_h=exclusive_hours(spec, od_offer) * left / speed,
        # the rule sees the estimate, with the margin of a speed not yet measured, until the job has run long
        # enough for its speed to be measured (as the live guard: PlanItem.unsure)
        od_estimate_h=None if measured else exclusive_hours(spec, od_offer) * left,
        unmeasured_margin=unmeasured_margin(sigma, spec.deadline_probability),
        measured_after_h=max(0.0, MIN_MEASURED_H - (underway.run_h if underway else 0.0)),
        measures_on_spot=measures_on_spot,
        spot_prices=tuple(o.price_usd_per_h for o in zones),
        od_price=od_offer.price_usd_per_h,
        restart_h=restart_hours(spec),
        changeover_h=changeover_hours(spec),  # as the live guard counts it (uniform_progress.progress_of)
        checkpoint_h=checkpoint_hours(spec),
        interval_h=young_interval_h(checkpoint_hours(spec), played.hazard_per_h, work_h),  # as the agents run it
        notice_h=notice_loss_h(spec, played),  # the agents checkpoint on the cloud's notice
        window_h=window,
        rule=rule if fallback is not None else "spot-only",
        cheapest_if_late=spec.if_late == IfLate.cheapest,
        zone_pace=tuple(exclusive_hours(spec, o) / work_h for o in zones),
        running_on=underway.running_on(zones) if underway else None,
    )
    hedge = None
    if setting.rule in HEDGING:
        hedges = hedges or MarketHedge(lambda: model, lambda: offers)
        hedge = hedges.for_zones(zones)
        if setting.rule == "cost-to-go":  # the table's work is in spot ticks; on-demand does od_speed of them a tick
            od_speed = work_h / exclusive_hours(spec, od_offer)
            loss_h = lost_per_preemption_h(setting.interval_h, setting.notice_h)
            hedge = hedges.planned(zones, ticks, setting.od_price, setting.counted_h, od_speed, loss_h)
    out = simulate(setting, available, tick_h, hedge, launchable=free)
    cost = out.cost_usd + spent
    forecast = _summary(spec, now, cost, out.finish_h, out.spot_h, out.od_h, setting.rule, zones, zone_models)
    note = f"; chosen on {chosen.tier.value}, run on {played.tier.value} whenever in time" if played != chosen else ""
    forecast = forecast.model_copy(update={"measures_on_spot": measures_on_spot})
    return _with_speed(forecast, forecast.evidence + note, speed, sigma)


def _on_demand(
    spec: JobSpec, quote: Quote, offer: Offer, now: datetime, speed: np.ndarray, sigma: float, left: float, spent: float
) -> Forecast:
    """On-demand: no market randomness; the money model's time and cost for the share of the work `left`, at each
    future's speed, after what was `spent` (the input's move, paid once at any speed, at submit)."""
    option = quote.chosen
    wall = option.expected_wall_h * left / speed
    cost = (option.expected_cost_usd - transfer_usd(spec, offer)) * left / speed + spent
    forecast = _summary(spec, now, cost, wall, np.zeros_like(wall), wall, "on-demand", [offer], [])
    return _with_speed(forecast, "on-demand: always available", speed, sigma)


def _with_speed(forecast: Forecast, evidence: str, speed: np.ndarray, sigma: float) -> Forecast:
    """The forecast with the speed spread its futures were sampled with: told in its evidence, and kept for the
    guard's reserve while the job's speed is unmeasured (PlanItem.unsure)."""
    if len(speed) > 1:
        evidence += (
            f"; speed off the estimate by {np.std(np.log(speed)):.2f} (log sd: the prior with finished jobs' speeds)"
        )
    return forecast.model_copy(update={"evidence": evidence, "speed_sigma": sigma})


def _summary(spec, now, cost, finish, spot_h, od_h, rule, zones, zone_models) -> Forecast:
    window = window_hours(spec, now)
    met = finish <= window + 1e-9 if math.isfinite(window) else np.isfinite(finish)
    within = cost <= spec.budget_usd + 1e-9 if spec.budget_usd is not None else np.ones_like(cost, dtype=bool)

    def when(q: float) -> datetime | None:
        h = float(np.percentile(finish, q, method="higher"))  # no interpolation between inf and a number
        return now + timedelta(hours=h) if math.isfinite(h) else None

    total = spot_h + od_h
    share = float(np.mean(np.where(total > 0, spot_h / np.maximum(total, 1e-12), 0.0)))
    p10, p50, p90 = (float(np.percentile(cost, q)) for q in (10, 50, 90))
    return Forecast(
        futures=len(cost),
        rule=rule,
        zones=[o.id for o in zones],
        cost_p10_usd=round(p10, 4),
        cost_p50_usd=round(p50, 4),
        cost_p90_usd=round(p90, 4),
        cost_mean_usd=round(float(cost.mean()), 4),
        cost_spread_pct=round(100 * float(np.median(np.abs(cost / p50 - 1))), 2) if p50 > 0 else 0.0,
        finish_p50=when(50),
        finish_p90=when(90),
        finish_at_odds=when(100 * spec.deadline_probability) if math.isfinite(window) else None,
        p_meet_deadline=round(float(met.mean()), 4),
        p_within_budget=round(float(within.mean()), 4),
        spot_share=round(share, 4),
        evidence=zone_models[0].evidence if zone_models else "",
    )
