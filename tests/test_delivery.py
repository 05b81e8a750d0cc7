"""Assignments and reports between agents and the server over a real Redis: each delivered, applied and acked
once, stale ones ignored, an agent's unsettled ones read again."""

import json
import time

import pytest
import redis
from dispatch_system import l4_spec, quick_spec

from broker import planning
from broker.core.clock import SystemClock
from broker.core.server import BrokerServer
from broker.domain.model import JobState
from broker.store.jobs import Store


def test_a_duplicate_delivery_starts_one_run(system):
    system.agent("spot-a")
    job = system.broker.submit(quick_spec())
    assert system.server.dispatch() == [(job.id, "spot-a")]
    system.store.redis.xadd("broker:assign:spot-a", {"job": job.id, "fence": 1})  # delivered twice
    system.drive(lambda: system.job(job.id).state == JobState.done)
    assert len(system.reports("started")) == 1 and len(system.job(job.id).runs) == 1
    assert system.store.redis.xpending("broker:assign:spot-a", "agent")["pending"] == 0


def test_an_idle_agent_reads_once_a_turn_and_an_assignment_it_did_not_settle_is_read_again(system, monkeypatch):
    agent = system.agent("spot-a")

    def reads():
        return system.store.redis.info("commandstats").get("cmdstat_xreadgroup", {}).get("calls", 0)

    before = reads()
    for _ in range(5):
        agent.step(block_ms=10)
    assert reads() - before == 6  # the first turn also looks for assignments read before and never acked
    job = system.broker.submit(quick_spec())
    system.server.dispatch()
    ownership = system.store.ownership

    def dropped(*args):  # the connection drops after the read handed the assignment over
        monkeypatch.setattr(system.store, "ownership", ownership)
        raise redis.ConnectionError("reset by peer")

    monkeypatch.setattr(system.store, "ownership", dropped)
    with pytest.raises(redis.ConnectionError):
        agent.step(block_ms=10)
    system.drive(lambda: system.job(job.id).state == JobState.done, timeout_s=20)
    assert len(system.reports("started")) == 1


def test_a_start_is_reported_and_acked_in_one_transaction_and_the_next_turn_reads_only_new_assignments(system):
    agent = system.agent("spot-a")

    def calls(command):
        return system.store.redis.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)

    job = system.broker.submit(l4_spec("long", "import time; time.sleep(60)"))
    system.server.dispatch()
    before = {c: calls(c) for c in ("xreadgroup", "multi", "xack")}
    agent.step(block_ms=10)  # reads the assignment, starts the job, reports it and acks the assignment
    assert agent.job is not None and system.reports("started")
    assert {c: calls(c) - n for c, n in before.items()} == {"xreadgroup": 2, "multi": 1, "xack": 1}
    assert system.store.redis.xpending("broker:assign:spot-a", "agent")["pending"] == 0
    system.broker.cancel(job.id)
    system.drive(lambda: system.job(job.id).current_run is None, timeout_s=20)
    reads = calls("xreadgroup")
    for _ in range(3):
        agent.step(block_ms=10)
    assert calls("xreadgroup") - reads == 3  # it acked all it took: no look for ones read before and never acked


def test_stale_assignments_and_reports_change_nothing(system):
    system.agent("spot-a")
    job = system.broker.submit(quick_spec())
    system.server.dispatch()
    system.drive(lambda: system.job(job.id).state == JobState.done)
    before = system.job(job.id)
    system.store.redis.xadd("broker:assign:spot-a", {"job": job.id, "fence": 0})
    system.agents["spot-a"].step(block_ms=10)
    assert len(system.reports("started")) == 1
    stale = {"agent": "spot-a", "job": job.id, "fence": 0, "type": "exited", "data": {"reason": "failed", "code": 1}}
    assert system.server.apply([stale]) is None and system.job(job.id) == before


def test_reports_carry_the_agent_the_job_and_the_fence(system):
    system.agent("spot-a")
    job = system.broker.submit(quick_spec())
    system.drive(lambda: system.job(job.id).state == JobState.done)
    started = system.reports("started")[0]
    assert (started["agent"], started["job"], started["fence"]) == ("spot-a", job.id, "1")
    assert json.loads(started["data"])["pid"] > 0


