"""The backtest: the live core on a simulated clock and cloud over real traces, every baseline, the bound."""

import json
from datetime import UTC, datetime

import numpy as np
import pytest

from broker.core import broker as core_broker
from broker.domain.errors import BrokerError, InfeasibleError
from broker.domain.model import JobState
from broker.models.risk import exclusive_hours, restart_hours
from broker.pricing.traces import Trace
from broker.sim import backtest
from broker.sim.fleet import PROGRESS_UNITS
from broker.sim.market import PACKAGED_TRACES, Market, SpotSeries, from_traces, resample, trace_start
from broker.sim.omniscient import joint, joint_schedule, omniscient
from broker.sim.workloads import FREERIDE_MAIN_JOBS, ml_mix
from conftest import make_spec

START = datetime(2023, 2, 15, tzinfo=UTC)
POLICIES = [*backtest.DEFAULT_POLICIES, backtest.OMNISCIENT]


@pytest.fixture(scope="module")
def market(catalog):
    market = from_traces(PACKAGED_TRACES, catalog, START, tick_s=1200)
    return market.with_bubbles([o for main in FREERIDE_MAIN_JOBS for o in main.offers(START)])


def workload(seed, jobs=6, speed_sigma=0.0):
    """The policies' logic is specified where the planner's speed estimate is the truth; the honest world
    (jobs off their estimate) has its own test below."""
    return ml_mix(seed, jobs, 3.06, arrival_h=12, speed_sigma=speed_sigma)


@pytest.fixture(scope="module")
def results(market, redis_server):
    """Every policy and the bound over two seeds of a small ML mix."""
    return {seed: backtest.run(market, workload(seed), POLICIES, seed, redis_server) for seed in (0, 1)}


def test_omniscient_costs_no_more_than_any_policy_for_every_job_it_finishes_on_time(results):
    for result in results.values():
        for outcome in result.outcomes:
            for name, cost in outcome.on_time().items():
                bound = result.bound[name]
                assert bound.status in ("optimal", "dual bound")
                assert bound.cost_usd <= cost * (1 + 1e-6) + 1e-6, (outcome.policy, name, bound, cost)
        optimum = next(r for r in result.rows if r["policy"] == backtest.OMNISCIENT)
        joint = next(r for r in result.rows if r["policy"] == backtest.JOINT)
        schedule = next(r for r in result.rows if r["policy"] == backtest.SCHEDULE)
        for row in result.rows:
            if row["deadline_misses"] == 0 and row["policy"] not in (backtest.OMNISCIENT, backtest.JOINT):
                assert optimum["cost_usd"] <= row["cost_usd"] + 0.01, row
                assert joint["cost_usd"] <= row["cost_usd"] + 0.01, row
                assert row["cost_vs_joint_omniscient"] >= 1.0 - 1e-3, row
        # a schedule of the jobs together costs at least what the bounds say any schedule must
        assert result.schedule.status == "schedule" and schedule["cost_vs_joint_omniscient"] >= 1.0 - 1e-3
        assert schedule["cost_usd"] >= optimum["cost_usd"] - 0.01


def test_the_joint_bound_counts_the_capacity_jobs_share(market):
    """Two jobs, one spot instance, too little time to take turns: per job each has it to itself; together
    they must pay on-demand for the work the one instance cannot do, and the joint bound says so."""
    spot = market.spot[0].offer
    od = next(o for o in market.on_demand if o.instance_type == spot.instance_type)
    alone = Market(START, market.tick_s, [SpotSeries(spot, np.ones(100, dtype=int), "one")], [od])
    spec = make_spec(now=START, resources={"accelerators": ["V100:1"]}, work={"gpu_hours": 1.0})
    window_h = 1.5 * (exclusive_hours(spec, od) + restart_hours(spec))
    each = omniscient(spec, window_h, alone, 0, bubbles=False)
    both = joint([(spec, window_h, 0, 1.0), (spec, window_h, 0, 1.0)], alone, bubbles=False)
    assert each.tier_hours["on_demand"] < 1e-9 and both.status == "LP relaxation"
    assert both.cost_usd > 2 * each.cost_usd * 1.5  # one of the two pays on-demand for much of its work
    assert both.tier_hours["on_demand"] >= 2 * exclusive_hours(spec, od) - window_h - 1e-6  # spot: one at a time
    # a schedule of the two: one instance, held by one job a tick; the other job pays on-demand for what it misses
    schedule = joint_schedule([(spec, window_h, 0, 1.0), (spec, window_h, 0, 1.0)], alone, bubbles=False)
    assert schedule.status == "schedule" and schedule.tier_hours["spot"] <= window_h + 1e-6
    assert both.cost_usd - 1e-6 <= schedule.cost_usd <= 2 * each.cost_usd + od.price_usd_per_h * window_h
    # with time to take turns, both run on the one instance, each paying its changeover
    turns = joint_schedule([(spec, 3 * window_h, 0, 1.0), (spec, 3 * window_h, 0, 1.0)], alone, bubbles=False)
    assert turns.tier_hours["on_demand"] == pytest.approx(0.0, abs=1e-6)
    assert turns.cost_usd == pytest.approx(2 * each.cost_usd, rel=1e-6)


