"""An agent's record has two writers: the server gives it a job and a fence (a dispatch) and takes them back (the
fold of its exit), or removes it once its lease lapsed; the agent registers and changes what it offers (a fill
agent's measured speed). Neither write may undo the other's, whatever the order: the server read the record at the
start of its round."""

import pytest
from dispatch_system import quick_spec

from broker.agents.contract import Contract


@pytest.fixture
def contract(system):
    contract = Contract(system.store, "spot-a")
    contract.register(system.offers["spot-a"], 60_000, host="test", pid=0)
    return contract


def slower(system):
    return system.offers["spot-a"].model_copy(update={"speed_factor": 0.5})


def test_an_offer_changed_while_a_round_dispatches_to_the_agent_is_kept(system, contract, monkeypatch):
    job = system.broker.submit(quick_spec())
    plan_page = system.server._plan_page

    def offered_meanwhile(*args):  # the round has read the idle agents; the agent offers another speed
        contract.offer(slower(system))
        return plan_page(*args)

    monkeypatch.setattr(system.server, "_plan_page", offered_meanwhile)
    assert system.server.dispatch() == [(job.id, "spot-a")]
    record = system.store.get_agent("spot-a")
    assert (record.job, record.offer.speed_factor) == (job.id, 0.5)


def test_an_offer_changed_while_a_round_folds_the_agent_s_exit_is_kept(system, contract, monkeypatch):
    job = system.broker.submit(quick_spec())
    system.server.dispatch()
    assignment = contract.take(None)
    contract.started(assignment)
    contract.exited(job.id, assignment.fence, "finished", code=0)
    fold = system.server._fold

    def offered_meanwhile(*args):  # the round has read the exiting agent's record; the agent offers another speed
        contract.offer(slower(system))
        return fold(*args)

    monkeypatch.setattr(system.server, "_fold", offered_meanwhile)
    assert system.server.fold_reports(block_ms=None) == 2
    record = system.store.get_agent("spot-a")
    assert system.store.get_job(job.id).state.value == "done"
    assert (record.job, record.offer.speed_factor) == (None, 0.5)


def test_a_dispatch_to_an_agent_no_one_else_wrote_keeps_its_record_exactly(system):
    offer = system.offers["spot-a"].model_copy(update={"hazard_per_h": 0.06912345678901234})  # 16 digits
    Contract(system.store, "spot-a").register(offer, 60_000, host="test", pid=0)
    before = system.store.redis.get(system.store.key("agent", "spot-a"))
    job = system.broker.submit(quick_spec())
    assert system.server.dispatch() == [(job.id, "spot-a")]
    record = system.store.get_agent("spot-a")
    assert record.offer.hazard_per_h == 0.06912345678901234  # not re-encoded by Redis's JSON (14 digits)
    assert record.model_copy(update={"job": None, "fence": None}).model_dump_json() == before


def test_an_agent_that_registers_again_after_the_round_read_its_lease_lapsed_is_not_removed(system, monkeypatch):
    contract = Contract(system.store, "spot-a")
    contract.register(system.offers["spot-a"], 60_000, host="test", pid=0)
    system.store.redis.delete(system.store.key("lease", "spot-a"))  # a long pause: its lease lapsed
    read = system.store.agents_with_leases

    def registered_meanwhile():  # the round has read the lapse; the agent notices it and registers again
        agents = read()
        contract.register(system.offers["spot-a"], 60_000, host="test", pid=0)
        return agents

    monkeypatch.setattr(system.store, "agents_with_leases", registered_meanwhile)
    system.server.reclaim_lost()
    assert system.store.get_agent("spot-a") is not None
    assert system.store.lease_alive("spot-a")
