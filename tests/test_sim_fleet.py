"""The simulated fleet of a backtest (sim/fleet.py): its agents keep the live contract with the real store, and the
world it plays takes its truth from the traces."""

import numpy as np
import pytest
from test_backtest import START

from broker.sim.market import PACKAGED_TRACES, from_traces
from broker.sim.workloads import ml_mix


@pytest.fixture(scope="module")
def market(catalog):
    return from_traces(PACKAGED_TRACES, catalog, START, tick_s=1200)


def _started(world, redis_url, name: str, seed: int = 0, **spec_changes):
    """One job of the ML mix ("j", due at its window's end; `spec_changes` on top) submitted under Greedy (spot when
    there is some) and started on the world's fleet: (store, clock, server, fleet)."""
    from datetime import timedelta

    from broker import planning
    from broker.agents.checkpoints import CheckpointStore
    from broker.core.broker import Broker
    from broker.core.clock import SimulatedClock
    from broker.core.server import BrokerServer
    from broker.sim.fleet import SimFleet
    from broker.sim.market import OfferBook
    from broker.store.jobs import Store

    store, clock = Store(redis_url, prefix=f"{name}:"), SimulatedClock(world.start)
    policy = planning.get("cbl-greedy")
    checkpoints = CheckpointStore(f"memory://{name}")
    server = BrokerServer(store, policy, clock, checkpoints, consumer="test")
    fleet = SimFleet(store, checkpoints, world, bubbles=False, seed=seed)
    [arrival] = ml_mix(0, 1, 3.06, arrival_h=0)
    spec = arrival.spec.model_copy(update={"deadline": clock.now() + timedelta(hours=arrival.window_h), **spec_changes})
    Broker(store, OfferBook(world.offers(False)), policy, clock).submit(spec, job_id="j")
    fleet.provision(0, clock.now(), store.pending_count())
    fleet.take(server.step(), clock.now())
    return store, clock, server, fleet


def test_simulated_agents_learn_of_a_guard_move_from_their_view_and_hand_the_job_back(market, redis_url):
    from broker.domain.model import IfLate

    # Greedy: the guard is what moves it; lost: on-demand to the end
    store, clock, server, fleet = _started(market, redis_url, "fleet-move", if_late=IfLate.soonest)
    window_h = (store.get_job("j").spec.deadline - clock.now()).total_seconds() / 3600
    [(agent, run)] = fleet.runs.items()
    assert run.offer.tier.value == "spot"
    assert fleet.obey(clock.now()) == 0  # nothing asked yet
    clock.advance(hours=window_h * 0.9)  # no progress reported: far behind, so the guard moves it
    server.step()
    assert fleet.obey(clock.now()) == 1 and agent not in fleet.runs
    server.step()
    job = store.get_job("j")
    assert job.runs[0].end_reason == "moved" and job.runs[0].checkpoint_step is not None
    assert job.runs[-1].offer.tier.value == "on_demand"  # the server re-dispatched it, on-demand only
    fleet.close()


def test_a_simulated_agent_asked_for_a_checkpoint_writes_one_pays_it_and_runs_on(market, redis_url):
    """The request the guard writes near the net (tests/test_dispatch.py has the guard's side): the simulated agent
    checkpoints once per request, pays the write before progress goes on, and keeps the job; the report settles it."""
    from broker.models.risk import checkpoint_hours

    store, clock, server, fleet = _started(market, redis_url, "fleet-ckpt")
    [(agent, run)] = fleet.runs.items()
    fleet.advance(clock.now(), 0.5)
    clock.advance(hours=0.5)
    server.step()
    done, dead_h = run.done, run.dead_h

    def ask(job):
        latest = job.current_run.model_copy(update={"checkpoint_requested_at": clock.now()})
        return job.model_copy(update={"runs": [*job.runs[:-1], latest]})

    store.update_job("j", ask)
    assert fleet.obey(clock.now()) == 0 and fleet.runs[agent] is run  # it runs on
    assert run.since_checkpoint_h == 0 and run.dead_h == pytest.approx(dead_h + checkpoint_hours(run.spec))
    assert fleet.obey(clock.now()) == 0 and run.dead_h == pytest.approx(dead_h + checkpoint_hours(run.spec))  # once
    server.step()
    current = store.get_job("j").current_run
    assert current.checkpoint_step == int(done) > 0 and current.checkpoint_requested_at is None
    assert current.checkpoints_asked == 1
    fleet.advance(clock.now(), checkpoint_hours(run.spec) / 2)
    assert run.done == done  # the write is paid before progress goes on
    fleet.close()


@pytest.mark.parametrize("idle_first", [False, True])
def test_a_shrinking_pool_takes_back_instances_at_random_busy_ones_too(market, redis_url, idle_first):
    """A trace says how many instances a pool held, not which went: the world takes back any of the pool's agents,
    idle or busy (before, idle ones first, which sheltered every run behind the idle agents beside it). One run in a
    pool of 4 that shrinks to 3 is preempted about one time in four; never in a market marked `idle_first` (the
    bounds' world, a measuring aid: bench/cost.py --idle-first)."""
    from dataclasses import replace

    pool = replace(market.spot[0], capacity=np.array([4, 3]))
    shrinking = replace(market, spot=[pool], bubbles=[], idle_first=idle_first)
    preempted = 0
    for seed in range(40):
        store, clock, server, fleet = _started(shrinking, redis_url, f"fleet-shrink-{idle_first}-{seed}", seed)
        assert len(fleet.runs) == 1 and len(fleet.on_offer[pool.offer.id]) == 4
        fleet.provision(1, clock.now(), 0)
        preempted += not fleet.runs
        fleet.close()
    assert preempted == 0 if idle_first else 3 <= preempted <= 20  # 1 in 4 of 40: 10 expected


@pytest.mark.parametrize("notices", [True, False])
def test_a_preempted_run_checkpoints_on_the_clouds_notice_and_loses_only_its_lead(market, redis_url, notices):
    """EC2 says two minutes ahead that it takes a spot instance back, and the agent checkpoints the job then
    (agents/agent.py): the run loses the lead's work, not the work since its last periodic checkpoint (all of it
    here: none was due yet). A market without `notices` (a measuring aid) loses it all."""
    from dataclasses import replace

    from broker.models.risk import notice_loss_h

    pool = replace(market.spot[0], capacity=np.array([1, 1, 0]))
    world = replace(market, spot=[pool], bubbles=[], notices=notices)
    store, clock, server, fleet = _started(world, redis_url, f"fleet-notice-{notices}")
    [run] = fleet.runs.values()
    lead_h = notice_loss_h(run.spec, run.offer)
    assert lead_h == pytest.approx(120 / 3600)  # EC2's lead
    hours = run.dead_h + 0.9 * run.interval_h  # the restart, then most of an interval: no periodic checkpoint yet
    fleet.advance(clock.now(), hours)
    clock.advance(hours=hours)
    assert run.since_checkpoint_h > lead_h
    fleet.provision(1, clock.now(), 0)
    server.step()
    done = run.done
    fleet.provision(2, clock.now(), 0)  # the pool is gone
    assert not fleet.runs
    server.step()
    [first, *_] = store.get_job("j").runs
    assert first.end_reason == "preempted"
    if notices:
        assert first.checkpoint_step == int(done - run.rate * lead_h) > 0
    else:
        assert first.checkpoint_step is None
    fleet.close()
