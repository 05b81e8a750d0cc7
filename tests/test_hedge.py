"""The hedge policy (planning/hedge.py): waits out a gap as long as the market model's spells say the slack
affords, then pays on-demand; leaves on-demand when spot is worth its changeovers. Its rule is the one the
quote's futures play (models/futures.Hedge)."""

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest
from test_guard_returns import run_an_hour
from test_market_model import trace
from test_uniform_progress import offer

from broker import planning
from broker.agents.checkpoints import CheckpointStore
from broker.agents.contract import Contract
from broker.core.broker import Broker
from broker.core.clock import SimulatedClock
from broker.core.server import BrokerServer
from broker.domain.model import AgentInfo, Tier
from broker.models.futures import Hedge
from broker.planning.hedge import HedgePolicy
from broker.planning.option_table import PlanItem
from broker.planning.uniform_progress import Move, Progress, UniformProgress
from broker.pricing.availability import MarketModel
from broker.store.jobs import Store
from conftest import NOW, make_spec

TICK_H = 0.1
GAPS_OF_3_H = Hedge.from_spells(np.full(20, 100), np.full(20, 30), TICK_H, 200, (10.0,))  # up 10 h, down 3 h


def idle_for(hours: float, window_h: float = 12.0) -> tuple[Progress, PlanItem]:
    """A job with 10 h of work, idle since it was submitted `hours` ago (nothing done yet)."""
    progress = Progress(total_h=10.0, done_h=0.0, elapsed_h=hours, window_h=window_h, changeover_h=0.2)
    return progress, PlanItem("j", make_spec(deadline="+12h"), idle_since=NOW - timedelta(hours=hours))


def test_hedge_waits_out_a_gap_while_the_slack_affords_it_where_uniform_progress_pays_at_once():
    hedge = HedgePolicy(hedge=lambda spec: GAPS_OF_3_H)
    early, item = idle_for(0.2)  # slack 1.4 h for about one more gap: it may wait ~1.1 h of it
    assert hedge.idle_move(item, early, False, NOW) == Move.wait
    assert UniformProgress().idle_move(item, early, False, NOW) == Move.on_demand  # behind ep(t) already
    late, item = idle_for(0.8)  # the gap has lasted longer than the 0.6 h the slack now affords
    assert hedge.idle_move(item, late, False, NOW) == Move.on_demand
    assert hedge.idle_move(item, late, True, NOW) == Move.spot  # spot now: take it


def test_hedge_waits_longer_in_a_market_of_short_gaps_and_keeps_the_safety_net():
    short = Hedge.from_spells(np.full(20, 100), np.full(20, 2), TICK_H, 200, (10.0,))  # gaps of 0.2 h
    progress, item = idle_for(0.8)
    assert HedgePolicy(hedge=lambda spec: short).idle_move(item, progress, False, NOW) == Move.wait
    net, item = idle_for(1.5)  # time left 10.5 h < 10 h of work + 2d: on-demand whatever the market says
    assert HedgePolicy(hedge=lambda spec: short).idle_move(item, net, False, NOW) == Move.on_demand


def test_without_a_market_model_hedge_is_uniform_progress():
    progress, item = idle_for(0.2)
    assert HedgePolicy().idle_move(item, progress, False, NOW) == UniformProgress().idle_move(
        item, progress, False, NOW
    )


def test_hedge_leaves_on_demand_only_when_a_spell_on_spot_pays_for_the_changeovers():
    spot, od = offer("s", Tier.spot, 1.0), offer("o", Tier.on_demand, 3.0)
    progress, item = idle_for(0.2, window_h=20.0)
    assert HedgePolicy(hedge=lambda spec: GAPS_OF_3_H).leaves_on_demand(item, progress, spot, od, NOW)
    flicker = Hedge.from_spells(np.full(20, 1), np.full(20, 1), TICK_H, 200, (0.1,))  # up-spells of 0.1 h
    assert not HedgePolicy(hedge=lambda spec: flicker).leaves_on_demand(item, progress, spot, od, NOW)
    tight, item = idle_for(1.0, window_h=11.5)  # slack 0.1 h: no room for the changeover back
    assert not HedgePolicy(hedge=lambda spec: GAPS_OF_3_H).leaves_on_demand(item, tight, spot, od, NOW)
    # slack 0.4 h: room for the changeover, not also for the guard's pass that the planner keeps for a start on spot
    roomy, item = idle_for(1.0, window_h=11.8)
    assert HedgePolicy(hedge=lambda spec: GAPS_OF_3_H).leaves_on_demand(item, roomy, spot, od, NOW)
    long_pass = replace(roomy, pass_h=0.25)
    assert not HedgePolicy(hedge=lambda spec: GAPS_OF_3_H).leaves_on_demand(item, long_pass, spot, od, NOW)


