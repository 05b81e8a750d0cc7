"""Can't Be Late's single-job setting (NSDI'24) on its own traces, so our figures sit beside the paper's.

One job of 48 hours of work, a deadline 52 or 70 hours after it starts, a changeover of 0.2 hours
at every start, progress kept across a preemption (a checkpoint on the notice), AWS p3.2xlarge at
the catalog's spot and on-demand prices. The job starts every `stride_h` hours over the evaluation
part of the traces (their last half by default); the market model the hedge rule decides from is
learned from the first part only, so no rule sees the future it is judged on. Each rule is the one
quotes simulate (models/futures.py; `uniform` is the server's guard, step for step); the truth is the
traces' availability at the decision tick. Settings: each zone alone (the paper's setup), and all
zones at once (a job may launch in any, the cheapest with capacity first). The bound per window is
Can't Be Late's omniscient program, solved exactly (sim/omniscient.cheapest_by_steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from broker.core.hedging import hedge_for
from broker.models.futures import Hedge, Setting, simulate
from broker.pricing.availability import MarketModel
from broker.pricing.catalog import PriceCatalog
from broker.pricing.traces import load_traces
from broker.sim.market import SpotSeries, from_traces, trace_start
from broker.sim.omniscient import cheapest_by_steps

WORK_H = 48.0
RESTART_H = 0.2
DEADLINES_H = (52.0, 70.0)
TICK_S = 360.0  # 0.1 h: the changeover is two ticks
RULES = ("greedy", "uniform", "hedge", "cost-to-go")


@dataclass(frozen=True)
class Zones:
    """Spot zones (cheapest first) with their availability over the whole trace, and the on-demand price."""

    names: list[str]
    spot_prices: tuple[float, ...]
    od_price: float
    available: np.ndarray  # zones x ticks


def zones_of(series: list[SpotSeries], od_price: float) -> Zones:
    ordered = sorted(series, key=lambda s: (s.offer.price_usd_per_h, s.offer.id))
    ticks = min(len(s.capacity) for s in ordered)
    return Zones(
        [s.offer.zone or s.offer.region for s in ordered],
        tuple(s.offer.price_usd_per_h for s in ordered),
        od_price,
        np.stack([s.capacity[:ticks] > 0 for s in ordered]),
    )


def planned(zones: Zones, hedge: Hedge, tick_h: float) -> Hedge:
    """The hedge view with cost-to-go's moves for the longest deadline, priced at the cheapest zone: the moves
    depend on the time left, not on the clock, so one table serves every deadline (it was solved for each)."""
    return hedge.planned(int(round(max(DEADLINES_H) / tick_h)), zones.spot_prices[0], zones.od_price, RESTART_H)


def play(
    zones: Zones, starts: np.ndarray, window_h: float, tick_h: float, hedge: Hedge
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Each rule's cost per start, on-demand's and the omniscient bound's; and where each missed the deadline.
    `hedge`: the view with cost-to-go's table (`planned`)."""
    ticks = int(round(window_h / tick_h))
    available = np.stack([zones.available[:, s : s + ticks] for s in starts], axis=1)  # zones x starts x ticks
    out: dict[str, np.ndarray] = {}
    missed = {}
    for rule in RULES:
        setting = Setting(
            WORK_H, WORK_H, zones.spot_prices, zones.od_price, RESTART_H, 0.0, None, window_h, rule, keeps_progress=True
        )
        if rule == "cost-to-go":  # its moves keep the one changeover a preemption needs: the net only backs them up
            setting = replace(setting, net_changeovers=1)
        result = simulate(setting, available, tick_h, hedge if rule in ("hedge", "cost-to-go") else None)
        out[rule] = result.cost_usd
        missed[rule] = result.finish_h > window_h + 1e-9
    out["on-demand"] = np.full(len(starts), (WORK_H + RESTART_H) * zones.od_price)
    prices = np.array([*zones.spot_prices, zones.od_price])
    with_od = np.concatenate([available, np.ones((1, *available.shape[1:]), dtype=bool)]).transpose(1, 0, 2)
    work, restart = int(round(WORK_H / tick_h)), int(round(RESTART_H / tick_h))
    out["omniscient"] = cheapest_by_steps(prices, with_od, work, restart, tick_h)
    return out, missed


def run(traces: Path, fit_share: float = 0.5, stride_h: float = 6.0, prices_dir: Path | None = None) -> list[dict]:
    """One row per (setting, deadline, policy): mean cost, savings vs on-demand, misses, cost / omniscient, and
    how much cheaper than Uniform Progress in one zone (the paper's baseline): over all zones' windows together,
    and for each zone alone against Uniform Progress there (the range over zones: what "up to" figures compare)."""
    catalog = PriceCatalog.from_snapshot(prices_dir)
    market = from_traces(traces, catalog, trace_start(traces), TICK_S, spot_instances=1)
    tick_h = TICK_S / 3600
    model = MarketModel.fit([t.window(0.0, fit_share) for t in load_traces(traces)], TICK_S)
    od_price = min(o.price_usd_per_h for o in market.on_demand)
    everything = zones_of(market.spot, od_price)
    ticks = everything.available.shape[1]
    first = math.ceil(ticks * fit_share)
    alone_zones = [zones_of([s], od_price) for s in market.spot]
    alone_views = [planned(z, hedge_for(model, [s.offer], tick_h), tick_h) for z, s in zip(alone_zones, market.spot)]
    together_view = planned(everything, hedge_for(model, [s.offer for s in market.spot], tick_h), tick_h)
    rows = []
    for window_h in DEADLINES_H:
        starts = np.arange(first, ticks - int(round(max(DEADLINES_H) / tick_h)), int(round(stride_h / tick_h)))
        single = [play(z, starts, window_h, tick_h, view) for z, view in zip(alone_zones, alone_views)]
        alone = tuple({k: np.concatenate([r[i][k] for r in single]) for k in single[0][i]} for i in (0, 1))
        together = play(everything, starts, window_h, tick_h, together_view)
        baseline = float(np.mean(alone[0]["uniform"]))
        for setting, (costs, missed) in (("1 zone", alone), (f"{len(market.spot)} zones", together)):
            bound = float(np.mean(costs["omniscient"]))
            for policy, cost in costs.items():
                mean = float(np.mean(cost))
                rows.append(
                    {
                        "setting": setting,
                        "deadline_h": window_h,
                        "windows": len(cost),
                        "policy": policy,
                        "mean_cost_usd": round(mean, 2),
                        "savings_pct": round(100 * (1 - mean / float(np.mean(costs["on-demand"]))), 1),
                        "vs_uniform_1_zone_pct": round(100 * (1 - mean / baseline), 1),
                        # per zone, against Uniform Progress in that zone: the least and the most it saves
                        "vs_uniform_zone_range_pct": _zone_range(single, policy) if setting == "1 zone" else None,
                        "cost_vs_omniscient": round(mean / bound, 3),
                        # the worst window: what a randomised rule (ROSS) bounds, where the mean shows the typical
                        "worst_vs_omniscient": round(float(np.max(cost / costs["omniscient"])), 3),
                        "deadline_misses": int(missed[policy].sum()) if policy in missed else 0,
                    }
                )
    return rows


def _zone_range(single: list, policy: str) -> list[float]:
    """The least and the most `policy` saves in one zone against Uniform Progress in that zone, in percent."""
    per_zone = [100 * (1 - np.mean(costs[policy]) / np.mean(costs["uniform"])) for costs, _missed in single]
    return [round(float(min(per_zone)), 1), round(float(max(per_zone)), 1)]