def test_reports_left_pending_by_a_dead_replica_are_applied_by_another(system):
    agent = system.agent("spot-a")
    job = system.broker.submit(quick_spec())
    system.server.dispatch()
    while not system.reports("started"):  # the agent works; no server round runs meanwhile
        agent.step(block_ms=10)
    dead = system.store.read_reports("server-dead", block_ms=10)  # read, never acked: the replica died
    assert [r["type"] for _, r in dead] == ["started"]
    survivor = BrokerServer(system.store, planning.get(), SystemClock(), system.server.checkpoints, consumer="server-2")
    reclaimed = system.store.read_reports("server-2", reclaim_idle_ms=0)
    assert [entry_id for entry_id, _ in reclaimed] == [entry_id for entry_id, _ in dead]
    survivor.apply([r for _, r in reclaimed])
    assert system.job(job.id).state in (JobState.running, JobState.done)


def test_an_agent_whose_lease_lapsed_drops_its_job_and_registers_again(system):
    agent = system.agent("spot-a")
    job = system.broker.submit(l4_spec("long", "import time; time.sleep(60)"))
    system.drive(lambda: system.job(job.id).state == JobState.running)
    system.store.redis.delete("broker:lease:spot-a")  # a long pause: the lease ran out
    time.sleep(0.25)
    agent.step(block_ms=10)
    assert agent.job is None and system.store.lease_alive("spot-a")
    system.drive(lambda: len(system.job(job.id).runs) == 2 and system.job(job.id).state == JobState.running)
    first = system.job(job.id).runs[0]
    assert first.end_reason == "lost"
    system.broker.cancel(job.id)
    system.drive(lambda: system.job(job.id).current_run is None, timeout_s=20)


def test_a_job_whose_agent_restarted_before_its_lease_lapsed_is_moved_not_left_running(system):
    system.agent("spot-a")
    job = system.broker.submit(l4_spec("long", "import time; time.sleep(60)"))
    system.drive(lambda: system.job(job.id).state == JobState.running)
    orphan = system.agents.pop("spot-a").job  # the agent process died (its job's process with it, below)
    orphan.kill()
    system.agent("spot-a")  # its service restarted it under the same id, its lease still alive
    system.drive(lambda: len(system.job(job.id).runs) == 2, timeout_s=20)
    first = system.job(job.id).runs[0]
    assert (first.agent, first.end_reason) == ("spot-a", "lost")
    assert system.store.get_agent("spot-a").job == job.id  # the new process runs it again
    system.broker.cancel(job.id)
    system.drive(lambda: system.job(job.id).current_run is None, timeout_s=20)


def test_an_agent_that_registers_again_during_a_round_keeps_its_new_record(system, monkeypatch, redis_url):
    """The round read the agent idle, then its process restarted and registered again (a new report key) before
    the round's dispatch: the dispatch leaves the new record as it is (had it written the one it read, every report
    of the new process would be dropped as forged for good); the job goes to the new process a round later."""
    system.agent("spot-a")
    job = system.broker.submit(l4_spec("long", "import time; time.sleep(60)"))
    read = system.store.working_agents

    def restarted_meanwhile():
        agents = read()
        system.agent("spot-a", store=Store(redis_url))  # another process: another store, another report key
        return agents

    monkeypatch.setattr(system.store, "working_agents", restarted_meanwhile)
    system.server.dispatch()
    monkeypatch.undo()
    assert system.store.get_agent("spot-a").report_key == system.agents["spot-a"].store._report_keys["spot-a"]
    system.drive(lambda: system.job(job.id).state == JobState.running, timeout_s=20)
    assert system.job(job.id).current_run.agent == "spot-a"
    system.broker.cancel(job.id)
    system.drive(lambda: system.job(job.id).current_run is None, timeout_s=20)


def test_a_job_cancelled_before_its_agent_started_it_frees_the_agent(system):
    agent = system.agent("spot-a")
    job = system.broker.submit(quick_spec())
    assert system.server.dispatch() == [(job.id, "spot-a")]
    system.broker.cancel(job.id)
    agent.step(block_ms=10)
    system.server.round(block_ms=10)
    cancelled = system.job(job.id)
    assert cancelled.current_run is None and cancelled.runs[0].end_reason == "cancelled"
    assert system.reports("started") == [] and system.store.get_agent("spot-a").job is None
