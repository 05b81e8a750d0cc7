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
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pulp

from broker.domain.model import JobSpec, Tier
from broker.models.fit import fits
from broker.models.risk import exclusive_hours, restart_hours
from broker.planning import highs
from broker.sim.market import Market

MIP_GAP = 1e-6


@dataclass(frozen=True)
class Bound:
    cost_usd: float
    status: str  # "optimal", "dual bound" (time limit hit: the solver's proven bound), or "infeasible"
    tier_hours: dict[str, float]


@dataclass(frozen=True)
class Choice:
    """One way to run the job: a price, the hours the whole job takes there, and when it can be had."""

    tier: str
    price_usd_per_h: float
    work_h: float
    available: np.ndarray  # bool per tick
    pool: tuple | None = None  # the capacity it draws on when jobs share the market (None: unlimited)


def _candidates(
    spec: JobSpec, market: Market, start_tick: int, ticks: int, bubbles: bool, speed: float
) -> list[Choice]:
    """Offers worth a variable: spot offers with their availability, those of equal price and speed merged
    into one available when any of them is (moving between them then costs no restart: the bound only gets
    lower, and the program several times smaller); on-demand and bubble offers, always available, only the
    cheapest per hour of work (a dearer one of the same kind never helps)."""
    merged: dict[tuple[float, float], Choice] = {}
    for series in market.spot:
        if fits(spec, series.offer):
            available = np.array([series.at(start_tick + t) > 0 for t in range(ticks)])
            work_h = exclusive_hours(spec, series.offer) / speed
            key = (series.offer.price_usd_per_h, work_h)
            if key in merged:
                available = available | merged[key].available
            merged[key] = Choice(Tier.spot.value, series.offer.price_usd_per_h, work_h, available)
    out = [c for c in merged.values() if c.available.any()]
    for group in (market.on_demand, market.bubbles if bubbles else []):
        out += _always(group, spec, speed, ticks)
    return out


def _always(offers: list, spec: JobSpec, speed: float, ticks: int) -> list[Choice]:
    """The one offer of `offers` (always available: on-demand, or bubbles with no capacity counted) that does the
    job's work cheapest, as a choice; none when nothing fits."""
    fitting = [o for o in offers if fits(spec, o)]
    if not fitting:
        return []
    best = min(fitting, key=lambda o: (o.price_usd_per_h * exclusive_hours(spec, o), exclusive_hours(spec, o)))
    return [Choice(best.tier.value, best.price_usd_per_h, exclusive_hours(spec, best) / speed, np.ones(ticks, bool))]


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
    choices = _candidates(spec, market, start_tick, ticks, bubbles, speed)
    return cheapest(choices, restart_hours(spec), window_h, dt, time_limit_s)


def _job(
    prob: pulp.LpProblem, tag: str, choices: list[Choice], restart_h: float, window_h: float, dt: float, binary: bool
) -> dict[tuple[int, int], tuple]:
    """One job's part of Can't Be Late's program in `prob`: per choice and tick it can be had, u (holds an
    instance; binary, or relaxed to the billed share itself) and f (the billed share of the tick, <= u; the last
    tick before the deadline is partial), a changeover x >= u[t] - u[t-1] paying `restart_h`; at most one
    choice a tick; the work done, sum (f dt - d x) / work_h, reaches the whole job. Returns {(k, t): (u, f)}."""
    ticks = max(1, math.ceil(window_h / dt - 1e-9))
    last_share = window_h / dt - (ticks - 1)
    held, work = {}, []
    for k, choice in enumerate(choices):
        prev = 0
        for t in range(ticks):
            if not choice.available[t]:
                prev = 0
                continue
            top = last_share if t == ticks - 1 else 1
            f = prob.add_variable(f"f_{tag}_{k}_{t}", 0, top)
            u = prob.add_variable(f"u_{tag}_{k}_{t}", cat=pulp.LpBinary) if binary else f
            if binary:
                prob += f <= u
            x = prob.add_variable(f"x_{tag}_{k}_{t}", 0)
            prob += x >= u - prev
            prev = u
            held[k, t] = (u, f)
            work.append((dt * f - restart_h * x) / choice.work_h)
    for t in range(ticks):
        here = [held[k, t][0] for k in range(len(choices)) if (k, t) in held]
        if len(here) > 1:
            prob += pulp.lpSum(here) <= 1
    if work:
        prob += pulp.lpSum(work) >= 1
    return held


def _tier_hours(parts: list[tuple[list[Choice], dict]], dt: float) -> dict[str, float]:
    hours: dict[str, float] = {tier.value: 0.0 for tier in Tier}
    for choices, held in parts:
        for (k, _), (_, f) in held.items():
            hours[choices[k].tier] += dt * (f.value() or 0.0)
    return hours


