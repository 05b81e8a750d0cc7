"""Gavel's alternatives to minimum cost over the same offers: max-min fairness and minimum makespan.

X[j,o] is the share of time job j runs on offer o; T[j,o] = 1 / exclusive hours its throughput
(jobs per hour). Each job's X sums to at most 1 and each offer's to at most its capacity.
- max-min fairness: maximise the least normalised throughput sum_o T[j,o] X[j,o] / T[j,best].
- min makespan: maximise z with sum_o T[j,o] X[j,o] >= remaining_j z (z = 1 / makespan).
Both are small LPs (PuLP with HiGHS); a round then gives each job the offer it holds the largest
share of, while capacity lasts (Gavel's round-based mechanism, one round).
"""

from __future__ import annotations

import math
from datetime import datetime

import pulp

from broker.domain.offer import Offer
from broker.domain.plan import Plan, Unplaced
from broker.models.fit import fits
from broker.models.risk import exclusive_hours
from broker.planning import highs, register
from broker.planning.cheapest import CheapestFeasible
from broker.planning.option_table import PlanItem


class _Allocation(CheapestFeasible):
    """Quotes as the cheapest policy does; plans by the allocation LP."""

    def plan(self, items: list[PlanItem], offers: list[Offer], capacity: dict[str, int], now: datetime) -> Plan:
        """Solve the allocation LP, then round: each job to its largest share with capacity left."""
        pairs = {
            (j, o): 1 / (exclusive_hours(item.spec, offer) * max(item.remaining, 1e-9))
            for j, item in enumerate(items)
            for o, offer in enumerate(offers)
            if fits(item.spec, offer)
        }
        plan = Plan(
            policy=self.name,
            unplaced={i.id: Unplaced.resources for j, i in enumerate(items) if not any(k[0] == j for k in pairs)},
        )
        if not pairs:
            return plan
        prob = pulp.LpProblem(self.name, pulp.LpMaximize)
        x = {k: prob.add_variable(f"x_{k[0]}_{k[1]}", 0, 1) for k in pairs}
        z = prob.add_variable("z", 0)
        prob.setObjective(pulp.LpAffineExpression([(z, 1)]))
        by_job: dict[int, list] = {}
        by_offer: dict[int, list] = {}
        for k in pairs:
            by_job.setdefault(k[0], []).append(k)
            by_offer.setdefault(k[1], []).append(k)
        for mine in by_job.values():
            best = max(pairs[k] for k in mine)
            prob.addConstraint(pulp.LpAffineExpression([(x[k], 1) for k in mine]) <= 1)
            prob.addConstraint(
                pulp.LpAffineExpression([(x[k], self.weight(pairs[k], best)) for k in mine] + [(z, -1)]) >= 0
            )
        for o, theirs in by_offer.items():
            limit = capacity.get(offers[o].id, math.inf)
            if math.isfinite(limit):
                prob.addConstraint(pulp.LpAffineExpression([(x[k], 1) for k in theirs]) <= limit)
        highs.solve(prob)
        plan.objective = pulp.value(prob.objective)
        left = {o.id: capacity.get(o.id, math.inf) for o in offers}
        for j, o in sorted(pairs, key=lambda k: -(x[k].varValue or 0)):
            item, offer = items[j], offers[o]
            if item.id not in plan.assignments and (x[(j, o)].varValue or 0) > 1e-6 and left[offer.id] >= 1:
                plan.assignments[item.id], left[offer.id] = offer.id, left[offer.id] - 1
        for item in items:
            if item.id not in plan.assignments and item.id not in plan.unplaced:
                plan.unplaced[item.id] = Unplaced.capacity
        return plan

    def weight(self, throughput: float, best: float) -> float:
        """The coefficient of a share in the job's served-throughput row."""
        raise NotImplementedError


@register("max-min-fairness")
class MaxMinFairness(_Allocation):
    """Every job gets as large a share of its best throughput as the least-served job can."""

    def weight(self, throughput, best):
        return throughput / best


@register("min-makespan")
class MinMakespan(_Allocation):
    """All jobs finish as early as possible: the last finish time is minimised."""

    def weight(self, throughput, best):
        return throughput  # whole (remaining) jobs per hour
