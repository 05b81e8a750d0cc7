"""What a quote sees of the broker's own fleet (core/fleet.Fleet): the slots the other jobs hold, the jobs waiting
ahead of it, and the jobs still to come at the rate they came."""

from datetime import timedelta

import pytest
from test_market_model import NOW, _offer, trace
from test_quotes import _finished, _quote, _quote_spec

from broker import planning
from broker.agents.contract import Contract
from broker.core.broker import Broker
from broker.core.clock import SimulatedClock
from broker.core.fleet import RUNNING, Fleet
from broker.core.forecast import forecast
from broker.domain.model import Job, JobState
from broker.pricing.availability import MarketModel
from broker.sim.market import OfferBook


def _calm(*zones: str) -> MarketModel:
    """Zones (us-east-1a alone by default) with spot 300 ticks in every 301, 20 times over: the fleet's slots, not the
    market, are what the tests vary."""
    return MarketModel.fit([trace(z, [1] * 300 + [0] * 1, 20) for z in zones or ("us-east-1a",)])


def _greedy_quote(offers, model: MarketModel, spec):
    """The quote cbl-greedy makes with no store (no fleet), which the tests then play against a Fleet of their own."""
    return Broker(None, OfferBook(offers), planning.get("cbl-greedy"), SimulatedClock(NOW), model).quote(spec)


def test_a_running_job_holds_a_slot_only_where_it_runs_and_a_waiting_one_where_it_may_launch():

    model = _calm()
    quote = _quote(model, 30.0)
    running = _finished(quote, 1.0, "r", JobState.running)
    elsewhere = _offer("us-east-1q", price=0.7)
    running.runs[0].offer = elsewhere
    waiting = Job(id="w", spec=_quote_spec(30.0), submitted_at=NOW, updated_at=NOW, quote=quote)
    fleet = Fleet.of([_agent(quote.chosen.offer)], [running, waiting], NOW, [])
    assert [offers for offers, _, _ in fleet.others] == [{elsewhere.id}, set(quote.forecast.zones)]
    pinned, pooled = fleet.held([quote.chosen.offer], 1.0, 10, pin=False)
    assert len(pooled) == 1 and not pinned.any()  # only the waiting one competes for its zone
    pinned, pooled = fleet.held([quote.chosen.offer, elsewhere], 1.0, 10, pin=True)  # bubbles: where they run
    assert pinned[:, 0].tolist() == [1, 1] and len(pooled) == 0


def test_another_job_holds_a_spot_slot_for_the_hours_its_futures_run_on_spot():
    """A job whose futures run half their hours on on-demand holds a spot slot for half its hours left: counted for
    all of them, the jobs ahead of a quote filled the zones' slots for twice as long as they ran there, and its futures
    paid on-demand where it ran on spot (bench/results/forecast.md)."""
    from broker.planning.option_table import work_left

    model = _calm()
    quote = _quote(model, 30.0)
    half, whole = (
        quote.model_copy(update={"forecast": quote.forecast.model_copy(update={"spot_share": share})})
        for share in (0.5, 1.0)
    )
    jobs = [_finished(half, 1.0, "half", JobState.running), _finished(whole, 1.0, "whole", JobState.running)]
    (_, half_h, _), (_, whole_h, _) = Fleet.of([_agent(quote.chosen.offer)], jobs, NOW, []).others
    assert whole_h == pytest.approx(work_left(jobs[1]) * quote.chosen.expected_wall_h) and whole_h > 0
    assert half_h == pytest.approx(whole_h / 2)


def test_a_quote_sees_the_jobs_ahead_of_it_in_the_fleet(store):
    """One agent in a cheap zone and one in a dear one: the first job is quoted in the cheap zone, the second behind
    it in the dear one (before the fleet was counted, both were quoted at the cheap zone's price)."""
    cheap, dear, od = (
        _offer("us-east-1a", price=0.9),
        _offer("us-east-1b", price=1.8),
        _offer("us-east-1z", "on_demand", 3.06),
    )
    for agent, offer in (("a", cheap), ("b", dear)):
        Contract(store, agent).register(offer, 60_000, host="test", pid=0, at=NOW)
    model = _calm("us-east-1a", "us-east-1b")
    broker = Broker(store, OfferBook([cheap, dear, od]), planning.get("cbl-greedy"), SimulatedClock(NOW), model)
    spec = _quote_spec(30.0)
    first = broker.submit(spec).quote.forecast
    second = broker.submit(spec).quote.forecast
    assert first.cost_p50_usd == pytest.approx(0.9 * second.cost_p50_usd / 1.8, rel=0.05)
    # not behind it: as soon, but for the other zone's preemptions (each future draws every zone's spells)
    assert second.zones == first.zones and abs(second.finish_p50 - first.finish_p50) < timedelta(minutes=2)
    third = broker.submit(spec).quote.forecast  # both slots held: it waits for one or pays on-demand
    assert third.finish_p50 > first.finish_p50 or third.spot_share < 0.5


