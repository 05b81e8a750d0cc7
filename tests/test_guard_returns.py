"""The deadline guard under Uniform Progress's family with a real store and server: a job an hour on on-demand goes
back to spot, or to the queue to wait for it, by the policy's rule; a job waiting gets idle spot first."""

import numpy as np
import pytest

from broker import planning
from broker.agents.checkpoints import CheckpointStore
from broker.agents.contract import Contract
from broker.core.broker import Broker
from broker.core.clock import SimulatedClock
from broker.core.guard import DeadlineGuard
from broker.core.server import BrokerServer
from broker.domain.model import Tier
from broker.models import futures
from broker.store.jobs import Store
from conftest import NOW, make_spec


def an_hour_on_demand(store, catalog, policy, clock, tmp_path, done: float, if_late="cheapest"):
    """Job "j" (2 GPU-hours on an L4, 12 h to go) placed an hour in, with no spot, on the on-demand agent "od", which
    reports `done` of 1,000 steps an hour later; (server, that agent, its assignment, the cheapest spot L4 offer)."""

    server = BrokerServer(store, policy, clock, CheckpointStore(str(tmp_path)), consumer="test")
    l4 = [o for o in catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1]
    cheapest = {
        t: min((o for o in l4 if o.tier == t), key=lambda o: o.price_usd_per_h) for t in (Tier.spot, Tier.on_demand)
    }
    on_demand = Contract(store, "od")
    on_demand.register(cheapest[Tier.on_demand], 10**10, host="test", pid=0, at=clock.now())
    spec = make_spec(resources={"accelerators": ["L4:1"]}, work={"gpu_hours": 2}, deadline="+12h", if_late=if_late)
    Broker(store, catalog, policy, clock).submit(spec, job_id="j")
    clock.advance(hours=1)  # no spot at all, idle and behind ep(t): on-demand
    assert server.step() == [("j", "od")]
    return server, on_demand, run_an_hour(on_demand, clock, done), cheapest[Tier.spot]


def run_an_hour(agent, clock, done: float):
    """The agent takes job "j", starts it and an hour later reports `done` of 1,000 steps; its assignment."""
    assignment = agent.take(block_ms=None)
    agent.started(assignment, at=clock.now().timestamp())
    clock.advance(hours=1)
    agent.report("j", assignment.fence, "progress", at=clock.now().timestamp(), done=done, total=1000)
    return assignment


@pytest.mark.parametrize("name, done", [("uniform-progress", 50), ("hedge", 150)])
def test_a_job_on_on_demand_yields_idle_spot_to_a_job_that_waits(redis_url, catalog, tmp_path, name, done):
    """The guard takes a job back to spot only where no pending job fits: the pending job gets it first, and the
    job handed back would go to on-demand again. A lost deadline run cheapest (done=50) so yields to a job in time;
    under hedge a job in time (done=150, which it takes back to spot alone) yields too."""

    store, clock = Store(redis_url, prefix=f"yield-{name}:"), SimulatedClock(NOW)
    market = futures.Hedge(np.arange(50) * 100.0, 100.0, (), 100.0)  # as below: spot is worth going back to
    policy = planning.get(name, **({"hedge": lambda spec: market} if name == "hedge" else {}))
    server, _, _, spot = an_hour_on_demand(store, catalog, policy, clock, tmp_path, done)
    waiting = make_spec(resources={"accelerators": ["L4:1"]}, work={"gpu_hours": 2}, deadline="+48h")
    Broker(store, catalog, policy, clock).submit(waiting, job_id="w")
    Contract(store, "spot").register(spot, 10**10, host="test", pid=0, at=clock.now())
    assert server.step() == [("w", "spot")]
    assert not store.get_job("j").move_requested


@pytest.mark.parametrize(
    "name, done, spot_agent, back, if_late",
    [
        ("uniform-progress", 900, True, True, "soonest"),
        ("uniform-progress", 50, True, False, "soonest"),
        ("uniform-progress", 150, True, False, "soonest"),
        ("hedge", 150, True, True, "soonest"),  # behind ep(t + 2d), with the slack for the changeovers
        ("hedge", 150, False, False, "soonest"),
        ("hedge", 50, True, False, "soonest"),  # measured so slow that its deadline is lost: on-demand to the end
        ("uniform-progress", 50, True, True, "cheapest"),  # ... unless it runs cheapest once late
        ("hedge", 50, True, True, "cheapest"),
        ("hedge", 50, False, False, "cheapest"),
        ("uniform-progress", 150, True, False, "cheapest"),  # behind but not lost: the rule as before
        ("hedge", 50, True, True, "extend"),  # lost: its second window, in which spot is worth it
        ("hedge", 150, True, True, "extend"),  # not lost: its own window, as before
    ],
)
def test_the_guard_takes_a_job_back_from_on_demand_to_spot_by_the_policys_rule(
    redis_url, catalog, tmp_path, monkeypatch, name, done, spot_agent, back, if_late
):
    """Can't Be Late's rule leaves on-demand once progress is past ep(t + 2d), and the server runs it so (the
    quote's forecast always did): only with an idle spot agent that fits, and only when that far ahead. Hedge
    leaves as soon as a spell on spot pays for the changeovers, however far behind (it has the slack). A job whose
    deadline is lost stays on on-demand to finish soonest, or with `if_late: cheapest` goes back to idle spot.
    The guard reads the pending jobs (which idle agents a waiting job fits) only for a job that would go back."""

    reads = []
    wanted = DeadlineGuard._wanted
    monkeypatch.setattr(DeadlineGuard, "_wanted", lambda guard, idle: reads.append(idle) or wanted(guard, idle))

    store, clock = Store(redis_url, prefix=f"return-{name}-{done}-{spot_agent}-{if_late}:"), SimulatedClock(NOW)
    # hedge's market here: gaps that never end (no wait is worth it) and up-spells of 100 h (spot is worth it)
    market = futures.Hedge(np.arange(50) * 100.0, 100.0, (), 100.0)
    policy = planning.get(name, **({"hedge": lambda spec: market} if name == "hedge" else {}))
    server, on_demand, assignment, spot = an_hour_on_demand(store, catalog, policy, clock, tmp_path, done, if_late)
    if spot_agent:
        Contract(store, "spot").register(spot, 10**10, host="test", pid=0, at=clock.now())
    server.step()
    job = store.get_job("j")
    assert job.move_requested == back and job.pinned_tier is None
    assert bool(reads) == back
    if back:
        lost = done == 50 and if_late == "cheapest"
        assert ("if_late: cheapest" if lost else f"back to spot ({name}'s rule)") in job.reason
        assert ("its second window ends in" in job.reason) == (done == 50 and if_late == "extend"), job.reason
        on_demand.exited("j", assignment.fence, "moved", at=clock.now().timestamp())
        assert server.step() == [("j", "spot")]  # re-dispatched to the idle spot agent


