"""The cost/SLO program: which option each job takes this round, at minimum expected cost.

    minimise   sum_{j,o} cost[j,o] x[j,o] + sum_j penalty[j] z[j]
    subject to sum_o x[j,o] + z[j] = 1                     every job placed once, or pending (z)
               sum_j x[j,o] <= capacity[o]                 instances obtainable, bubble slots
               sum_{j,o} cost[j,o] x[j,o] <= budget        optional budget for the round
               x[j,o] = 0 unless o fits j (tier, accelerator, memory), P(meet deadline) >= target
               and the job's expected cost stays within its own budget (the option table)

cost includes the price of migrating a running job (a restart on the new offer). Without the
round budget this is a transportation problem, so a basic (simplex) solution of the LP is
integral; with it, the few fractional jobs are repaired greedily and the gap to the LP bound
is reported. The LP is solved by column generation: each job starts with its few cheapest
options, and options with negative reduced cost under the duals are added until none is left,
so the final LP is optimal over all options and its value is a true lower bound.
"""

from __future__ import annotations

import math
import os
import sys
import time
from datetime import datetime

import highspy
import numpy as np

from broker.domain.model import Option, Tier
from broker.domain.offer import Offer
from broker.domain.plan import Plan, Unplaced, relative_gap
from broker.models.risk import evaluate_with_fallback, window_hours
from broker.planning import highs, register
from broker.planning.auction import auction_prices
from broker.planning.cheapest import CheapestFeasible, cost_order
from broker.planning.option_table import OptionTable, PlanItem, option_table, smallest_per_job
from broker.planning.uniform_progress import Move, decide, progress_of

COLUMNS_PER_JOB = 4  # the most options added per job in one pricing pass
PENDING_FACTOR = 10.0  # a job that cannot wait: pending costs 10x its dearest option, so it is placed if anything fits
FIRST_COME_SHARE = 0.5  # the first job in dispatch order values running 1.5x the last: ties go first come, first served
WAIT_SHARE = 0.9  # a job that may wait values waiting at this share of its on-demand cost: any cheaper option beats it
MAX_PRICING_PASSES = 20
AUCTION_EPSILON = 1e-2  # bid increment, as a share of the mean option cost
NEAR_EPSILONS = 5  # options within this many increments of a job's best price seed the LP
INF = highspy.kHighsInf


