"""The cost/SLO program: optimal on small cases (brute force), capacity and budgets respected, reasons given."""

import itertools
import math
import random
from datetime import timedelta

import numpy as np
import pytest

from broker.domain.model import Tier
from broker.domain.offer import Offer
from broker.models.fit import fits
from broker.models.risk import evaluate
from broker.planning import get, names
from broker.planning.costslo import CostSLO
from broker.planning.option_table import PlanItem, option_table
from conftest import NOW, make_spec


def offer(name, tier=Tier.spot, price=1.0, hazard=0.0, accelerator="A100", count=1, memory=40.0, speed=1.0):
    return Offer(
        cloud="aws",
        region="us-east-1",
        zone=name,
        instance_type="x",
        tier=tier,
        accelerator=accelerator,
        accelerator_count=count,
        gpu_memory_gb=memory,
        vcpus=8,
        memory_gb=64,
        price_usd_per_h=price,
        hazard_per_h=hazard,
        speed_factor=speed,
    )


def random_case(rng: random.Random, n_jobs: int, n_offers: int, budgets: bool):
    offers = [
        offer(
            f"z{k}",
            tier=rng.choice([Tier.spot, Tier.spot, Tier.on_demand]),
            price=round(rng.uniform(0.3, 4), 2),
            hazard=rng.choice([0.0, 0.02, 0.1, 0.4]),
            accelerator=rng.choice(["A100", "L4"]),
        )
        for k in range(n_offers)
    ]
    offers = [o.model_copy(update={"hazard_per_h": 0.0}) if o.tier == Tier.on_demand else o for o in offers]
    capacity = {o.id: rng.randint(0, 2) for o in offers}
    items = []
    for k in range(n_jobs):
        accelerators = rng.choice([["A100:1"], ["L4:1"], ["A100:1", "L4:1"]])
        fields = {
            "resources": {"accelerators": accelerators},
            "work": {"gpu_hours": rng.uniform(1, 8)},
            "checkpoint": {"size_gb": rng.uniform(1, 40)},
        }
        if rng.random() < 0.6:
            fields["deadline"] = f"+{rng.uniform(3, 60):.1f}h"
        if budgets and rng.random() < 0.5:
            fields["budget_usd"] = rng.uniform(3, 30)
        items.append(PlanItem(f"j{k}", make_spec(name=f"j{k}", **fields)))
    return items, offers, capacity


def brute_force(items, offers, capacity, penalty, budget=None):
    """The cheapest assignment by enumeration, pricing each pair with the scalar model."""
    choices = []
    for item in items:
        feasible = [None]
        for index, o in enumerate(offers):
            if fits(item.spec, o):
                option = CostSLO().options(item.spec, [o] + [x for x in offers if x.tier == Tier.on_demand], NOW)
                mine = [p for p in option if p.offer.id == o.id and p.feasible]
                if mine:
                    feasible.append((index, min(p.expected_cost_usd for p in mine)))
        choices.append(feasible)
    decided = [k for k, c in enumerate(choices) if len(c) > 1]  # a job nothing fits is unplaced with a reason
    best = math.inf
    for partial in itertools.product(*(choices[k] for k in decided)):
        combo = [None] * len(items)
        for k, choice in zip(decided, partial):
            combo[k] = choice
        used = {}
        total = 0.0
        for item_index, choice in enumerate(combo):
            if choice is None and item_index in decided:
                total += penalty[item_index]
            elif choice is None:
                continue
            else:
                used[choice[0]] = used.get(choice[0], 0) + 1
                total += choice[1]
        if any(n > capacity[offers[o].id] for o, n in used.items()):
            continue
        if budget is not None and sum(c[1] for c in combo if c) > budget + 1e-9:
            continue
        best = min(best, total)
    return best


