"""Quotes by simulation: the chosen option played out by the policy's rule on futures of the market model.

The policy picks an option with the analytic money model (fast enough to price millions of pairs);
the forecast then says what that choice may really cost: it samples `futures` availability paths
of every spot zone the job may launch in (pricing/availability.py, learned from the traces), runs
the job through the policy's rule on each (models/futures.py: waits, launches, preemptions, lost
work, the guard's move to on-demand) and reports percentiles and odds.

The broker's own fleet is part of the market a job meets (core/fleet.Fleet): its agents are the capacity it can
dispatch to, so a zone with an agent now has spot now and one without has none, and the other active jobs
hold slots for the hours they have left (models/contention.py), so the job starts where one is free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
from scipy.special import ndtri

from broker.core.fleet import Fleet, SpeedPrior
from broker.core.hedging import MAX_ZONES, MarketHedge
from broker.domain.figures import spend_usd
from broker.domain.model import Forecast, IfLate, IfOverBudget, Job, JobSpec, Option, Quote, Tier
from broker.domain.offer import Offer
from broker.domain.rounding import up_to_cent
from broker.models.fit import fits
from broker.models.futures import HEDGING, ON_DEMAND_NOW, Outcomes, Setting, simulate
from broker.models.placement import transfer_usd
from broker.models.risk import (
    as_fast,
    changeover_hours,
    checkpoint_hours,
    evaluate,
    exclusive_hours,
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
NO_DEADLINE_H = 7 * 24.0  # horizon of a job without a deadline


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
    submitted_at: datetime | None = None  # when it came: its window's length (if_late: extend's second window)

    @classmethod
    def of(cls, job: Job, now: datetime) -> Underway:
        run = job.current_run
        on = run.offer if run is not None and run.started_at is not None else None
        return cls(
            work_left(job), measured_speed(job), job.productive_hours(now), spend_usd(job, now), on, job.submitted_at
        )

    def running_on(self, zones: list[Offer]) -> int | None:
        """Where the futures find it (Setting.running_on): on-demand, one of their zones, or nowhere."""
        if self.on is None:
            return None
        if self.on.tier == Tier.on_demand:
            return ON_DEMAND_NOW
        return next((i for i, o in enumerate(zones) if o.id == self.on.id), None)


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
    expected_speed: float = 1.0,
    fallback: Offer | None = None,
    speed_sigma: float = 0.0,
):
    """The offers a policy that places a job every round by Uniform Progress's rule may give it, whatever tier its
    quote chose: those `spot_in_time` keeps at quote time (every bubble it fits, and every spot offer on which it
    could still finish in time uninterrupted: the work `underway` has left, at its speed once measured, else at the
    `expected_speed` over the estimate, spread by `speed_sigma`: 0 once measured), cheaper by the hour than its
    fallback and no further from its data than the chosen one, cheapest work first (with what falling back to the
    `fallback` on-demand offer may add), at most MAX_ZONES. The futures play each at its own pace."""
    fitting = [o for o in offers if fits(spec, o)]
    left = underway.left if underway else 1.0
    speed = underway.speed if underway and underway.speed is not None else expected_speed
    item = PlanItem(id=spec.name, spec=spec, submitted_at=now, remaining=left, speed=speed, speed_sigma=speed_sigma)
    moving = transfer_usd(spec, chosen)
    spot = [
        o
        for o in fitting
        if o.tier != Tier.on_demand and o.price_usd_per_h < ceiling_usd_per_h and transfer_usd(spec, o) <= moving
    ]

    def reserve() -> Option | None:  # what a zone whose window runs out falls back to, for their cost (spot_in_time)
        return evaluate(spec, fallback, now, left) if fallback is not None else None

    return spot_in_time(item, spot, progress_on(item, fitting, now), reserve)[:MAX_ZONES]


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
    pass_h: float | None = None,
) -> Forecast:
    """The quote's chosen option on `futures` sampled futures of its zones (an offer without traces is modelled
    from its own hazard and availability, which the catalog's hazard model set), against the other jobs of
    `fleet` where it has agents in those zones. `hedges` gives the hedge rule's view of the zones and the cost-to-go
    moves (core/hedging.MarketHedge: the Broker's keeps them; one of its own on `model` when not given).
    `spot_while_in_time`: the policy places the job every round by its rule (Uniform Progress's family), so it
    runs on the spot and bubble offers still in time (`zones_in_time`) even where the quote chose on-demand, with
    that on-demand offer as its fallback. `underway`: the job's outlook from where it stands now (the work left, at its
    speed once measured, with what it has spent; every future finds it where its run under way runs, without the
    changeover a start pays). `measures_on_spot`: the job may measure its speed on spot (Forecast.measures_on_spot).
    `pass_h`: the time between the guard's passes where the job runs (Setting.pass_h; None: a tick, as simulated)."""
    chosen = quote.chosen.offer
    fallback = quote.chosen.fallback or (quote.on_demand_baseline.offer if quote.on_demand_baseline else None)
    window = window_hours(spec, now)
    rng = np.random.default_rng(seed)
    # each future's true speed over the estimate: spread as the fleet's measured jobs showed (or the prior), about
    # what its name's earlier jobs showed where repeats hold (Fleet.speed_prior), else about what its kind of
    # estimate's measured jobs showed (1 until some are)
    prior = (fleet or Fleet()).speed_prior(spec)
    sigma = prior.sigma
    speed = prior.median * (np.exp(sigma * _stratified_normal(rng, futures)) if sigma > 0 else np.ones(1))
    if underway is not None and underway.speed is not None:  # measured: the futures differ only in the market
        sigma, speed = 0.0, np.array([underway.speed])
        prior = SpeedPrior(underway.speed, 0.0, 0)
    left = underway.left if underway else 1.0
    spent = underway.spent_usd if underway else transfer_usd(spec, chosen)  # its input moved where it starts
    if chosen.tier == Tier.on_demand:
        fallback = chosen
    od_offer = fallback or chosen
    ceiling = od_offer.price_usd_per_h if fallback else float("inf")
    zones = (
        zones_in_time(spec, chosen, offers, ceiling, now, underway, prior.median, fallback, sigma)
        if spot_while_in_time
        else []
    )
    if not zones and chosen.tier == Tier.on_demand:
        there = underway is not None and underway.on is not None and underway.on.tier == Tier.on_demand
        return _on_demand(spec, chosen, now, speed, sigma, left, spent, prior, 0.0 if there else restart_hours(spec))
    zones = zones or zones_for(spec, chosen, offers, ceiling)
    played = chosen if chosen in zones else zones[0]  # the offer whose speed and hazard the futures are told in
    tick_h = model.tick_h
    second_h = None  # if_late: extend: where a lost deadline's second window ends, from now (the first's length on)
    if spec.if_late == IfLate.extend and math.isfinite(window):
        second_h = window + window_hours(spec, underway.submitted_at if underway and underway.submitted_at else now)
    horizon_h = second_h if second_h is not None else window if math.isfinite(window) else NO_DEADLINE_H
    ticks = max(1, math.ceil(horizon_h / tick_h))
    zone_models = [model.for_offer(o) for o in zones]
    slots = fleet.slots(zones) if fleet else None
    up_now = [None] * len(zones) if slots is None else [fleet.agents.get(o.id, 0) > 0 for o in zones]
    # each zone's futures go on from the spell our fleet saw it in, as long as that has lasted
    up = np.stack([z.sample(rng, futures, ticks, state, aged=True) for z, state in zip(zone_models, up_now)])
    available = _taken_back(rng, up, zone_models)
    urgency = spec.urgency(underway.submitted_at if underway and underway.submitted_at else now)
    free = up if slots is None else fleet.free(zones, up, tick_h, rng, window, urgency)
    work_h = exclusive_hours(spec, played)
    measured = underway is not None and underway.speed is not None
    setting = Setting(
        work_h=work_h * left / speed,
        od_work_h=exclusive_hours(spec, od_offer) * left / speed,
        # the rule sees the estimate, with the margin of a speed not yet measured, until the job has run long
        # enough for its speed to be measured (as the live guard: PlanItem.unsure)
        od_estimate_h=None if measured else exclusive_hours(spec, od_offer) * left / prior.median,
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
        cheapest_if_late=spec.if_late in (IfLate.cheapest, IfLate.extend),
        late_window_h=second_h,
        zone_pace=tuple(exclusive_hours(spec, o) / work_h for o in zones),
        running_on=underway.running_on(zones) if underway else None,
        pass_h=pass_h,
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
    forecast = _summary(spec, now, cost, out, setting.rule, zones, zone_models)
    note = f"; chosen on {chosen.tier.value}, run on {played.tier.value} whenever in time" if played != chosen else ""
    forecast = forecast.model_copy(update={"measures_on_spot": measures_on_spot})
    return _with_speed(forecast, forecast.evidence + note, speed, sigma, prior)


def _taken_back(rng: np.random.Generator, up: np.ndarray, zone_models) -> np.ndarray:
    """Where a run survives the tick (zones x futures x ticks): its zone up, and its instance not taken back as the
    pool shrinks (the zone's `shrink` a tick, as our fleet saw it). A pool that shrinks stays up: the job may start
    again there at once, where it has a slot (`up`, not this, is where it may launch)."""
    shrink = np.asarray([z.shrink for z in zone_models], dtype=float)
    if not shrink.any():
        return up
    return up & (rng.random(up.shape) >= shrink[:, None, None])


def _on_demand(
    spec: JobSpec,
    offer: Offer,
    now: datetime,
    speed: np.ndarray,
    sigma: float,
    left: float,
    spent: float,
    prior: SpeedPrior,
    start_h: float,
) -> Forecast:
    """On-demand: no market randomness; the share of the work `left` at each future's speed after a start of
    `start_h` (a new instance and the restore, as the futures on spot pay it: the same job costs the same on the same
    offer, played by the rule or not), after what was `spent` (the input's move, paid once at any speed, at submit)."""
    wall = start_h + exclusive_hours(spec, offer) * left / speed
    cost = offer.price_usd_per_h * wall + spent
    none = np.zeros_like(wall)
    forecast = _summary(spec, now, cost, Outcomes(cost, wall, none, wall, none), "on-demand", [offer], [])
    return _with_speed(forecast, "on-demand: always available", speed, sigma, prior)


def _with_speed(forecast: Forecast, evidence: str, speed: np.ndarray, sigma: float, prior: SpeedPrior) -> Forecast:
    """The forecast with the speed its futures were sampled at: told in its evidence, and kept for the guard (its
    median: the speed it plans with, and its spread: the reserve while the job's speed is unmeasured, PlanItem)."""
    if len(speed) > 1:
        evidence += (
            f"; speed off the estimate by {np.std(np.log(speed)):.2f} (log sd: the prior with its kind's measured jobs)"
        )
        if prior.runs:
            evidence += f", about {prior.median:.2f}x the estimate as {prior.runs} earlier job(s) of this name ran"
        elif prior.kind_runs and abs(prior.median - 1) >= 0.005:
            evidence += f", about {prior.median:.2f}x the estimate as {prior.kind_runs} measured job(s) of its kind ran"
    return forecast.model_copy(update={"evidence": evidence, "speed_sigma": sigma, "speed_median": prior.median})


def _summary(spec, now, cost, out: Outcomes, rule, zones, zone_models) -> Forecast:
    """The futures' `cost` (with what was spent before them) and `out` told as the quote shows them."""
    finish, spot_h, od_h = out.finish_h, out.spot_h, out.od_h
    window = window_hours(spec, now)
    met = finish <= window + 1e-9 if math.isfinite(window) else np.isfinite(finish)
    within = cost <= spec.budget_usd + 1e-9 if spec.budget_usd is not None else np.ones_like(cost, dtype=bool)
    capped = spec.if_over_budget == IfOverBudget.stop
    budget_at_odds = None
    if capped:  # a future over the budget ends there, unfinished (core/budget.py)
        needed = float(np.percentile(np.where(met, cost, math.inf), 100 * spec.deadline_probability, method="higher"))
        budget_at_odds = up_to_cent(needed) if math.isfinite(needed) else None
        cost, finish, met = np.minimum(cost, spec.budget_usd), np.where(within, finish, math.inf), met & within

    def when(q: float) -> datetime | None:
        h = float(np.percentile(finish, q, method="higher"))  # no interpolation between inf and a number
        return now + timedelta(hours=h) if math.isfinite(h) else None

    total = spot_h + od_h
    share = float(np.mean(np.where(total > 0, spot_h / np.maximum(total, 1e-12), 0.0)))
    p10, p50, p90 = (float(np.percentile(cost, q)) for q in (10, 50, 90))
    likely, likely_spread = likeliest(cost)
    return Forecast(
        futures=len(cost),
        rule=rule,
        zones=[o.id for o in zones],
        cost_p10_usd=round(p10, 4),
        cost_p50_usd=round(p50, 4),
        cost_p90_usd=round(p90, 4),
        cost_mean_usd=round(float(cost.mean()), 4),
        cost_spread_pct=round(100 * float(np.median(np.abs(cost / p50 - 1))), 2) if p50 > 0 else 0.0,
        cost_likely_usd=round(likely, 4),
        cost_likely_spread_pct=round(100 * likely_spread, 2),
        finish_p50=when(50),
        finish_p90=when(90),
        finish_at_odds=when(100 * spec.deadline_probability) if math.isfinite(window) else None,
        p_meet_deadline=round(float(met.mean()), 4),
        p_within_budget=round(float(within.mean()), 4),
        budget_capped=capped,
        budget_at_odds=budget_at_odds,
        spot_share=round(share, 4),
        preemptions_mean=round(float(out.preemptions.mean()), 2),
        evidence=zone_models[0].evidence if zone_models else "",
    )


def likeliest(cost: np.ndarray) -> tuple[float, float]:
    """(q, e): the cost q that half the futures lie within e of (|cost / q - 1| <= e), e the least: the middle of
    their narrowest half in relative width, (a + b) / 2 for the half from a to b, e = (b - a) / (a + b): no cost
    is a smaller median miss over the futures. Where they split into humps (spot held, a move to on-demand midway,
    on-demand early), the median may land on a thin hump or a hump's edge; this sits where most of them crowd."""
    x = np.sort(np.asarray(cost, dtype=float))
    half = (len(x) + 1) // 2
    a, b = x[: len(x) - half + 1], x[half - 1 :]
    width = np.where(a + b > 0, (b - a) / np.maximum(a + b, 1e-12), 0.0)
    i = int(np.argmin(width))
    return float((a[i] + b[i]) / 2), float(width[i])


def _stratified_normal(rng: np.random.Generator, n: int) -> np.ndarray:
    """n standard normals, one from each n-quantile in random order (Latin hypercube): where the speed decides the
    odds, independent draws moved them by a point between seeds and between an option and its alternatives."""
    return ndtri(latin_hypercube(rng, n))


def latin_hypercube(rng: np.random.Generator, n: int) -> np.ndarray:
    """n uniforms, one in each n-th of [0, 1), in random order: scipy's qmc.LatinHypercube(d=1, rng=rng).random(n)
    draw for draw (a child of `rng` shuffles the strata and places each point in its own), without importing
    scipy.stats (half a second of every `broker submit`)."""
    child = rng.spawn(1)[0]
    within = child.uniform(size=n)
    strata = np.arange(1, n + 1)
    child.shuffle(strata)
    return (strata - within) / n
