"""The market model learns from the spot capacity our own fleet had: the server records it, quotes read it."""

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from test_market_model import _offer, trace
from test_quotes import _quote_spec

from broker import planning
from broker.agents.checkpoints import CheckpointStore
from broker.agents.contract import Contract
from broker.core.broker import Broker
from broker.core.clock import SimulatedClock
from broker.core.forecast import _taken_back
from broker.core.server import BrokerServer
from broker.pricing.availability import MarketModel, seen_counts
from broker.sim.market import OfferBook
from broker.store.capacity import CapacityHistory

NOW = datetime(2023, 2, 15, tzinfo=UTC)
ZONE = ("aws", "us-east-1a", "p3.2xlarge")


def test_a_change_log_is_read_as_the_traces_are_a_tick_is_up_only_when_it_lasted_all_of_it():
    points = [(0.0, 2), (1000.0, 0), (1500.0, 3)]  # two agents, none from 1000 s, three from 1500 s
    assert seen_counts(points, 0.0, 3000.0, 600.0).tolist() == [2, 0, 0, 3, 3]  # the least count in each tick
    assert (seen_counts(points, 1200.0, 3000.0, 600.0) > 0).tolist() == [False, True, True]  # from `since` on
    assert seen_counts([(2000.0, 1)], 0.0, 3000.0, 600.0).tolist() == [1]  # from when the zone was first seen


def test_what_our_fleet_saw_lately_outweighs_old_traces():
    calm = MarketModel.fit([trace("us-east-1a", [1] * 60 + [0] * 6, 50)])  # up 10 h, down 1 h
    flaky = np.tile([True] + [False] * 2, 48)  # seen for a day: up 10 minutes, down 20
    learned = calm.with_recent({ZONE: flaky}).zones[ZONE]
    before = calm.zones[ZONE]
    assert before.mean_up_h == pytest.approx(10.0) and learned.mean_up_h < 0.6  # 96% ours, 4% the traces'
    assert before.p_launch > 0.9 and learned.p_launch < 0.65
    assert learned.recent_weight == pytest.approx(96 / 100) and "96 spells our fleet saw in 24 h" in learned.evidence
    assert learned.sample(np.random.default_rng(0), 200, 144).mean() < 0.65
    unseen = calm.with_recent({("aws", "us-west-2a", "p3.2xlarge"): flaky}).zones[("aws", "us-west-2a", "p3.2xlarge")]
    assert unseen.mean_up_h < before.mean_up_h / 2  # a zone without traces: its siblings' spells, then what we saw


def test_a_pool_our_fleet_saw_shrink_without_emptying_preempts_in_the_quotes_futures():
    calm = MarketModel.fit([trace("us-east-1a", [1] * 60 + [0] * 6, 50)])  # a 1-node trace: no pool to see
    pool = np.tile([16] * 9 + [8], 14)  # a day of our 16 agents there, half of them gone one tick in ten
    learned = calm.with_recent({ZONE: pool}).zones[ZONE]
    assert calm.zones[ZONE].shrink == 0.0 and learned.shrink == pytest.approx(0.5 * 14 / 139)
    assert "its pool shrinking by 30% an hour while up" in learned.evidence
    assert calm.with_recent({ZONE: (pool > 0).astype(int)}).zones[ZONE].shrink == 0.0  # one agent shows no pool
    up = learned.sample(np.random.default_rng(0), 500, 144)[None]
    survives = _taken_back(np.random.default_rng(1), up, [learned])
    assert survives.mean() == pytest.approx(up.mean() * (1 - learned.shrink), rel=0.05) and not (survives & ~up).any()
    assert _taken_back(np.random.default_rng(1), up, [calm.zones[ZONE]]) is up  # no pool seen: nothing taken back


def test_the_server_records_each_zones_live_spot_agents_and_a_zone_left_empty(store, tmp_path):
    clock = SimulatedClock(NOW)
    server = BrokerServer(store, planning.get("costslo"), clock, CheckpointStore(str(tmp_path)))
    spot, od = _offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)
    agents = {name: Contract(store, name) for name in ("a", "b", "c", "local")}
    for contract, offer in zip(agents.values(), (spot, spot, od, spot)):
        contract.register(offer, 3_600_000, host="test", pid=0, at=NOW, on_cloud=contract.id != "local")
    server.reclaim_lost()
    history = CapacityHistory(store)
    assert history.seen(NOW) == {ZONE: [(NOW.timestamp(), 2.0)]}  # on-demand is no market evidence, nor a stand-in
    clock.advance(hours=1)
    agents["a"].leave()  # a notice: its instance is going away
    server.reclaim_lost()
    clock.advance(hours=1)
    agents["b"].remove()
    server.reclaim_lost()
    server.reclaim_lost()  # nothing changed: nothing written
    hour = 3600.0
    assert history.seen(NOW) == {
        ZONE: [(NOW.timestamp(), 2.0), (NOW.timestamp() + hour, 1.0), (NOW.timestamp() + 2 * hour, 0.0)]
    }
    assert history.seen(NOW + timedelta(minutes=90)) == {
        ZONE: [(NOW.timestamp() + hour, 1.0), (NOW.timestamp() + 2 * hour, 0.0)]
    }