def test_the_plan_counts_the_wait_from_when_the_job_became_idle():
    spot, od = offer("s", Tier.spot, 1.0), offer("o", Tier.on_demand, 3.0)
    long_gaps = Hedge.from_spells(np.full(20, 100), np.full(20, 1000), TICK_H, 2000, (10.0,))  # down 100 h
    policy = planning.get("hedge", hedge=lambda spec: long_gaps)
    spec = make_spec(work={"gpu_hours": 10}, deadline="+13h")  # 10 h on on-demand; slack 2.6 h at NOW
    submitted = NOW - timedelta(hours=5)
    fresh = PlanItem("fresh", spec, submitted_at=submitted, idle_since=NOW)  # just preempted
    stuck = PlanItem("stuck", spec, submitted_at=submitted, idle_since=submitted)  # waiting for 5 h
    plan = policy.plan([fresh, stuck], [spot, od], {spot.id: 0}, NOW)
    assert plan.assignments == {"stuck": od.id} and plan.unplaced == {"fresh": "waiting for spot"}


def test_a_job_waiting_behind_other_jobs_follows_uniform_progress_not_the_markets_gaps():
    """Idle because the fleet's spot agents are all busy is a queue, not a market gap: the market's short gaps say
    wait, Uniform Progress (behind ep(t)) says on-demand, and the plan takes Uniform Progress's move."""
    spot, od = offer("s", Tier.spot, 1.0), offer("o", Tier.on_demand, 3.0)
    spec = make_spec(work={"gpu_hours": 10}, deadline="+13h")
    item = PlanItem("j", spec, submitted_at=NOW - timedelta(hours=0.5), idle_since=NOW - timedelta(hours=0.5))
    busy = {spot.id: 0}  # its spot agent is taken
    market_gap = planning.get("hedge", hedge=lambda spec: GAPS_OF_3_H, live_spot=lambda: [])
    assert market_gap.plan([item], [spot, od], busy, NOW).unplaced == {"j": "waiting for spot"}
    agent = AgentInfo(id="a", offer=spot, host="test", pid=0, registered_at=NOW)
    queued = planning.get("hedge", hedge=lambda spec: GAPS_OF_3_H, live_spot=lambda: [agent])
    assert queued.plan([item], [spot, od], busy, NOW).assignments == {"j": od.id}


def test_the_quotes_futures_play_the_same_split_between_a_queue_and_a_market_gap():
    from test_futures import _setting

    from broker.models.contention import launchable
    from broker.models.futures import simulate

    available = np.ones((1, 1, 200), dtype=bool)  # the market always has capacity ...
    held = launchable(available, np.array([1]), np.array([60]))  # ... and another job holds it for 10 h
    hedge = _setting(rule="hedge", window_h=14.0)
    queued = simulate(hedge, available, 1 / 6, GAPS_OF_3_H, launchable=held)  # behind ep(t): on-demand at once
    gap = simulate(hedge, held, 1 / 6, GAPS_OF_3_H)  # the same 10 h with no capacity at all: it waits a* first
    assert queued.od_h[0] > gap.od_h[0] > 0