def test_a_quote_does_not_count_an_agent_started_for_another_job(store):
    """An agent `broker run` started for its job takes no other: counted as a slot of its zone, a second job was
    quoted behind the first for a slot neither could have."""
    cheap, od = _offer("us-east-1a", price=0.9), _offer("us-east-1z", "on_demand", 3.06)
    Contract(store, "theirs").register(cheap, 60_000, host="test", pid=0, at=NOW, for_job="their-job")
    model = _calm()
    broker = Broker(store, OfferBook([cheap, od]), planning.get("cbl-greedy"), SimulatedClock(NOW), model)
    first, second = (broker.submit(_quote_spec(30.0)).quote.forecast for _ in range(2))
    assert abs(second.finish_p50 - first.finish_p50) < timedelta(minutes=2)  # no slot of ours: the market's alone
    assert second.cost_p50_usd == pytest.approx(first.cost_p50_usd, rel=0.05)


def test_a_quote_counts_the_jobs_that_will_arrive_ahead_of_it_where_jobs_keep_arriving():
    """Jobs came every half hour lately, each due 10 h after it came and holding a spot slot for hours: those that
    come in the next 20 h are due before this job (30 h) and take the fleet's one cheap slot ahead of it, so its
    quote is dearer than in a quiet fleet. Jobs due later than it wait behind it and change nothing."""

    cheap, dear = _offer("us-east-1a", price=0.9), _offer("us-east-1b", price=1.8)
    offers = [cheap, dear, _offer("us-east-1z", "on_demand", 3.06)]
    model = MarketModel.fit([trace(z, [1] * 60 + [0] * 1, 50) for z in ("us-east-1a", "us-east-1b")])
    spec = _quote_spec(30.0)
    quote = _greedy_quote(offers, model, spec)

    def came(due_h: float) -> list[Job]:
        times = [NOW - timedelta(minutes=30 * i) for i in range(8)]
        specs = [spec.model_copy(update={"deadline": at + timedelta(hours=due_h)}) for at in times]
        return [
            Job(id=f"j{i}", spec=s, submitted_at=at, updated_at=at, quote=quote)
            for i, (s, at) in enumerate(zip(specs, times))
        ]

    agents = [_agent(cheap), _agent(dear)]
    urgent, relaxed = Fleet.of(agents, [], NOW, came(10.0)), Fleet.of(agents, [], NOW, came(60.0))
    assert urgent.arrivals_per_h == pytest.approx(2.0) and len(urgent.arrived) == 8
    quiet = Fleet.of(agents, [], NOW, came(10.0)[:1])
    assert quiet.arrivals_per_h == 0.0  # one submission says nothing of a rate
    calm = forecast(spec, quote, offers, model, "greedy", NOW, fleet=quiet)
    crowded = forecast(spec, quote, offers, model, "greedy", NOW, fleet=urgent)
    behind = forecast(spec, quote, offers, model, "greedy", NOW, fleet=relaxed)
    assert crowded.cost_p50_usd > calm.cost_p50_usd * 1.3
    assert behind.cost_p50_usd == pytest.approx(calm.cost_p50_usd, rel=0.02)


def _agent(offer):
    from broker.domain.model import AgentInfo

    return AgentInfo(id=offer.zone, offer=offer, host="test", pid=0, registered_at=NOW)


def test_a_pool_shrunk_at_quote_time_has_the_slots_it_had_lately(store):
    """Our pool in the zone had 3 agents for 12 hours; two were taken back a minute ago and the one left runs one of
    two jobs there. Its slots while up are the 3 it had lately (core/fleet.pool_sizes), not the 1 left: it fills again
    when capacity comes back. Held at 1, a backtest's job quoted at such a moment (9 jobs ahead) found a free slot in
    0.18% of its futures' zone-ticks and was quoted on-demand's $12.58, where it ran on spot for $1.23."""
    from broker.store.capacity import CapacityHistory

    cheap, od = _offer("us-east-1a", price=0.9), _offer("us-east-1z", "on_demand", 3.06)
    model = _calm()
    spec = _quote_spec(30.0)
    broker = Broker(store, OfferBook([cheap, od]), planning.get("cbl-greedy"), SimulatedClock(NOW), model)
    pool = [_agent(cheap).model_copy(update={"id": f"a{i}"}) for i in range(3)]
    CapacityHistory(store).record(NOW - timedelta(hours=12), pool)
    CapacityHistory(store).record(NOW - timedelta(minutes=1), pool[:1])
    Contract(store, "a0").register(cheap, 60_000, host="test", pid=0, at=NOW)
    assert broker._fleet(store.working_agents(), NOW).sizes == {cheap.id: 3.0}

    quote = broker.quote(spec)
    ahead = [(frozenset({cheap.id}), 20.0, RUNNING)] * 2  # two jobs running on spot there, 20 hours left each

    def played(fleet: Fleet):
        return forecast(spec, quote, [cheap, od], model, "greedy", NOW, fleet=fleet)

    quiet = played(Fleet(agents={cheap.id: 3}))
    refilled = played(Fleet(agents={cheap.id: 1}, others=ahead, sizes={cheap.id: 3.0}))
    shrunk = played(Fleet(agents={cheap.id: 1}, others=ahead))
    assert refilled.cost_p50_usd == pytest.approx(quiet.cost_p50_usd, rel=0.02) and refilled.spot_share > 0.9
    assert shrunk.cost_p50_usd > 1.5 * quiet.cost_p50_usd and shrunk.spot_share < 0.5