def test_all_on_demand_and_uniform_progress_meet_every_feasible_deadline(results):
    for result in results.values():
        by_policy = {o.policy: o for o in result.outcomes}
        for policy in ("on-demand", "uniform-progress"):
            outcome = by_policy[policy]
            assert outcome.refused == []
            assert all(j.state == JobState.done for j in outcome.jobs), policy
            assert outcome.misses() == 0, policy
        assert all(run.offer.tier.value == "on_demand" for job in by_policy["on-demand"].jobs for run in job.runs)


def test_finished_jobs_did_exactly_their_work_and_resumed_from_their_checkpoints(results):
    for outcome in results[0].outcomes:
        for job in outcome.jobs:
            if job.state != JobState.done:
                continue
            last = job.runs[-1]
            assert last.progress_done == pytest.approx(PROGRESS_UNITS) and last.progress_total == PROGRESS_UNITS
            resumed = 0
            for run in job.runs[1:]:
                if run.resume_from:  # resumed from the newest checkpoint the earlier runs saved
                    resumed = max(r.checkpoint_step or 0 for r in job.runs[: job.runs.index(run)])
                    assert f"step-{resumed:012d}" in run.resume_from
                else:
                    resumed = 0
            # the last run did the rest of the work at the model's speed, after its restart
            needed_h = (1 - resumed / PROGRESS_UNITS) * exclusive_hours(job.spec, last.offer) + restart_hours(job.spec)
            one_step_h = exclusive_hours(job.spec, last.offer) / PROGRESS_UNITS  # checkpoint steps are whole units
            assert last.hours(last.ended_at) >= needed_h - one_step_h, (outcome.policy, job.id)


def test_the_same_seed_gives_the_same_result_and_another_seed_another(results, market, redis_server):
    again = backtest.run(market, workload(0), ["costslo", "skypilot-eager"], 0, redis_server)
    first = {r["policy"]: r for r in results[0].rows}
    for row in again.rows:  # (no bound asked for this time)
        bounds = {"cost_vs_omniscient": None, "cost_vs_joint_omniscient": None, "cost_vs_joint_schedule": None}
        assert {**row, **bounds} == {**first[row["policy"]], **bounds}
    assert [r["cost_usd"] for r in results[0].rows] != [r["cost_usd"] for r in results[1].rows]


def test_bubbles_carry_fill_jobs_only_when_the_policy_sees_them(results):
    for result in results.values():
        by_policy = {o.policy: o for o in result.outcomes}
        for policy, outcome in by_policy.items():
            bubble_runs = [(j, r) for j in outcome.jobs for r in j.runs if r.offer.tier.value == "bubble"]
            if not policy.endswith("+bubbles"):
                assert bubble_runs == [], policy
            assert all(j.spec.fill for j, _ in bubble_runs)
    assert any(
        r.offer.tier.value == "bubble" for res in results.values() for j in res.outcomes[-1].jobs for r in j.runs
    )


def test_skypilot_ignores_deadlines_and_never_uses_on_demand(results):
    outcome = next(o for o in results[0].outcomes if o.policy == "skypilot-eager")
    assert all(r.offer.tier.value == "spot" for j in outcome.jobs for r in j.runs)


def test_the_backtest_drives_the_live_core_not_a_copy(market, redis_server, monkeypatch):
    def refuse(self, spec, agents=None):
        raise InfeasibleError("deadline/budget: refused by a patched core")

    monkeypatch.setattr(core_broker.Broker, "quote", refuse)
    result = backtest.run(market, workload(0, jobs=3), ["costslo"], 0, redis_server)
    assert all(len(o.refused) == 3 and o.jobs == [] for o in result.outcomes)


def test_resample_keeps_a_tick_only_when_capacity_lasted_all_of_it():
    trace = Trace(
        "t", "availability", "aws", "us-east-1", "us-east-1a", "p3.2xlarge", 100.0, np.array([1, 1, 0, 1, 1, 1, 2, 2])
    )
    assert resample(trace, 200.0).tolist() == [1, 0, 1, 2]
    assert resample(trace, 50.0).tolist() == [1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2]


