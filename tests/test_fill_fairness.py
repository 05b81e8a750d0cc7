"""Fill-queue ordering (PipeFill's scores) and Gavel's alternative objectives."""

from broker.domain.model import Offer, Tier
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