@pytest.mark.parametrize("name, moves", [("hedge", True), ("uniform-progress", False)])
def test_the_guard_moves_a_hedge_job_on_spot_to_a_cheaper_zone_that_comes_back(
    redis_url, catalog, tmp_path, name, moves
):
    store, clock = Store(redis_url, prefix=f"zone-{name}:"), SimulatedClock(NOW)
    up_10_h = Hedge(np.arange(50) * 0.1, 10.0, (), 0.1)  # up-spells of 10 h everywhere
    policy = planning.get(name, **({"hedge": lambda spec: up_10_h} if name == "hedge" else {}))
    server = BrokerServer(store, policy, clock, CheckpointStore(str(tmp_path)), consumer="test")
    l4 = sorted(
        (o for o in catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1 and o.tier == Tier.spot),
        key=lambda o: o.price_usd_per_h,
    )
    cheap, dear = l4[0], l4[-1]
    assert dear.price_usd_per_h > 1.5 * cheap.price_usd_per_h
    running = Contract(store, "dear")
    running.register(dear, 10**10, host="test", pid=0, at=clock.now())
    spec = make_spec(resources={"accelerators": ["L4:1"]}, work={"gpu_hours": 8}, deadline="+40h")
    Broker(store, catalog, policy, clock).submit(spec, job_id="j")
    assert server.step() == [("j", "dear")]
    assignment = run_an_hour(running, clock, 100)
    Contract(store, "cheap").register(cheap, 10**10, host="test", pid=0, at=clock.now())
    server.step()
    job = store.get_job("j")
    assert job.move_requested == moves and job.pinned_tier is None
    if moves:
        assert f"to a cheaper zone, {cheap.zone or cheap.region} (hedge's rule)" in job.reason
        running.exited("j", assignment.fence, "moved", at=clock.now().timestamp())
        assert server.step() == [("j", "cheap")]


def test_the_guard_does_not_move_a_job_to_a_cheaper_hour_on_slower_gpus(redis_url, catalog, tmp_path):
    store, clock = Store(redis_url, prefix="slower:"), SimulatedClock(NOW)
    up_10_h = Hedge(np.arange(50) * 0.1, 10.0, (), 0.1)
    policy = planning.get("hedge", hedge=lambda spec: up_10_h)
    server = BrokerServer(store, policy, clock, CheckpointStore(str(tmp_path)), consumer="test")
    spot = sorted((o for o in catalog.offers if o.tier == Tier.spot), key=lambda o: o.price_usd_per_h)
    l4 = next(o for o in reversed(spot) if o.accelerator == "L4" and o.accelerator_count == 1)
    t4 = next(o for o in spot if o.accelerator == "T4" and o.accelerator_count == 1)  # half an L4's speed
    assert t4.price_usd_per_h < 0.5 * l4.price_usd_per_h  # cheaper by the hour than the L4 it runs on
    running = Contract(store, "l4")
    running.register(l4, 10**10, host="test", pid=0, at=clock.now())
    spec = make_spec(resources={"accelerators": ["L4:1", "T4:1"]}, work={"gpu_hours": 8}, deadline="+40h")
    Broker(store, catalog, policy, clock).submit(spec, job_id="j")
    assert server.step() == [("j", "l4")]
    run_an_hour(running, clock, 100)
    Contract(store, "t4").register(t4, 10**10, host="test", pid=0, at=clock.now())
    server.step()
    assert not store.get_job("j").move_requested


def test_the_guard_takes_a_job_back_from_on_demand_only_where_it_runs_as_fast_as_planned(redis_url, catalog, tmp_path):
    store, clock = Store(redis_url, prefix="back-pace:"), SimulatedClock(NOW)
    market = Hedge(np.arange(50) * 100.0, 100.0, (), 100.0)  # up-spells of 100 h: spot is worth going back to
    policy = planning.get("hedge", hedge=lambda spec: market)
    server = BrokerServer(store, policy, clock, CheckpointStore(str(tmp_path)), consumer="test")
    cheapest = {
        (a, t): min(
            (o for o in catalog.offers if o.accelerator == a and o.accelerator_count == 1 and o.tier == t),
            key=lambda o: o.price_usd_per_h,
        )
        for a in ("L4", "T4")
        for t in (Tier.spot, Tier.on_demand)
    }
    on_demand = Contract(store, "od")
    on_demand.register(cheapest["L4", Tier.on_demand], 10**10, host="test", pid=0, at=clock.now())
    # 2 GPU-hours: 5.2 h on an L4, 9.6 h on a T4, so a deadline in 8 h leaves only the L4
    spec = make_spec(resources={"accelerators": ["L4:1", "T4:1"]}, work={"gpu_hours": 2}, deadline="+8h")
    job = Broker(store, catalog, policy, clock).submit(spec, job_id="j")
    assert job.quote.chosen.offer.accelerator == "L4"
    clock.advance(hours=0.5)  # no spot at all: on-demand
    assert server.step() == [("j", "od")]
    assignment = run_an_hour(on_demand, clock, 150)
    for _ in range(2):  # the guard's passes a minute apart now, as live: the pass a return keeps is short
        server.step()
        clock.advance(minutes=1)
    for name, accelerator in (("t4", "T4"), ("l4", "L4")):  # the T4's hour is the cheaper one
        Contract(store, name).register(cheapest[accelerator, Tier.spot], 10**10, host="test", pid=0, at=clock.now())
    assert cheapest["T4", Tier.spot].price_usd_per_h < cheapest["L4", Tier.spot].price_usd_per_h
    server.step()
    assert store.get_job("j").move_requested
    on_demand.exited("j", assignment.fence, "moved", at=clock.now().timestamp())
    assert server.step() == [("j", "l4")]


