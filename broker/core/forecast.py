"""Quotes by simulation: the chosen option played out by the policy's rule on futures of the market model.

The policy picks an option with the analytic money model (fast enough to price millions of pairs);
the forecast then says what that choice may really cost: it samples `futures` availability paths
of every spot zone the job may launch in (pricing/availability.py, learned from the traces), runs
the job through the policy's rule on each (models/futures.py: waits, launches, preemptions, lost
work, the guard's move to on-demand) and reports percentiles and odds.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import numpy as np

from broker.domain.model import Forecast, JobSpec, Offer, Quote, Tier
from broker.models.futures import Setting, simulate
from broker.models.risk import checkpoint_hours, exclusive_hours, fits, restart_hours, window_hours, young_interval_h
from broker.pricing.availability import MarketModel

FUTURES = 1000
MAX_ZONES = 12  # offers the job may launch in
NO_DEADLINE_H = 7 * 24.0  # horizon of a job without a deadline


def zones_for(spec: JobSpec, chosen: Offer, offers: list[Offer], ceiling_usd_per_h: float) -> list[Offer]:
    """The offers of the chosen one's tier a job may launch in, then and after each preemption: every one it fits
    that is cheaper than its fallback (the policies take the cheapest with room, wherever it is), cheapest
    first, at most MAX_ZONES."""
    same = [
        o
        for o in offers
        if o.tier == chosen.tier and o.id != chosen.id and fits(spec, o) and o.price_usd_per_h < ceiling_usd_per_h
    ]
    return sorted([chosen, *same], key=lambda o: (o.price_usd_per_h, o.id))[:MAX_ZONES]


def forecast(
    spec: JobSpec,
    quote: Quote,
    offers: list[Offer],
    model: MarketModel,
    rule: str,
    now: datetime,
    futures: int = FUTURES,
    seed: int = 0,
) -> Forecast:
    """The quote's chosen option on `futures` sampled futures of its zones (an offer without traces is modelled
    from its own hazard and availability, which the catalog's hazard model set)."""
    chosen = quote.chosen.offer
    fallback = quote.chosen.fallback or (quote.on_demand_baseline.offer if quote.on_demand_baseline else None)
    window = window_hours(spec, now)
    if chosen.tier == Tier.on_demand:
        return _certain(spec, quote, chosen, now, window)
    od_offer = fallback or chosen
    zones = zones_for(spec, chosen, offers, od_offer.price_usd_per_h if fallback else float("inf"))
    tick_h = model.tick_h
    horizon_h = window if math.isfinite(window) else NO_DEADLINE_H
    ticks = max(1, math.ceil(horizon_h / tick_h))
    rng = np.random.default_rng(seed)
    zone_models = [model.for_offer(o) for o in zones]
    available = np.stack([z.sample(rng, futures, ticks) for z in zone_models])
    work_h = exclusive_hours(spec, chosen)
    setting = Setting(
        work_h=work_h,
        od_work_h=exclusive_hours(spec, od_offer),
        spot_prices=tuple(o.price_usd_per_h for o in zones),
        od_price=od_offer.price_usd_per_h,
        restart_h=restart_hours(spec),
        checkpoint_h=checkpoint_hours(spec),
        interval_h=young_interval_h(checkpoint_hours(spec), chosen.hazard_per_h, work_h),  # as the agents run it
        window_h=window,
        rule=rule if fallback is not None else "spot-only",
    )
    out = simulate(setting, available, tick_h)
    return _summary(spec, now, out.cost_usd, out.finish_h, out.spot_h, out.od_h, setting.rule, zones, zone_models)


def _certain(spec: JobSpec, quote: Quote, offer: Offer, now: datetime, window: float) -> Forecast:
    """On-demand: no market randomness; the money model's time and cost are the forecast."""
    option = quote.chosen
    met = 1.0 if option.expected_wall_h <= window else 0.0
    within = 1.0 if spec.budget_usd is None or option.expected_cost_usd <= spec.budget_usd else 0.0
    finish = now + timedelta(hours=option.expected_wall_h)
    cost = option.expected_cost_usd
    return Forecast(
        futures=1,
        rule="on-demand",
        zones=[offer.id],
        cost_p10_usd=cost,
        cost_p50_usd=cost,
        cost_p90_usd=cost,
        cost_mean_usd=cost,
        finish_p50=finish,
        finish_p90=finish,
        p_meet_deadline=met,
        p_within_budget=within,
        spot_share=0.0,
        evidence="on-demand: always available",
    )


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
        finish_p50=when(50),
        finish_p90=when(90),
        p_meet_deadline=round(float(met.mean()), 4),
        p_within_budget=round(float(within.mean()), 4),
        spot_share=round(share, 4),
        evidence=zone_models[0].evidence,
    )
