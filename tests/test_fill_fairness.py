"""Fill-queue ordering (PipeFill's scores) and Gavel's alternative objectives."""

import pytest

from broker.domain.model import AgentInfo, Tier
from broker.domain.offer import Offer
from broker.planning.fairness import MaxMinFairness, MinMakespan
from broker.planning.fill import FillJob, next_fill_job
from broker.planning.option_table import PlanItem
from conftest import NOW, make_spec

INF = float("inf")


def test_sjf_runs_the_job_that_finishes_soonest_anywhere():
    queue = [FillJob("long", (50.0, 40.0)), FillJob("short", (9.0, 30.0)), FillJob("mid", (20.0, 20.0))]
    assert next_fill_job(queue, executor=1, busy_s=[0, 0], order="sjf").id == "short"


def test_makespan_prefers_the_job_that_keeps_the_longest_busy_time_down():
    queue = [FillJob("a", (100.0, 10.0)), FillJob("b", (30.0, 90.0))]
    assert next_fill_job(queue, executor=0, busy_s=[0.0, 40.0], order="makespan").id == "b"


def test_deadline_first_runs_the_job_with_least_slack_and_skips_jobs_that_fit_no_window():
    queue = [
        FillJob("loose", (10.0,), deadline_s=500),
        FillJob("tight", (10.0,), deadline_s=30),
        FillJob("big", (INF,), deadline_s=1),
    ]
    assert next_fill_job(queue, executor=0, busy_s=[0.0], order="deadline").id == "tight"
    assert next_fill_job([FillJob("big", (INF,))], executor=0, busy_s=[0.0]) is None


def offer(name, accelerator, price=1.0):
    return Offer(
        cloud="aws",
        region="r",
        zone=name,
        instance_type="x",
        tier=Tier.on_demand,
        accelerator=accelerator,
        accelerator_count=1,
        gpu_memory_gb=80,
        vcpus=8,
        memory_gb=64,
        price_usd_per_h=price,
    )


def test_max_min_fairness_shares_the_fast_offer_so_no_job_is_starved():
    fast, slow = offer("f", "H100"), offer("s", "T4")
    items = [PlanItem(f"j{k}", make_spec(resources={"accelerators": ["H100:1", "T4:1"]})) for k in range(2)]
    plan = MaxMinFairness().plan(items, [fast, slow], {fast.id: 1, slow.id: 1}, NOW)
    assert sorted(plan.assignments.values()) == sorted([fast.id, slow.id])
    assert 0.5 <= plan.objective <= 1.0  # each job gets at least half its best throughput over time


def test_min_makespan_gives_the_fast_offer_to_the_longest_job():
    fast, slow = offer("f", "H100"), offer("s", "A100")
    short = PlanItem("short", make_spec(resources={"accelerators": ["H100:1", "A100:1"]}, work={"gpu_hours": 1}))
    long = PlanItem("long", make_spec(resources={"accelerators": ["H100:1", "A100:1"]}, work={"gpu_hours": 30}))
    plan = MinMakespan().plan([short, long], [fast, slow], {fast.id: 1, slow.id: 1}, NOW)
    assert plan.assignments == {"long": fast.id, "short": slow.id}


def bubble_agent(name="llm-stage0", tier=Tier.bubble):
    stage = offer(name, "A100", price=0.0 if tier == Tier.bubble else 1.0)
    stage = stage.model_copy(update={"tier": tier, "speed_factor": 0.3 if tier == Tier.bubble else 1.0})
    return AgentInfo(id=name, offer=stage, host="h", pid=1, registered_at=NOW)


def fill_item(name, hours, deadline=None, accelerator="A100", fill=True):
    spec = make_spec(name=name, resources={"accelerators": [f"{accelerator}:1"]}, work={"gpu_hours": hours}, fill=fill)
    return PlanItem(name, spec.model_copy(update={"deadline": deadline}))


