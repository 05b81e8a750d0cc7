"""The omniscient bound: Can't Be Late's ILP for one job on the known future, with every offer of the market.

Per tick t and offer o: u[o,t] (binary) the job holds an instance of o during the tick, f[o,t] the
billed share of the tick (<= u; the last tick before the deadline is partial), x[o,t] >= u[o,t] -
u[o,t-1] a changeover paying the restart time d. At most one offer per tick; spot only where its
trace has capacity; the work done, sum (f dt - d x) / exclusive_h(o), must reach the whole job by the
deadline; minimise sum price(o) f dt. Every schedule the backtest can run for the job on time is a
feasible point (its runs start on ticks, finish anywhere, pay d at each start and more for checkpoints
and lost work), so the optimum is a lower bound on the job's cost under any policy. Capacity shared
with other jobs is ignored: per job, the bound only gets lower. Solved with PuLP (HiGHS); when the MIP
is not proved optimal within the time limit, HiGHS's dual bound is used (still a lower bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pulp

from broker.domain.model import JobSpec, Offer, Tier
from broker.models.risk import exclusive_hours, fits, restart_hours
from broker.sim.market import Market

MIP_GAP = 1e-6


@dataclass(frozen=True)
class Bound:
    cost_usd: float
    status: str  # "optimal", "dual bound" (time limit hit: the solver's proven bound), or "infeasible"
    tier_hours: dict[str, float]


def _candidates(
    spec: JobSpec, market: Market, start_tick: int, ticks: int, bubbles: bool, speed: float
) -> list[tuple[Offer, list[bool]]]:
    """Offers worth a variable: spot offers with their availability, those of equal price and speed merged
    into one available when any of them is (moving between them then costs no restart: the bound only gets
    lower, and the program several times smaller); on-demand and bubble offers, always available, only the
    cheapest per hour of work (a dearer one of the same kind never helps)."""
    out, merged = [], {}
    for series in market.spot:
        if fits(spec, series.offer):
            available = np.array([series.at(start_tick + t) > 0 for t in range(ticks)])
            key = (series.offer.price_usd_per_h, exclusive_hours(spec, series.offer) / speed)
            merged[key] = (merged[key][0], merged[key][1] | available) if key in merged else (series.offer, available)
    out = [(offer, available.tolist()) for offer, available in merged.values() if available.any()]
    for group in (market.on_demand, market.bubbles if bubbles else []):
        fitting = [o for o in group if fits(spec, o)]
        if fitting:
            best = min(fitting, key=lambda o: (o.price_usd_per_h * exclusive_hours(spec, o), exclusive_hours(spec, o)))
            out.append((best, [True] * ticks))
    return out


def omniscient(
    spec: JobSpec,
    window_h: float,
    market: Market,
    start_tick: int,
    bubbles: bool = True,
    time_limit_s: float = 5.0,
    speed: float = 1.0,
) -> Bound:
    """The least cost of finishing the job within `window_h` of tick `start_tick`, knowing every trace and the
    job's true `speed` (the same truth the backtest's fleet runs it at)."""
    dt = market.tick_s / 3600
    ticks = max(1, math.ceil(window_h / dt - 1e-9))
    last_share = window_h / dt - (ticks - 1)
    offers = _candidates(spec, market, start_tick, ticks, bubbles, speed)
    d = restart_hours(spec)
    prob = pulp.LpProblem("omniscient", pulp.LpMinimize)
    u, f, x = {}, {}, {}
    for k, (_offer, available) in enumerate(offers):
        for t in range(ticks):
            if available[t]:
                u[k, t] = prob.add_variable(f"u_{k}_{t}", cat=pulp.LpBinary)
                f[k, t] = prob.add_variable(f"f_{k}_{t}", 0, last_share if t == ticks - 1 else 1)
                x[k, t] = prob.add_variable(f"x_{k}_{t}", 0)
                prob += f[k, t] <= u[k, t]
                prob += x[k, t] >= u[k, t] - u.get((k, t - 1), 0)
    prob += pulp.lpSum(offers[k][0].price_usd_per_h * dt * var for (k, _), var in f.items())
    for t in range(ticks):
        here = [u[k, t] for k in range(len(offers)) if (k, t) in u]
        if len(here) > 1:
            prob += pulp.lpSum(here) <= 1
    prob += pulp.lpSum((dt * f[k, t] - d * x[k, t]) * speed / exclusive_hours(spec, offers[k][0]) for (k, t) in f) >= 1
    prob.solve(pulp.HiGHS(msg=False, timeLimit=time_limit_s, gapRel=MIP_GAP))
    if pulp.LpStatus[prob.status] == "Infeasible" or not f:
        return Bound(math.inf, "infeasible", {})
    info = prob.solverModel.getInfo()
    proved = info.mip_gap <= 10 * MIP_GAP or info.mip_gap != info.mip_gap  # NaN: solved at the root
    hours: dict[str, float] = {tier.value: 0.0 for tier in Tier}
    for (k, _), var in f.items():
        hours[offers[k][0].tier.value] += dt * (var.value() or 0.0)
    cost = float(pulp.value(prob.objective) or 0.0) if proved else float(info.mip_dual_bound)
    return Bound(cost, "optimal" if proved else "dual bound", hours)