@register("costslo")
class CostSLO(CheapestFeasible):
    """Minimum expected cost over bubble, spot (with on-demand fallback) and on-demand, jointly for all jobs."""

    name = "costslo"

    def __init__(self, budget_usd: float | None = None, gap_target: float = 0.005, time_limit_s: float = 60.0):
        self.budget_usd, self.gap_target = budget_usd, gap_target
        self.time_limit_s = time_limit_s

    def options(self, spec, offers: list[Offer], now: datetime) -> list[Option]:
        """Every offer the job fits, priced, plus spot options that meet the deadline only with a fallback."""
        plain = super().options(spec, offers, now)
        reserve = [o for o in plain if o.offer.tier == Tier.on_demand and o.meets_deadline]
        if spec.deadline is None or not reserve:
            return plain
        od = min(reserve, key=cost_order)
        backed = [
            evaluate_with_fallback(spec, o.offer, od, now)
            for o in plain
            if o.offer.tier != Tier.on_demand and not o.meets_deadline
        ]
        return sorted(plain + backed, key=cost_order)

    def plan(self, items: list[PlanItem], offers: list[Offer], capacity: dict[str, int], now: datetime) -> Plan:
        """Assign each item to an offer (capacity by offer id; missing means unlimited) or say why it waits."""
        started = time.perf_counter()  # for the stats only; decisions never read a clock
        table = option_table(items, offers, now)
        plan = Plan(policy=self.name, unplaced={items[j].id: why for j, why in table.unfit.items()})
        rows = np.flatnonzero(table.feasible)
        cap = np.array([capacity.get(o.id, math.inf) for o in offers], dtype=float)
        penalty = _penalty(items, offers, table, rows, now)
        roomless = set(table.job[rows].tolist())
        rows = _undominated(table, rows[cap[table.offer[rows]] >= 1], cap)  # an offer with no room is no option
        roomless -= set(table.job[rows].tolist())  # fits somewhere, but nowhere with room: waits
        plan.stats = {"price_s": time.perf_counter() - started, "build_s": 0.0, "solve_s": 0.0, "passes": 0}
        objective, bound, chosen, pending = 0.0, 0.0, {}, {}
        if len(rows):
            objective, bound, chosen, pending = self._solve(table, rows, cap, penalty, plan.stats)
        for j, row in chosen.items():
            plan.assignments[items[j].id] = offers[table.offer[row]].id
            if table.fallback[row] >= 0:
                plan.fallbacks[items[j].id] = offers[table.fallback[row]].id
        for j in roomless:
            pending[j] = Unplaced.capacity
            objective, bound = objective + penalty[j], bound + penalty[j]
        plan.unplaced.update({items[j].id: why for j, why in pending.items()})
        plan.expected_cost_usd = float(sum(table.cost[r] for r in chosen.values()))
        plan.objective, plan.bound = float(objective), float(min(bound, objective))
        return plan

    def _solve(self, table: OptionTable, rows: np.ndarray, cap: np.ndarray, penalty: np.ndarray, stats: dict):
        """Column generation until the plan is within the gap target of the bound.

        Returns (objective, bound, chosen, pending)."""
        program = _Program(table, rows, cap, penalty, self.budget_usd, self.time_limit_s)
        active = np.zeros(len(table), dtype=bool)
        started = time.perf_counter()
        active[_auction_columns(table, rows, cap, penalty)] = True  # near-optimal duals: few pricing passes
        stats["auction_s"] = time.perf_counter() - started
        active[rows[table.offer[rows] == table.current[table.job[rows]]]] = True  # staying put is always a column
        best, bound = None, -math.inf
        for last in [False] * (MAX_PRICING_PASSES - 1) + [True]:
            program.solve(np.flatnonzero(active), stats)
            reduced = program.reduced_costs(rows)
            lowest = np.zeros(len(penalty))
            np.minimum.at(lowest, table.job[rows], reduced)
            bound = max(bound, program.value + float(lowest.sum()))  # Lagrangian: valid before convergence too
            improving = (reduced < -1e-7) & ~active[rows]
            if last or not improving.any() or relative_gap(program.value, bound) <= self.gap_target:
                chosen, pending = program.rounded(rows)
                objective = float(sum(table.cost[r] for r in chosen.values()) + sum(penalty[j] for j in pending))
                if best is None or objective < best[0]:
                    best = (objective, chosen, pending)
            if best is not None and (not improving.any() or relative_gap(best[0], bound) <= self.gap_target):
                break
            active[_cheapest_columns(table, rows[improving], COLUMNS_PER_JOB, key=reduced[improving])] = True
        stats["columns"] = int(active.sum())
        return best[0], bound, best[1], best[2]