def test_a_job_waiting_behind_a_quote_in_the_queue_holds_no_slot_ahead_of_it():
    """The queue goes by urgency (the deadline): one slot in the cheap zone, and another job waiting for it. Due
    later, it takes the slot after the new job, which is quoted at spot's price; due sooner, it takes it first. Counted
    ahead whatever its deadline, the waiting jobs due later made a backtest's short jobs quoted at the dearer zones'
    prices, and they ran in the cheap one (a fill quoted $3.09 with 99.6% of its hours on spot ran for $1.22)."""

    cheap, od = _offer("us-east-1a", price=0.9), _offer("us-east-1z", "on_demand", 3.06)
    model = _calm()
    spec = _quote_spec(30.0)
    quote = _greedy_quote([cheap, od], model, spec)

    def played(due_h: float):
        queued = _quote_spec(due_h).urgency(NOW)
        waiting = [(frozenset({cheap.id}), 40.0, queued)]  # 40 hours on spot: past the new job's deadline
        return forecast(spec, quote, [cheap, od], model, "greedy", NOW, fleet=Fleet({cheap.id: 1}, waiting))

    alone = forecast(spec, quote, [cheap, od], model, "greedy", NOW, fleet=Fleet({cheap.id: 1}))
    behind, ahead = played(60.0), played(20.0)
    assert behind.cost_p50_usd == pytest.approx(alone.cost_p50_usd) and behind.spot_share > 0.9
    assert ahead.cost_p50_usd > 1.5 * alone.cost_p50_usd and ahead.spot_share < 0.5
    running = Fleet({cheap.id: 1}, [(frozenset({cheap.id}), 40.0, RUNNING)])  # a run holds its slot
    held = forecast(spec, quote, [cheap, od], model, "greedy", NOW, fleet=running)
    assert held.cost_p50_usd == pytest.approx(ahead.cost_p50_usd)


def test_a_job_running_in_a_dear_zone_leaves_the_cheap_zones_slot_free():
    """One slot in a cheap zone and one in a dear zone, another job running in the dear one for 40 hours: the new job
    is quoted in the cheap zone, as in a fleet with no other job. Counted among the jobs that take the cheapest free
    slot, the run took the cheap zone's slot in the futures and the new job was quoted at the dear zone's price."""

    cheap, dear = _offer("us-east-1a", price=0.9), _offer("us-east-1b", price=1.8)
    offers = [cheap, dear, _offer("us-east-1z", "on_demand", 3.06)]
    model = _calm("us-east-1a", "us-east-1b")
    spec = _quote_spec(30.0)
    quote = _greedy_quote(offers, model, spec)
    agents = {cheap.id: 1, dear.id: 1}

    def played(running_in) -> float:
        others = [(frozenset({running_in.id}), 40.0, RUNNING)]
        return forecast(spec, quote, offers, model, "greedy", NOW, fleet=Fleet(agents, others)).cost_p50_usd

    alone = forecast(spec, quote, offers, model, "greedy", NOW, fleet=Fleet(agents)).cost_p50_usd
    assert played(dear) == pytest.approx(alone, rel=0.05)  # not quite: the dear zone is taken
    assert played(cheap) == pytest.approx(alone * 1.8 / 0.9, rel=0.05)  # the cheap one is taken: the dear one's price


def test_a_run_taken_back_as_its_pool_shrinks_starts_again_in_that_zone_not_in_a_dearer_one():
    """A pool that shrinks without emptying takes back a busy instance and stays up: the futures start the job again
    there. Read as the zone down for that tick, they started it in the next zone, and Greedy stays where it runs:
    the futures of a cheap zone whose pool shrank paid the dear zone's price (bench/results/forecast.md)."""
    import numpy as np

    zone = ("aws", "us-east-1a", "p3.2xlarge")
    pool = np.tile([16] * 9 + [8], 14)  # a day of our 16 agents there, half of them gone one tick in ten
    model = _calm("us-east-1a", "us-east-1b").with_recent({zone: pool})
    assert model.zones[zone].shrink > 0.04
    cheap, dear = _offer("us-east-1a", price=1.0), _offer("us-east-1b", price=10.0)
    offers = [cheap, dear, _offer("us-east-1z", "on_demand", 30.0)]
    spec = _quote_spec(30.0)
    quote = _greedy_quote(offers, model, spec)
    assert quote.chosen.offer.zone == "us-east-1a" and quote.forecast.zones == [cheap.id, dear.id]
    fleet = Fleet.of([_agent(cheap), _agent(dear)], [], NOW, [])
    played = forecast(spec, quote, offers, model, "greedy", NOW, fleet=fleet)
    assert played.preemptions_mean > 3  # taken back several times a job
    assert played.cost_p90_usd < 2 * played.cost_p10_usd  # at the cheap zone's price throughout, not the dear one's