def _alone(
    choices: list[Choice], restart_h: float, window_h: float, dt: float, time_limit_s: float
) -> tuple[pulp.LpProblem, dict]:
    """Can't Be Late's ILP for one job over `choices`, solved: the problem and its variables (`_job`)."""
    prob = pulp.LpProblem("omniscient", pulp.LpMinimize)
    held = _job(prob, "j", choices, restart_h, window_h, dt, binary=True)
    prob += pulp.lpSum(choices[k].price_usd_per_h * dt * f for (k, _), (_, f) in held.items())
    highs.solve(prob, timeLimit=time_limit_s, gapRel=MIP_GAP)
    return prob, held


def cheapest(choices: list[Choice], restart_h: float, window_h: float, dt: float, time_limit_s: float = 5.0) -> Bound:
    """Can't Be Late's ILP over `choices` (each with its availability from now, one tick of `dt` hours each):
    the least cost of the whole job's work within `window_h`, paying `restart_h` at each start."""
    prob, held = _alone(choices, restart_h, window_h, dt, time_limit_s)
    if pulp.LpStatus[prob.status] == "Infeasible" or not held:
        return Bound(math.inf, "infeasible", {})
    info = prob.solverModel.getInfo()
    proved = info.mip_gap <= 10 * MIP_GAP or info.mip_gap != info.mip_gap  # NaN: solved at the root
    cost = float(pulp.value(prob.objective) or 0.0) if proved else float(info.mip_dual_bound)
    return Bound(cost, "optimal" if proved else "dual bound", _tier_hours([(choices, held)], dt))


def cheapest_by_steps(
    prices: np.ndarray, available: np.ndarray, work_ticks: int, restart_ticks: int, dt: float
) -> np.ndarray:
    """The same program as `cheapest` for choices of equal speed (one instance type: Can't Be Late's setting),
    solved exactly by dynamic programming over (progress, choice, changeover ticks left) for a batch of windows
    at once: `prices` (choices,), `available` (windows x choices x ticks); the least cost per window (inf when
    the work cannot be done). Whole ticks only (work and restart in ticks). Hundreds of 52-hour windows take
    seconds where the ILP takes seconds each."""
    batch, choices, ticks = available.shape
    q_max, r_max = work_ticks, restart_ticks
    step_cost = np.asarray(prices, dtype=float)[None, :, None, None] * dt  # per window, choice, r, q
    idle = np.full((batch, q_max + 1), np.inf)
    idle[:, 0] = 0.0
    run = np.full((batch, choices, r_max + 1, q_max + 1), np.inf)  # on a choice after a tick, r changeover ticks owed
    best = np.full(batch, np.inf)
    for t in range(ticks):
        start_from = np.minimum(idle, run.min(axis=(1, 2)))  # stopping is free; a start may follow anything
        new = np.full_like(run, np.inf)
        if r_max > 0:
            new[:, :, r_max - 1, :] = start_from[:, None, :]  # the first tick of a start pays the changeover
            new[:, :, : r_max - 1, :] = np.minimum(new[:, :, : r_max - 1, :], run[:, :, 1:r_max, :])
        else:
            new[:, :, 0, 1:] = start_from[:, None, :-1]
        new[:, :, 0, 1:] = np.minimum(new[:, :, 0, 1:], run[:, :, 0, :-1])  # a tick of progress
        new += step_cost
        new[~available[:, :, t]] = np.inf
        run, idle = new, start_from
        best = np.minimum(best, run[:, :, 0, q_max].min(axis=1))
    return best