def _undominated(table: OptionTable, rows: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Drop options dearer than the job's cheapest offer without a capacity limit: moving there is always
    possible and cheaper, so no optimal plan uses them (exact, with or without the round budget)."""
    uncapped = rows[np.isinf(cap[table.offer[rows]])]
    threshold = np.full(len(table.current), math.inf)
    np.minimum.at(threshold, table.job[uncapped], table.cost[uncapped])
    return rows[table.cost[rows] <= threshold[table.job[rows]]]


def _penalty(
    items: list[PlanItem], offers: list[Offer], table: OptionTable, rows: np.ndarray, now: datetime
) -> np.ndarray:
    """What leaving each job pending costs: for a job that may wait, a little less than its on-demand option (so
    spot or bubbles are taken when they have room, on-demand is not); otherwise far above its dearest option,
    more for urgent and high-priority jobs."""
    dearest = np.zeros(len(items))
    np.maximum.at(dearest, table.job[rows], table.cost[rows])
    fastest = np.full(len(items), math.inf)
    np.minimum.at(fastest, table.job[rows], table.wall_h[rows])
    with np.errstate(invalid="ignore"):  # no deadline and no option: inf - inf
        slack_h = np.array([window_hours(i.spec, now) for i in items]) - fastest
    urgency = 1 + 24 / (24 + np.where(np.isnan(slack_h), math.inf, np.maximum(slack_h, 0)))
    weight = np.array([2.0 ** max(-5, min(5, i.spec.priority)) for i in items])
    must_run = PENDING_FACTOR * np.maximum(dearest, 1.0) * urgency * weight * _first_come(items, now)
    on_demand = np.full(len(items), math.inf)
    on_demand_offer = np.array([o.tier == Tier.on_demand for o in offers], dtype=bool)
    od_rows = rows[on_demand_offer[table.offer[rows]]]
    np.minimum.at(on_demand, table.job[od_rows], table.cost[od_rows])
    patient = np.array([may_wait(i, now) for i in items], dtype=bool)
    return np.where(patient & np.isfinite(on_demand), WAIT_SHARE * on_demand, must_run)


def _first_come(items: list[PlanItem], now: datetime) -> np.ndarray:
    """Up to FIRST_COME_SHARE more for waiting, by dispatch order (priority, then deadline or submission):
    among jobs of about the same cost the earlier one is placed first. Without it ties went to whichever the
    solver picked, and under steady churn (migrations refilling the queue) the first jobs waited forever."""
    if len(items) < 2:
        return np.ones(len(items))
    rank = np.argsort(np.argsort([i.spec.urgency(i.submitted_at or now) for i in items], kind="stable"))
    return 1 + FIRST_COME_SHARE * (len(items) - 1 - rank) / (len(items) - 1)


def may_wait(item: PlanItem, now: datetime) -> bool:
    """Whether an idle job may wait for spot or bubble capacity instead of taking on-demand now: until
    Can't Be Late's safety net (Greedy's rule). Without this the program puts every job on whatever has
    room, on-demand included, however far its deadline: under contention that cost 3x Greedy's spend."""
    if item.current is not None or item.on_demand_h is None or item.spec.deadline is None:
        return False  # without a deadline nothing bounds the wait: it runs on the best there is now
    progress = progress_of(item, item.on_demand_h, item.submitted_at or now, now)
    return decide(progress, None, spot_available=False, uniform=False) == Move.wait


def _auction_columns(table: OptionTable, rows: np.ndarray, cap: np.ndarray, penalty: np.ndarray) -> np.ndarray:
    """Each job's options that are best or nearly so at the auction's prices, and the auction's own choice."""
    epsilon = AUCTION_EPSILON * float(np.mean(table.cost[rows]))
    price, chosen = auction_prices(table.job[rows], table.offer[rows], table.cost[rows], cap, penalty, epsilon)
    value = table.cost[rows] + price[table.offer[rows]]
    best = penalty.copy()
    np.minimum.at(best, table.job[rows], value)
    near = rows[value <= best[table.job[rows]] + NEAR_EPSILONS * epsilon]
    return np.r_[near, rows[chosen[chosen >= 0]]]


def _cheapest_columns(table: OptionTable, rows: np.ndarray, per_job: int, key: np.ndarray) -> np.ndarray:
    """The `per_job` rows with the smallest key for each job among `rows`."""
    return rows[smallest_per_job(table.job[rows], key, per_job)]


_quiet_yet = False  # the process's first HiGHS prints its banner; the later ones print nothing


def _highs() -> highspy.Highs:
    """A silent HiGHS. The first one a process makes prints HiGHS's banner to fd 1 as it is made, before any option
    can stop it, and would break what `--json` commands print: fd 1 points at /dev/null meanwhile."""
    global _quiet_yet
    if _quiet_yet:
        return highspy.Highs()
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            made = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    _quiet_yet = True
    return made


class _Program:
    """The LP in HiGHS, kept alive across pricing passes: new columns are added to the solved model
    and the simplex restarts from the previous basis (a warm start)."""

    def __init__(
        self,
        table: OptionTable,
        rows: np.ndarray,
        cap: np.ndarray,
        penalty: np.ndarray,
        budget: float | None,
        time_limit_s: float,
    ):
        self.table, self.cap, self.penalty, self.budget = table, cap, penalty, budget
        self.value = None
        self.active = np.zeros(0, dtype=np.int64)
        self.highs = _highs()
        self.highs.setOptionValue("output_flag", False)
        self.highs.setOptionValue("time_limit", float(time_limit_s))
        self.highs.setOptionValue(
            "simplex_strategy", 4
        )  # primal: stays feasible as columns arrive (measured 2x faster)
        n_jobs = len(penalty)
        self.capped = np.flatnonzero(np.isfinite(cap))
        self.cap_row = np.full(len(cap), -1, dtype=np.int64)
        self.cap_row[self.capped] = n_jobs + np.arange(len(self.capped))
        demand = (np.bincount(table.job[rows], minlength=n_jobs) > 0).astype(float)  # a job nothing fits is not decided
        lower = np.r_[demand, np.full(len(self.capped), -INF), [-INF] if budget is not None else []]
        upper = np.r_[demand, cap[self.capped], [budget] if budget is not None else []]
        self.budget_row = n_jobs + len(self.capped) if budget is not None else None
        self.highs.addRows(
            len(lower), lower, upper, 0, np.zeros(len(lower), dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0)
        )
        jobs = np.arange(n_jobs)  # the pending column z_j of every job: in its job row only
        self._add_columns(penalty, jobs, np.full(n_jobs, -1), np.zeros(n_jobs))

    def _add_columns(
        self, costs: np.ndarray, job_rows: np.ndarray, cap_rows: np.ndarray, budget_coef: np.ndarray
    ) -> None:
        """Columns in compressed form: a 1 in the job's row, a 1 in the offer's capacity row (if capped),
        the cost in the budget row (if any)."""
        if len(costs) == 0:
            return
        has_cap = cap_rows >= 0
        has_budget = (budget_coef != 0) & (self.budget_row is not None)
        counts = 1 + has_cap.astype(int) + has_budget.astype(int)
        starts = np.r_[0, np.cumsum(counts)[:-1]].astype(np.int32)
        index = np.empty(int(counts.sum()), dtype=np.int32)
        value = np.ones(len(index))
        index[starts] = job_rows
        index[starts[has_cap] + 1] = cap_rows[has_cap]
        at = starts[has_budget] + 1 + has_cap[has_budget]
        index[at], value[at] = self.budget_row or 0, budget_coef[has_budget]
        self.highs.addCols(
            len(costs),
            costs.astype(float),
            np.zeros(len(costs)),
            np.full(len(costs), INF),
            len(index),
            starts,
            index,
            value,
        )

    def solve(self, active: np.ndarray, stats: dict) -> None:
        """Add the rows of the table in `active` not yet in the model as columns, and re-solve."""
        started = time.perf_counter()
        t = self.table
        new = np.setdiff1d(active, self.active)
        self._add_columns(t.cost[new], t.job[new], self.cap_row[t.offer[new]], t.cost[new])
        self.active = np.r_[self.active, new].astype(np.int64)
        built = time.perf_counter()
        highs.run(self.highs)  # a stop ends it early (planning/highs.py)
        status = self.highs.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:
            raise RuntimeError(f"costslo: HiGHS ended the LP with status {self.highs.modelStatusToString(status)}")
        solution = self.highs.getSolution()
        n_jobs = len(self.penalty)
        values = np.asarray(solution.col_value)
        self.z, self.x = values[:n_jobs], values[n_jobs:]
        self.duals = np.asarray(solution.row_dual)
        self.value = float(self.highs.getInfo().objective_function_value)
        stats["build_s"] += built - started
        stats["solve_s"] += time.perf_counter() - built
        stats["passes"] += 1

    def reduced_costs(self, rows: np.ndarray) -> np.ndarray:
        """cost - duals for every candidate row: negative means adding it would lower the LP's value."""
        t = self.table
        u = self.duals[t.job[rows]]
        cap_row = self.cap_row[t.offer[rows]]
        w = np.where(cap_row >= 0, self.duals[np.maximum(cap_row, 0)], 0.0)
        beta = self.duals[self.budget_row] if self.budget_row is not None else 0.0
        return t.cost[rows] * (1 - beta) - u - w

    def rounded(self, rows: np.ndarray) -> tuple[dict[int, int], dict[int, str]]:
        """Integral choices: whole LP assignments kept, fractional jobs repaired greedily, most urgent first."""
        t = self.table
        chosen = {int(t.job[r]): int(r) for r, x in zip(self.active, self.x) if x > 1 - 1e-6}
        used = np.bincount([t.offer[r] for r in chosen.values()], minlength=len(self.cap)).astype(float)
        left_usd = math.inf if self.budget is None else self.budget - sum(t.cost[r] for r in chosen.values())
        jobs = sorted(set(t.job[rows].tolist()) - set(chosen), key=lambda j: -self.penalty[j])
        placed_share = np.bincount(t.job[self.active], weights=self.x, minlength=len(self.penalty))
        pending = {}
        by_job = _groups(t.job[rows])
        for j in jobs:
            if placed_share[j] < 1e-6:  # the LP left it pending outright
                spent = self.budget_row is not None and self.duals[self.budget_row] < -1e-9
                pending[j] = Unplaced.round_budget if spent else Unplaced.capacity
                continue
            for r in sorted(rows[by_job[j]], key=lambda r: t.cost[r]):
                if used[t.offer[r]] + 1 <= self.cap[t.offer[r]] and t.cost[r] <= left_usd:
                    chosen[j], left_usd = int(r), left_usd - t.cost[r]
                    used[t.offer[r]] += 1
                    break
            else:
                pending[j] = Unplaced.capacity if left_usd == math.inf else Unplaced.round_budget
        return chosen, pending


def _groups(keys: np.ndarray) -> dict[int, np.ndarray]:
    """Positions of each distinct key."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    starts = np.r_[0, np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1]
    return {int(sorted_keys[s]): order[s:e] for s, e in zip(starts, np.r_[starts[1:], len(keys)])}