def test_bubble_executors_take_fill_jobs_in_the_fill_policys_order_and_nothing_else_moves():
    from datetime import timedelta

    from broker.planning.fill import order_bubbles

    stage, spot = bubble_agent(), bubble_agent("spot-a", Tier.spot)
    long_job, short_job = fill_item("long", 8), fill_item("short", 1)
    tight = fill_item("tight", 6, deadline=NOW + timedelta(hours=21))
    on_spot, plain, misfit = (
        fill_item("on-spot", 2),
        fill_item("plain", 1, fill=False),
        fill_item("h100", 0.5, None, "H100"),
    )
    pairs = [(long_job, stage), (on_spot, spot)]
    waiting = [short_job, tight, plain, misfit]
    by_sjf = order_bubbles(pairs, waiting, NOW, "sjf")
    assert [(i.id, a.id) for i, a in by_sjf] == [("on-spot", "spot-a"), ("short", "llm-stage0")]
    by_deadline = order_bubbles(pairs, waiting, NOW, "deadline")
    assert [(i.id, a.id) for i, a in by_deadline] == [("on-spot", "spot-a"), ("tight", "llm-stage0")]
    assert order_bubbles([(on_spot, spot)], waiting, NOW, "sjf") == [(on_spot, spot)]  # no bubble executor idle


def test_the_server_gives_an_idle_bubble_executor_the_fill_job_its_fill_order_picks(store, catalog, tmp_path):
    from broker import planning
    from broker.agents.checkpoints import CheckpointStore
    from broker.agents.contract import Contract
    from broker.core.broker import Broker
    from broker.core.clock import ManualClock
    from broker.core.server import BrokerServer

    clock = ManualClock(NOW)
    Contract(store, "llm-stage0").register(bubble_agent().offer, lease_ms=60_000)
    broker = Broker(store, catalog, planning.get(), clock)
    for name, hours in (("long", 8), ("short", 1)):  # the long one first: the more urgent by submission
        spec = make_spec(name=name, work={"gpu_hours": hours}, fill=True, tiers=["bubble"], deadline="+96h")
        broker.submit(spec, job_id=name)

    def server(order):
        return BrokerServer(store, planning.get(), clock, CheckpointStore(str(tmp_path)), fill_order=order)

    planned = server(None)._plan_page(store.pending_jobs(0, 10), {a.offer.id: [a] for a in store.agents()})
    assert [job.id for job, _ in planned] == ["long"]  # the plan alone gives the executor the more urgent job
    assert server("sjf").dispatch() == [("short", "llm-stage0")]
    with pytest.raises(ValueError, match="fill_order"):
        BrokerServer(store, planning.get(), clock, CheckpointStore(str(tmp_path)), fill_order="fifo")


def test_a_late_fill_job_is_never_run_anyway_on_a_stage_it_was_unfit_for(store, catalog, tmp_path):
    from broker import planning
    from broker.agents.checkpoints import CheckpointStore
    from broker.agents.contract import Contract
    from broker.core.broker import Broker
    from broker.core.clock import ManualClock
    from broker.core.server import BrokerServer

    clock = ManualClock(NOW)
    stage = Contract(store, "llm-stage0")
    stage.register(bubble_agent().offer, lease_ms=10**9)
    spec = make_spec(name="fill", work={"gpu_hours": 1}, fill=True, tiers=["bubble"], deadline="+4h")
    Broker(store, catalog, planning.get(), clock).submit(spec, job_id="fill")
    server = BrokerServer(store, planning.get(), clock, CheckpointStore(str(tmp_path)))
    assert server.dispatch() == [("fill", "llm-stage0")]
    given = stage.take(block_ms=None)
    stage.started(given)
    stage.exited("fill", given.fence, "unfit")  # none of its configurations fits the stage's windows
    server.round(block_ms=10)
    assert store.get_job("fill").pending and store.get_job("fill").unfit_zones == ["llm-stage0"]
    slow = bubble_agent("llm-stage1").offer.model_copy(update={"speed_factor": 0.1})
    Contract(store, "llm-stage1").register(slow, lease_ms=10**9)  # another stage, a third as fast
    clock.advance(hours=6)  # past its deadline: the planner cannot meet it, and the server runs such jobs anyway,
    idle = {a.offer.id: [a] for a in store.agents()}  # where it finishes first, but not where it cannot run
    assert [(job.id, agent.id) for job, agent in server._plan_page(store.pending_jobs(0, 10), idle)] == [
        ("fill", "llm-stage1")
    ]