def test_the_broker_hands_a_hedge_policy_the_market_models_view_of_each_jobs_spot_zones(catalog):
    model = MarketModel.fit([trace("us-east-1a", [1] * 6 + [0] * 12, 200)])
    policy = planning.get("hedge")
    Broker(None, catalog, policy, SimulatedClock(NOW), lambda: model)
    spec = make_spec(resources={"accelerators": ["L4:1"]}, deadline="+12h")
    view = policy.hedge(spec)
    spot = sorted(
        (o for o in catalog.offers if o.tier == Tier.spot and o.accelerator == "L4" and o.accelerator_count == 1),
        key=lambda o: o.price_usd_per_h,
    )
    assert view.zones == tuple(o.id for o in spot[:12]) and view.tick_h == model.tick_h
    assert view.zone_up_h[0] == model.for_offer(spot[0]).mean_up_h
    assert policy.hedge(spec.model_copy(update={"name": "another"})) is view  # sampled once per set of zones
    assert policy.hedge(spec.model_copy(update={"tiers": [Tier.on_demand]})) is None
    assert policy.live_spot is None  # no store: no fleet to tell a queue from a market gap


def test_the_broker_tells_the_policy_its_live_spot_agents_read_at_most_once_a_second(store, catalog):
    from test_market_model import _offer

    clock = SimulatedClock(NOW)
    policy = planning.get("hedge")
    Broker(store, catalog, policy, clock)
    Contract(store, "a").register(_offer("us-east-1a"), 60_000, host="test", pid=0, at=NOW)
    Contract(store, "od").register(_offer("us-east-1z", "on_demand", 3.06), 60_000, host="test", pid=0, at=NOW)
    assert [a.offer.zone for a in policy.live_spot()] == ["us-east-1a"]  # spot only
    Contract(store, "b").register(_offer("us-east-1b"), 60_000, host="test", pid=0, at=NOW)
    assert len(policy.live_spot()) == 1  # the same second: as read
    clock.advance(seconds=1)
    assert sorted(a.offer.zone for a in policy.live_spot()) == ["us-east-1a", "us-east-1b"]


def test_the_idle_time_per_gap_is_the_mean_of_each_spell_capped_at_the_wait():
    """Hedge.idle_h[a] = E[min(D, a)] over the no-capacity spells, from sorted sums (hedge_view.mean_capped): the
    same to the bit as every spell capped at every wait and averaged, for spells of whole ticks."""
    from broker.models.hedge_view import mean_capped

    rng = np.random.default_rng(7)
    for n in (1, 3, 500):
        spells = np.floor(rng.pareto(1.2, n) * 20 + 1)  # heavy-tailed, as the traces' gaps
        capped = np.minimum(spells[None, :], np.arange(301)[:, None]).mean(axis=1)
        assert np.array_equal(mean_capped(spells, 300), capped)
        assert np.array_equal(Hedge.from_spells(spells, spells, 0.1, 300).idle_h, capped * 0.1)
    assert mean_capped(np.array([2.0, 4.0]), 5).tolist() == [0.0, 1.0, 2.0, 2.5, 3.0, 3.0]
    assert mean_capped(np.array([]), 2).tolist() == [0.0, 0.0, 0.0]