def test_offers_yaml_places_traces_and_non_gpu_traces_are_skipped(tmp_path, catalog):
    (tmp_path / "zone-a.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1, 0, 1, 1]}))
    (tmp_path / "cpu.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1, 1]}))
    (tmp_path / "offers.yaml").write_text(
        "zone-a.json: {cloud: aws, region: us-east-2, zone: us-east-2b, instance_type: p3.2xlarge, "
        "spot_usd_per_h: 0.5}\n"
        "cpu.json: {cloud: aws, region: us-east-1, instance_type: r5.16xlarge}\n"
    )
    market = from_traces(tmp_path, catalog, START, tick_s=600, spot_instances=1)
    (series,) = market.spot
    assert series.offer.id == "aws/us-east-2b/p3.2xlarge/spot" and series.offer.price_usd_per_h == 0.5
    assert series.capacity.tolist() == [1, 0, 1, 1] and series.at(10) == 0
    assert [o.id for o in market.on_demand] == ["aws/us-east-2/p3.2xlarge/on_demand"]
    assert "r5.16xlarge" in market.skipped[0]
    (tmp_path / "cpu.json").unlink()
    (tmp_path / "offers.yaml").write_text("zone-a.json: {cloud: aws}\n")
    with pytest.raises(BrokerError, match="offers.yaml: zone-a.json needs region, instance_type"):
        from_traces(tmp_path, catalog, START)


def test_workloads_are_seeded_and_deadlines_feasible_on_demand():
    a, b = ml_mix(3, 20, 3.06), ml_mix(3, 20, 3.06)
    assert a == b and a != ml_mix(4, 20, 3.06)
    for arrival in a:
        fraction = (exclusive_hours(arrival.spec, _v100_on_demand()) + restart_hours(arrival.spec)) / arrival.window_h
        assert 0 < fraction < 1 if arrival.spec.fill else 0.55 < fraction < 0.9


def test_a_workload_with_repeats_runs_earlier_jobs_again_as_jobs_of_their_own(market, redis_server):
    plain, again = ml_mix(5, 12, 3.06, arrival_h=12), ml_mix(5, 12, 3.06, arrival_h=12, repeats=0.5)
    repeated = [a for a in again if a.job_id]
    assert 2 <= len(repeated) <= 10 and len({a.id for a in again}) == 12  # each its own job id
    for mine, first in zip(again, plain):
        assert mine == first or mine.at_h == first.at_h and mine.job_id.startswith(f"{mine.spec.name}-again-")
    speeds = {a.spec.name: a.true_speed for a in plain}
    for arrival in repeated:  # the earlier job's spec and speed, within a few percent
        assert arrival.true_speed == pytest.approx(speeds[arrival.spec.name], rel=0.15)
    result = backtest.run(market, again, ["on-demand"], 0, redis_server)
    assert sorted(j.id for j in result.outcomes[0].jobs) == sorted(a.id for a in again)


def _v100_on_demand():
    from broker.domain.model import Tier
    from broker.domain.offer import Offer

    return Offer(
        cloud="aws",
        region="us-east-1",
        zone=None,
        instance_type="p3.2xlarge",
        tier=Tier.on_demand,
        accelerator="V100",
        accelerator_count=1,
        gpu_memory_gb=16,
        vcpus=8,
        memory_gb=61,
        price_usd_per_h=3.06,
    )


def test_trace_start_reads_the_directory_date():
    assert trace_start(PACKAGED_TRACES) == START


def test_jobs_run_at_their_true_speed_which_the_quote_does_not_know(market, redis_server):
    arrivals = workload(0, jobs=3, speed_sigma=0.3)
    assert len({round(a.true_speed, 3) for a in arrivals}) == 3
    result = backtest.run(market, arrivals, ["on-demand"], 0, redis_server)
    speed = {a.spec.name: a.true_speed for a in arrivals}
    for job in result.outcomes[0].jobs:
        run = job.runs[-1]
        planned_h = exclusive_hours(job.spec, run.offer) + restart_hours(job.spec)
        real_h = exclusive_hours(job.spec, run.offer) / speed[job.id] + restart_hours(job.spec)
        assert run.hours(run.ended_at) == pytest.approx(real_h, rel=1e-3) != pytest.approx(planned_h, rel=1e-3)


def test_a_warm_broker_starts_with_another_backtest_s_jobs_and_learns_their_speeds(market, redis_server):
    """A backtest's broker started with an empty store: its first quotes knew no measured speed, as a live broker's
    do only on its first day (bench/forecast.py --warm)."""
    from datetime import timedelta

    from broker.core.fleet import Fleet
    from broker.sim.history import warm_history

    earlier = backtest.run(market, workload(5, jobs=4, speed_sigma=0.3), ["on-demand"], 5, redis_server)
    history = warm_history(earlier.outcomes[0].jobs, market.start)
    assert len(history) == 4 and all(
        j.id.startswith("history-") and j.spec.name.startswith("history-") for j in history
    )
    assert max(max([j.updated_at, *(r.ended_at for r in j.runs)]) for j in history) == market.start - timedelta(
        minutes=1
    )

    def spans(jobs):
        return sorted((r.ended_at - r.started_at, r.cost_usd) for j in jobs for r in j.runs)

    assert spans(history) == spans(earlier.outcomes[0].jobs)  # moved in time, not changed
    assert not any(r.on_cloud for j in history for r in j.runs)  # another market's runs: no evidence of this one
    assert Fleet.of([], [], market.start, []).bias == {}
    assert sum(n for _, n in Fleet.of([], [], market.start, history).bias.values()) == 4  # each one's speed measured
    arrivals = workload(0, jobs=3)
    warm = backtest.run(market, arrivals, ["on-demand"], 0, redis_server, history=history).outcomes[0]
    assert sorted(j.id for j in warm.jobs) == sorted(a.id for a in arrivals)  # the history is not the outcome's