@pytest.mark.parametrize("seed", range(12))
def test_program_choice_equals_brute_force_on_small_cases(seed):
    rng = random.Random(seed)
    items, offers, capacity = random_case(rng, rng.randint(2, 6), rng.randint(2, 5), budgets=True)
    plan = CostSLO(gap_target=0).plan(items, offers, capacity, NOW)
    penalty = _penalties(items, offers, capacity)
    assert plan.objective == pytest.approx(brute_force(items, offers, capacity, penalty), rel=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_round_budget_is_respected_and_close_to_brute_force(seed):
    rng = random.Random(100 + seed)
    items, offers, capacity = random_case(rng, 5, 4, budgets=False)
    capacity = {k: v + 1 for k, v in capacity.items()}
    budget = 25.0
    plan = CostSLO(budget_usd=budget).plan(items, offers, capacity, NOW)
    assert plan.expected_cost_usd <= budget + 1e-6
    optimum = brute_force(items, offers, capacity, _penalties(items, offers, capacity, budget), budget)
    assert plan.bound <= optimum + 1e-6 <= plan.objective + 1e-6


def _penalties(items, offers, capacity, budget=None):
    """The program's own pending penalties, read from a solve (brute force must price waiting the same)."""
    from broker.planning.costslo import _penalty

    table = option_table(items, offers, NOW)
    return _penalty(items, offers, table, np.flatnonzero(table.feasible), NOW)


def test_capacity_is_never_exceeded():
    rng = random.Random(5)
    for _ in range(10):
        items, offers, capacity = random_case(rng, 40, 8, budgets=True)
        plan = CostSLO().plan(items, offers, capacity, NOW)
        used = {}
        for offer_id in plan.assignments.values():
            used[offer_id] = used.get(offer_id, 0) + 1
        assert all(n <= capacity[o] for o, n in used.items())
        assert set(plan.assignments) | set(plan.unplaced) == {i.id for i in items}


def test_every_assignment_keeps_the_jobs_budget_and_deadline_odds():
    rng = random.Random(9)
    items, offers, capacity = random_case(rng, 60, 10, budgets=True)
    capacity = {k: 10 for k in capacity}
    plan = CostSLO().plan(items, offers, capacity, NOW)
    by_id = {o.id: o for o in offers}
    for item in items:
        if item.id not in plan.assignments:
            continue
        chosen = by_id[plan.assignments[item.id]]
        options = [
            o
            for o in CostSLO().options(item.spec, [chosen] + [x for x in offers if x.tier == Tier.on_demand], NOW)
            if o.offer.id == chosen.id and o.feasible
        ]
        assert options, f"{item.id} placed on {chosen.id}, which is not feasible for it"
        assert item.spec.budget_usd is None or min(o.expected_cost_usd for o in options) <= item.spec.budget_usd


def test_a_job_whose_deadline_cannot_be_met_is_unplaced_with_reason_deadline():
    late = PlanItem("late", make_spec(work={"gpu_hours": 50}, deadline="+10h"))
    poor = PlanItem("poor", make_spec(work={"gpu_hours": 5}, budget_usd=0.5))
    big = PlanItem("big", make_spec(resources={"accelerators": ["A100:1"], "gpu_memory_gb": 80}))
    odd = PlanItem("odd", make_spec(resources={"accelerators": ["H100:8"]}))
    ok = PlanItem("ok", make_spec())
    plan = CostSLO().plan([late, poor, big, odd, ok], [offer("a", Tier.on_demand, price=2.0)], {}, NOW)
    assert plan.unplaced == {"late": "deadline", "poor": "budget", "big": "memory", "odd": "resources"}
    assert plan.assignments == {"ok": "aws/a/x/on_demand"}


def test_jobs_left_without_capacity_are_unplaced_with_reason_capacity_most_urgent_first():
    relaxed = PlanItem("relaxed", make_spec(deadline="+100h"))
    urgent = PlanItem("urgent", make_spec(deadline="+6h"))
    o = offer("a", Tier.on_demand)
    plan = CostSLO().plan([relaxed, urgent], [o], {o.id: 1}, NOW)
    assert plan.assignments == {"urgent": o.id} and plan.unplaced == {"relaxed": "capacity"}


def test_without_deadlines_jobs_are_placed_first_come_first_served():
    """Equal jobs in dispatch order (as the server passes them): the solver alone broke the tie for the last ones,
    so under steady churn the first submitted waited forever (seen in bench/chaos.py)."""
    spec = make_spec(work={"gpu_hours": 1.0})
    items = [PlanItem(f"j{k}", spec, submitted_at=NOW + timedelta(seconds=k)) for k in range(10)]
    o = offer("a", Tier.on_demand)
    for order in (items, items[::-1]):
        plan = CostSLO().plan(order, [o], {o.id: 3}, NOW)
        assert sorted(plan.assignments) == ["j0", "j1", "j2"]


def test_fill_eligible_jobs_go_to_free_bubbles_when_the_deadline_allows():
    bubble = offer("stage3", Tier.bubble, price=0.0, hazard=0.05, speed=0.3)
    spot = offer("spot", Tier.spot, price=1.2, hazard=0.05)
    fill = PlanItem("fill", make_spec(work={"gpu_hours": 2}, deadline="+48h", fill=True))
    plain = PlanItem("plain", make_spec(work={"gpu_hours": 2}, deadline="+48h"))
    rushed = PlanItem("rushed", make_spec(work={"gpu_hours": 2}, deadline="+4h", fill=True))
    plan = CostSLO().plan([fill, plain, rushed], [bubble, spot], {bubble.id: 2, spot.id: 5}, NOW)
    assert plan.assignments == {"fill": bubble.id, "plain": spot.id, "rushed": spot.id}


def test_a_running_job_moves_only_when_the_saving_beats_the_migration():
    here = offer("here", Tier.on_demand, price=3.0)
    cheaper = offer("cheaper", Tier.on_demand, price=2.9)
    much_cheaper = offer("much", Tier.on_demand, price=1.0)
    running = PlanItem("run", make_spec(work={"gpu_hours": 1}), remaining=0.5, current=here.id)
    assert CostSLO().plan([running], [here, cheaper], {}, NOW).assignments == {"run": here.id}
    assert CostSLO().plan([running], [here, much_cheaper], {}, NOW).assignments == {"run": much_cheaper.id}


def test_a_risky_spot_offer_is_used_with_an_on_demand_fallback():
    risky = offer("risky", Tier.spot, price=0.5, hazard=0.6)
    od = offer("od", Tier.on_demand, price=3.0)
    item = PlanItem("j", make_spec(work={"gpu_hours": 6}, checkpoint={"size_gb": 30}, deadline="+8h"))
    alone = evaluate(item.spec, risky, NOW)
    assert not alone.meets_deadline  # on its own the spot offer is too risky for the 0.95 target
    plan = CostSLO().plan([item], [risky, od], {}, NOW)
    assert plan.assignments == {"j": risky.id} and plan.fallbacks == {"j": od.id}
    assert plan.expected_cost_usd < evaluate(item.spec, od, NOW).expected_cost_usd


def test_the_lp_bound_never_exceeds_the_plan_and_pure_assignment_has_no_gap():
    rng = random.Random(3)
    items, offers, capacity = random_case(rng, 200, 12, budgets=True)
    plan = CostSLO(gap_target=0).plan(items, offers, capacity, NOW)  # solve to the end: the LP is integral
    assert plan.bound <= plan.objective + 1e-6
    assert plan.gap == pytest.approx(0, abs=1e-9)
    assert CostSLO().plan(items, offers, capacity, NOW).gap <= 0.005  # the default stops at 0.5%


def test_quote_with_the_planner_matches_its_single_job_plan(catalog):
    spec = make_spec(resources={"accelerators": ["L4:1", "A10G:1"]}, work={"gpu_hours": 3}, deadline="+20h")
    quote = CostSLO().quote(spec, catalog.offers, NOW)
    plan = CostSLO().plan([PlanItem("j", spec)], catalog.offers, {}, NOW)
    assert plan.assignments["j"] == quote.chosen.offer.id
    assert plan.expected_cost_usd == pytest.approx(quote.chosen.expected_cost_usd, rel=1e-9)


def test_registry_lists_the_planner():
    assert {"cheapest", "costslo"} <= set(names())
    assert isinstance(get("costslo"), CostSLO)


def test_the_lp_prints_nothing_to_stdout_so_json_output_stays_json(tmp_path):
    """HiGHS prints a banner to fd 1 when a process makes its first instance; `broker backtest --json` printed it
    before its JSON. The command in a process of its own: what it prints must parse."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    broker = Path(sys.executable).with_name("broker")
    command = [str(broker), "backtest", "--jobs", "2", "--policies", "costslo", "--json"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["policies"][0]["policy"] == "costslo"