def test_a_quote_learns_the_capacity_our_fleet_had_where_the_traces_said_calm(store):
    """The traces say the zone is up ten hours at a time; for the last day our agents there came and went every
    half hour. The quote's futures follow what the fleet saw: less of the work on spot, a dearer median."""
    spot, od = _offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)
    calm = MarketModel.fit([trace("us-east-1a", [1] * 60 + [0] * 6, 50)])
    clock = SimulatedClock(NOW)
    broker = Broker(store, OfferBook([spot, od]), planning.get("cbl-greedy"), clock, calm)
    before = broker.quote(_quote_spec(30.0).model_copy(update={"deadline": NOW + timedelta(hours=30)})).forecast
    history = CapacityHistory(store)
    agent = Contract(store, "a")
    agent.register(spot, 3_600_000, host="test", pid=0, at=NOW)
    info = store.get_agent("a")
    for tick in range(144):  # a day of 10-minute ticks: up one in three
        history.record(NOW + timedelta(minutes=10 * tick), [info] if tick % 3 == 0 else [])
    clock.advance(hours=24)
    spec = _quote_spec(30.0).model_copy(update={"deadline": clock.now() + timedelta(hours=30)})
    after = broker.quote(spec).forecast
    assert after.cost_p50_usd > 1.2 * before.cost_p50_usd and after.finish_p50 - clock.now() > before.finish_p50 - NOW
    assert "spells our fleet saw in 24 h" in after.evidence
    assert broker.market_now() is broker.market_now()  # learned again once a tick, not per quote
    assert broker.market_now().zones[ZONE].recent_weight == pytest.approx(96 / 100)


def test_a_quotes_money_model_reads_the_zones_share_of_time_up_the_market_model_learned(store):
    """The catalog's availability and hazard are its region's means of traces; the quote's choice reads the zone's
    own spells up and down, and once our fleet saw the zone come and go, those, as the quote's futures do."""
    spot, od = _offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)  # the catalog says 0.9
    untraced = spot.model_copy(update={"instance_type": "g5.xlarge", "availability": 0.62, "price_usd_per_h": 0.91})
    calm = MarketModel.fit([trace("us-east-1a", [1] * 60 + [0] * 6, 50)])  # up 10 h, down 1 h
    clock = SimulatedClock(NOW)
    broker = Broker(store, OfferBook([spot, od, untraced]), planning.get("cbl-greedy"), clock, calm)
    spec = _quote_spec(30.0).model_copy(update={"deadline": NOW + timedelta(hours=30)})
    before = {o.id: o.availability for o in broker.offers([])}
    assert before[spot.id] == pytest.approx(10 / 11) and before[od.id] == 1.0
    assert before[untraced.id] == 0.62  # no trace of its type: the hazard model's stands
    quoted = broker.quote(spec).chosen
    history = CapacityHistory(store)
    agent = Contract(store, "a")
    agent.register(spot, 3_600_000, host="test", pid=0, at=NOW)
    for tick in range(144):  # a day of 10-minute ticks: up one in four
        history.record(NOW + timedelta(minutes=10 * tick), [store.get_agent("a")] if tick % 4 == 0 else [])
    clock.advance(hours=24)
    after = {o.id: o.availability for o in broker.offers([])}
    assert after[spot.id] == pytest.approx(broker.market_now().zones[ZONE].p_launch) and after[spot.id] < 0.6
    assert next(o for o in broker.offers([]) if o.id == spot.id).hazard_per_h > 1.0  # its runs last minutes, not 10 h
    spec = spec.model_copy(update={"deadline": clock.now() + timedelta(hours=30)})
    requoted = broker.quote(spec).chosen
    assert quoted.offer.id == spot.id and requoted.offer.id == untraced.id  # a zone that is seldom up is dearer


def test_a_zone_a_provisioner_keeps_a_pool_in_is_recorded_down_until_an_agent_comes(store, tmp_path):
    """A pool that never got an instance is evidence too: recorded at 0 from the server's next check."""
    server = BrokerServer(store, planning.get("costslo"), SimulatedClock(NOW), CheckpointStore(str(tmp_path)))
    history = CapacityHistory(store)
    server.reclaim_lost()
    assert history.seen(NOW) == {}  # no agent seen, no pool: nothing known
    history.watch([_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)])  # on-demand is no market
    server.reclaim_lost()
    assert history.seen(NOW) == {ZONE: [(NOW.timestamp(), 0.0)]}