def joint(
    jobs: list[tuple[JobSpec, float, int, float]], market: Market, bubbles: bool = True, time_limit_s: float = 60.0
) -> Bound:
    """The least cost of all the backtest's jobs together, `jobs` as (spec, window_h, start tick, true speed): the
    per-job program for each, with spot and bubble capacity shared per tick (a zone's instances, one per bubble
    executor). Offers of equal price and hardware are pooled (their capacities added: the bound only gets lower);
    on-demand is unlimited. Solved as its LP relaxation (the ILP of 40 jobs does not finish in minutes here):
    still a lower bound on what any policy can pay for the same jobs in the same market, and, unlike the sum of
    per-job bounds, one that counts the contention no policy can avoid."""
    dt = market.tick_s / 3600
    pools: dict[tuple, tuple] = {}  # key -> (an offer, capacity per market tick)
    shared = [(s.offer, s.capacity) for s in market.spot]
    shared += [(o, np.ones(market.ticks, dtype=int)) for o in (market.bubbles if bubbles else [])]
    for offer, capacity in shared:
        key = (offer.tier, offer.price_usd_per_h, offer.accelerator, offer.accelerator_count, offer.gpu_memory_gb)
        capacity = np.asarray(capacity[: market.ticks], dtype=int)
        pools[key] = (pools[key][0], pools[key][1] + capacity) if key in pools else (offer, capacity)
    prob = pulp.LpProblem("joint_omniscient", pulp.LpMinimize)
    cost, users, parts = [], {}, []
    for j, (spec, window_h, start, speed) in enumerate(jobs):
        ticks = max(1, math.ceil(window_h / dt - 1e-9))
        choices = []
        for key, (offer, capacity) in pools.items():
            if fits(spec, offer):
                available = np.r_[capacity[start : start + ticks] > 0, np.zeros(ticks, dtype=bool)][:ticks]
                work_h = exclusive_hours(spec, offer) / speed
                choices.append(Choice(offer.tier.value, offer.price_usd_per_h, work_h, available, key))
        choices += _always(market.on_demand, spec, speed, ticks)
        held = _job(prob, str(j), choices, restart_hours(spec), window_h, dt, binary=False)
        if not held:
            return Bound(math.inf, "infeasible", {})
        parts.append((choices, held))
        for (k, t), (u, f) in held.items():
            cost.append(choices[k].price_usd_per_h * dt * f)
            if choices[k].pool is not None:
                users.setdefault((choices[k].pool, start + t), []).append(u)
    for (key, t), here in users.items():
        prob += pulp.lpSum(here) <= int(pools[key][1][t])
    prob += pulp.lpSum(cost)
    highs.solve(prob, timeLimit=time_limit_s)
    status = pulp.LpStatus[prob.status]
    if status != "Optimal":
        return Bound(math.inf if status == "Infeasible" else 0.0, status.lower(), {})
    return Bound(float(pulp.value(prob.objective) or 0.0), "LP relaxation", _tier_hours(parts, dt))


def joint_schedule(
    jobs: list[tuple[JobSpec, float, int, float]],
    market: Market,
    bubbles: bool = True,
    time_limit_s: float = 5.0,
    progress: Callable[[int, int], None] | None = None,
) -> Bound:
    """An offline schedule of all the jobs, `jobs` as `joint` takes them: one job at a time, least slack first, each
    at the least cost of the capacity the jobs before it left (every zone and bubble executor its own, no pooling;
    the per-job program, solved to `time_limit_s`, longer when that finds no schedule). It is a schedule, not a
    bound: the offline optimum of the jobs together lies between `joint` and its cost, which says how much of a
    policy's distance from `joint` is the bound's own slack. Infinite when some job finds no capacity left."""
    dt = market.tick_s / 3600
    pools = [(s.offer, np.array(s.capacity[: market.ticks], dtype=int)) for s in market.spot]
    pools += [(o, np.ones(market.ticks, dtype=int)) for o in (market.bubbles if bubbles else [])]
    on_demand = market.on_demand

    def slack(job: tuple[JobSpec, float, int, float]) -> float:
        spec, window_h, _, speed = job
        return window_h - min((exclusive_hours(spec, o) / speed for o in on_demand if fits(spec, o)), default=0.0)

    cost, parts = 0.0, []
    for i, (spec, window_h, start, speed) in enumerate(sorted(jobs, key=slack)):
        ticks = max(1, math.ceil(window_h / dt - 1e-9))
        choices, left = [], []
        for offer, capacity in pools:
            available = np.r_[capacity[start : start + ticks] > 0, np.zeros(ticks, dtype=bool)][:ticks]
            if fits(spec, offer) and available.any():
                work_h = exclusive_hours(spec, offer) / speed
                choices.append(Choice(offer.tier.value, offer.price_usd_per_h, work_h, available))
                left.append(capacity)
        od = _always(on_demand, spec, speed, ticks)
        choices += od
        left += [None] * len(od)
        for limit in (time_limit_s, 12 * time_limit_s):
            prob, held = _alone(choices, restart_hours(spec), window_h, dt, limit)
            found = bool(held) and prob.solverModel.getInfo().primal_solution_status == 2  # 2: a feasible point
            if found or pulp.LpStatus[prob.status] == "Infeasible":
                break
        if not found:
            return Bound(math.inf, "infeasible", {})
        for (k, t), (u, f) in held.items():
            if left[k] is not None and (u.value() or 0.0) > 0.5:
                left[k][start + t] -= 1
            cost += choices[k].price_usd_per_h * dt * (f.value() or 0.0)
        parts.append((choices, held))
        if progress:
            progress(i + 1, len(jobs))
    return Bound(cost, "schedule", _tier_hours(parts, dt))