def test_the_guard_moves_no_job_cancelled_while_its_run_goes_on(redis_url, catalog, tmp_path):
    """A job cancelled whose agent has not stopped it yet is left to stop: not asked to move (its idle spot agent
    stays free, its reason says it was cancelled)."""
    store, clock = Store(redis_url, prefix="return-cancelled:"), SimulatedClock(NOW)
    policy = planning.get("uniform-progress")
    server, _, _, spot = an_hour_on_demand(store, catalog, policy, clock, tmp_path, 900, "soonest")
    Contract(store, "spot").register(spot, 10**10, host="test", pid=0, at=clock.now())
    Broker(store, catalog, policy, clock).cancel("j")
    server.step()
    job = store.get_job("j")
    assert not job.move_requested and job.reason == "cancelled by user"


@pytest.mark.parametrize(
    "name, done, queue, waits",
    [
        ("uniform-progress", 900, False, True),  # past ep(t + 2d), no spot free: the paper's rule waits for it
        ("uniform-progress", 150, False, False),  # behind: on-demand
        ("hedge", 900, False, False),  # a gap it waits out not a tick of (a* = 0): on-demand until spot is back
        ("hedge-short-gaps", 900, False, True),  # a gap its slack affords waiting out: as Uniform Progress
        ("hedge", 900, True, True),  # a queue (the fleet's spot held by another job): as Uniform Progress
    ],
)
def test_a_job_on_on_demand_ahead_of_its_pace_goes_back_to_wait_for_spot_none_is_free(
    redis_url, catalog, tmp_path, name, done, queue, waits
):
    """Can't Be Late's Uniform Progress leaves on-demand to wait once past ep(t + 2d), even with no spot free: the
    work it puts off runs on spot that frees before it falls behind (the quote's futures play the same)."""

    store, clock = Store(redis_url, prefix=f"wait-{name}-{done}-{queue}:"), SimulatedClock(NOW)
    # gaps that never end: none is waited out, so it went to on-demand an hour in
    market = {"gaps": futures.Hedge(np.arange(50) * 100.0, 100.0, (), 100.0)}
    short_gaps, name = name.endswith("-short-gaps"), name.removesuffix("-short-gaps")
    policy = planning.get(name, **({"hedge": lambda spec: market["gaps"]} if name == "hedge" else {}))
    server, on_demand, assignment, spot = an_hour_on_demand(store, catalog, policy, clock, tmp_path, done, "soonest")
    if short_gaps:  # the market model learned since that gaps are short: a wait of hours is worth it
        market["gaps"] = futures.Hedge(np.arange(50) * 0.1, 100.0, (), 100.0)
    if queue:  # another job holds the one spot agent
        Contract(store, "spot").register(spot, 10**10, host="test", pid=0, at=clock.now())
        other = make_spec(resources={"accelerators": ["L4:1"]}, work={"gpu_hours": 2}, deadline="+48h")
        Broker(store, catalog, policy, clock).submit(other, job_id="k")
        assert server.step() == [("k", "spot")]
        server.step()  # the guard's pass once the planner has seen the agent busy
    else:
        server.step()
    job = store.get_job("j")
    assert job.move_requested == waits and job.pinned_tier is None
    assert ("queued to wait for spot" in job.reason) == waits


def test_the_guard_takes_a_job_back_to_spot_only_on_an_agent_that_may_take_it(redis_url, catalog, tmp_path):
    """An idle spot agent started for another job (`broker run`) runs that job alone: a job sent back to spot for it
    would wait in the queue (Uniform Progress does so knowingly, below); one started for this job takes it back, a
    waiting job it does not take notwithstanding."""
    policy = planning.get("uniform-progress")
    for agent, said in (("another", "queued to wait for spot"), ("j", "back to spot (uniform-progress's rule)")):
        store, clock = Store(redis_url, prefix=f"return-for-{agent}:"), SimulatedClock(NOW)
        server, on_demand, assignment, spot = an_hour_on_demand(store, catalog, policy, clock, tmp_path, 900)
        Contract(store, f"for-{agent}").register(spot, 10**10, host="test", pid=0, at=clock.now(), for_job=agent)
        waiting = make_spec(resources={"accelerators": ["L4:1"]}, work={"gpu_hours": 2}, deadline="+48h")
        Broker(store, catalog, policy, clock).submit(waiting, job_id="w")  # it fits the agent, which takes it not
        server.step()
        assert said in store.get_job("j").reason
    on_demand.exited("j", assignment.fence, "moved", at=clock.now().timestamp())
    assert server.step() == [("j", "for-j")]