def test_a_zones_futures_go_on_from_the_spell_our_fleet_saw_it_in_as_long_as_that_has_lasted():
    """Heavy tails: of down-spells of 1, 3, 10, 30 and 100 ticks, one that has lasted 50 is the 100-tick kind."""
    pattern = [v for down in (1, 3, 10, 30, 100) for v in [1] * 20 + [0] * down]
    model = MarketModel.fit([trace("us-east-1a", pattern, 4)])
    rng = np.random.default_rng(0)
    down_50 = model.with_recent({ZONE: np.r_[[1] * 10, [0] * 50]}).zones[ZONE]
    assert down_50.current == (False, 50) and "2 spells our fleet saw in 10 h (weight 0.33), down the last 8.3 h" in (
        down_50.evidence
    )
    futures = down_50.sample(rng, 1000, 144, up_now=False, aged=True)
    assert not futures[:, :50].any() and futures[:, 50].all()  # down 50 ticks more, in every future
    just_down = model.with_recent({ZONE: np.ones(60)}).zones[ZONE].sample(rng, 1000, 144, up_now=False, aged=True)
    assert just_down[:, 10].mean() > 0.45  # a spell begun now: drawn whole, 3 in 5 of them 10 ticks or less
    unaged = down_50.sample(rng, 1000, 144, up_now=False)  # the age unknown: where now falls in a spell at random
    assert 0.1 < unaged[:, :50].any(axis=1).mean() < 0.9
    oldest = model.with_recent({ZONE: np.zeros(300)}).zones[ZONE]  # longer than any spell known
    assert oldest.current == (False, 300)
    assert (~oldest.sample(rng, 1000, 144, up_now=False, aged=True)[:, :24]).all(axis=1).mean() > 0.8


def test_only_an_agent_watching_its_clouds_notices_is_market_evidence(store, tmp_path):
    """`broker run` and the demo start local agents that stand for a spot offer: their uptime and their runs without
    a preemption say nothing of that market, and counted, a user's local tries made the zone look calm."""
    from test_quotes import _quote

    from broker.agents.agent import Agent
    from broker.agents.notices import watcher
    from broker.domain.model import Job, Run

    spot = _offer("us-east-1a")
    for name, notices in (("cloud", watcher("aws=http://127.0.0.1:9")), ("local", watcher("none"))):
        Agent(store, name, spot, str(tmp_path / "ckpt"), tmp_path / "runs", notices=notices).register()
    assert {a.id: a.on_cloud for a in store.agents()} == {"cloud": True, "local": False}
    clock = SimulatedClock(NOW)
    server = BrokerServer(store, planning.get("costslo"), clock, CheckpointStore(str(tmp_path)))
    server.reclaim_lost()
    assert CapacityHistory(store).seen(NOW) == {ZONE: [(NOW.timestamp(), 1.0)]}  # the cloud agent only
    quote = _quote(MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)]), 30.0)
    ended = NOW + timedelta(hours=2)
    runs = [
        Run(
            fence=k,
            agent=a.id,
            offer=spot,
            on_cloud=a.on_cloud,
            dispatched_at=NOW,
            ended_at=ended,
            end_reason="finished",
        )
        for k, a in enumerate(store.agents(), 1)
    ]
    job = Job(id="j", spec=_quote_spec(30.0), submitted_at=NOW, updated_at=NOW, quote=quote, runs=runs)
    assert [r.agent for r in job.market_runs()] == ["cloud"]  # the cloud agent's run only


def test_a_zone_our_fleet_saw_that_has_no_traces_keeps_its_regions_traced_zones_as_its_prior(store):
    spot = _offer("us-east-1a").model_copy(update={"zone": "use1-az4"})  # a live offer names the zone id
    model = MarketModel.fit([trace("us-east-1a", [1] * 6 + [0] * 6, 300), trace("us-west-2a", [1] * 60 + [0] * 6, 50)])
    broker = Broker(store, OfferBook([spot]), planning.get("cbl-greedy"), SimulatedClock(NOW), model)
    Contract(store, "a").register(spot, 3_600_000, host="test", pid=0, at=NOW)
    CapacityHistory(store).record(NOW, [store.get_agent("a")])
    broker.clock.advance(hours=1)
    seen = broker.market_now().zones[("aws", "use1-az4", "p3.2xlarge")]
    assert "traced zones in us-east-1" in seen.evidence and "spells our fleet saw" in seen.evidence
