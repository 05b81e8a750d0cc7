"""The baselines the backtest compares with (all on-demand, SkyPilot's EAGER_NEXT_REGION, Can't Be Late's
Greedy), and the planner's rule for waiting for spot instead of paying on-demand."""

from datetime import timedelta

import pytest

from broker.domain.model import Tier
from broker.domain.offer import Offer
from broker.models.risk import STARTUP_H, Expectation, fallback_expectation
from broker.planning import get
from broker.planning.costslo import CostSLO, may_wait
from broker.planning.option_table import PlanItem
from broker.planning.uniform_progress import UniformProgress
from conftest import NOW, make_spec


def offer(zone, tier, price, region="us-east-1", hazard=0.0):
    return Offer(
        cloud="aws",
        region=region,
        zone=zone,
        instance_type="x",
        tier=tier,
        accelerator="A100",
        accelerator_count=1,
        gpu_memory_gb=40,
        vcpus=8,
        memory_gb=64,
        price_usd_per_h=price,
        hazard_per_h=hazard,
    )


SPOT_EAST, SPOT_WEST = offer("e", Tier.spot, 1.0), offer("w", Tier.spot, 1.5, region="us-west-2")
OD = offer("o", Tier.on_demand, 4.0)


def item(name="j", deadline="+40h", gpu_hours=10, **fields):
    return PlanItem(
        name, make_spec(name=name, work={"gpu_hours": gpu_hours}, deadline=deadline), submitted_at=NOW, **fields
    )


def test_skypilot_eager_takes_the_cheapest_spot_but_leaves_the_region_that_preempted_it():
    policy = get("skypilot-eager")
    assert policy.plan([item()], [SPOT_EAST, SPOT_WEST, OD], {}, NOW).assignments == {"j": SPOT_EAST.id}
    moved = policy.plan([item(preempted_in="us-east-1")], [SPOT_EAST, SPOT_WEST, OD], {}, NOW)
    assert moved.assignments == {"j": SPOT_WEST.id}
    alone = policy.plan([item(preempted_in="us-east-1")], [SPOT_EAST, SPOT_WEST, OD], {SPOT_WEST.id: 0}, NOW)
    assert alone.assignments == {"j": SPOT_EAST.id}  # no room elsewhere: the same region again


def test_skypilot_eager_waits_for_spot_past_any_deadline_and_its_quote_ignores_it():
    policy = get("skypilot-eager")
    late = item(deadline="+1h", gpu_hours=50)
    assert policy.plan([late], [SPOT_EAST, OD], {SPOT_EAST.id: 0}, NOW).unplaced == {"j": "waiting for spot"}
    assert policy.quote(late.spec, [SPOT_EAST, OD], NOW).chosen.offer == SPOT_EAST
    assert policy.deadline_guard is False


def test_all_on_demand_uses_only_on_demand():
    assert get("on-demand").plan([item()], [SPOT_EAST, OD], {}, NOW).assignments == {"j": OD.id}
    assert get("on-demand").quote(item().spec, [SPOT_EAST, OD], NOW).chosen.offer == OD


def test_greedy_waits_where_uniform_progress_goes_on_demand_until_the_safety_net():
    behind = item(deadline="+40h")
    later = NOW + timedelta(hours=10)  # nothing done after 10 of 40 hours: behind uniform progress
    idle = {SPOT_EAST.id: 0}
    assert UniformProgress().plan([behind], [SPOT_EAST, OD], idle, later).assignments == {"j": OD.id}
    assert get("cbl-greedy").plan([behind], [SPOT_EAST, OD], idle, later).unplaced == {"j": "waiting for spot"}
    net = NOW + timedelta(hours=40 - 10 - 0.3)  # 10 h of on-demand work left, less than 2d of slack
    assert get("cbl-greedy").plan([behind], [SPOT_EAST, OD], idle, net).assignments == {"j": OD.id}


def test_the_planner_lets_a_patient_job_wait_for_spot_rather_than_pay_on_demand():
    od_h = 10.0  # 10 A100-hours on one A100: the quote's on-demand baseline
    patient = item(on_demand_h=od_h)
    assert may_wait(patient, NOW)
    plan = CostSLO().plan([patient], [SPOT_EAST, OD], {SPOT_EAST.id: 0}, NOW)
    assert plan.assignments == {} and plan.unplaced == {"j": "capacity"}
    assert CostSLO().plan([patient], [SPOT_EAST, OD], {SPOT_EAST.id: 1}, NOW).assignments == {"j": SPOT_EAST.id}
    at_net = NOW + timedelta(hours=40 - od_h - 0.3)
    assert not may_wait(patient, at_net)
    assert CostSLO().plan([patient], [SPOT_EAST, OD], {SPOT_EAST.id: 0}, at_net).assignments == {"j": OD.id}
    assert not may_wait(item(on_demand_h=od_h, current=SPOT_EAST.id), NOW)  # a running job is not pending


def test_a_fallback_pays_on_demand_only_for_the_work_left_when_the_net_fires():
    spot = Expectation(0.5, 10.0, 12.5, 12.5, 0.6)  # 10 h of work, 12.5 h expected wall at 1 USD/h, P(on time) 0.6
    restart, window = 0.1, 12.0
    margin = 2 * (restart + STARTUP_H)
    e = fallback_expectation(spot, 1.0, 10.0, 40.0, 10.0, restart, window)
    pace = 10.0 / 12.5
    switch = (window - 10.0 - margin) / (1 - pace)
    left = (window - switch - margin) / 10.0
    assert 0 < left < 1
    assert e.cost_usd == pytest.approx(0.6 * 12.5 + 0.4 * (switch + 40.0 * left))
    assert e.cost_usd < 0.6 * 12.5 + 0.4 * (switch + 40.0)  # not the whole job again
    assert e.p_meet == 1.0
    assert fallback_expectation(spot, 1.0, 10.0, 40.0, 10.0, restart, 10.0 + margin - 0.01).p_meet == 0.6  # no 2d slack


def test_a_job_without_a_deadline_does_not_wait_for_spot():
    assert not may_wait(item(deadline=None, on_demand_h=10.0), NOW)
    assert CostSLO().plan(
        [item(deadline=None, on_demand_h=10.0)], [SPOT_EAST, OD], {SPOT_EAST.id: 0}, NOW
    ).assignments == {"j": OD.id}
