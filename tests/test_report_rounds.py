"""A server round's reads of the agents' report stream: a round that failed after reading applies those reports
again first, before newer ones; a healthy replica asks for its own unacked and dead replicas' reports only now and
then (each ask is a round trip of every round otherwise); a report stream that was cleared is made again; a new
job wakes a server waiting for reports, and those wakes never hide the reports behind them; a job the server wrote
is not parsed again when it reads it back; a round reads the agents only when a job waits."""

import time
from datetime import UTC, datetime

import pytest
import redis

from broker import planning
from broker.agents.checkpoints import CheckpointStore
from broker.core import server as server_module
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.core.server import BrokerServer
from broker.domain.model import AgentInfo, Job, JobState
from conftest import make_spec


@pytest.fixture
def dispatched(store, catalog, tmp_path):
    """A server and a job it dispatched to agent `a` (fence 1)."""
    offer = next(o for o in catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1)
    store.register_agent(AgentInfo(id="a", offer=offer, host="h", pid=1, registered_at=datetime.now(UTC)), 60_000)
    job = Broker(store, catalog, planning.get(), SystemClock()).submit(
        make_spec(name="j", resources={"accelerators": ["L4:1"]})
    )
    server = BrokerServer(store, planning.get(), SystemClock(), CheckpointStore(str(tmp_path / "ckpt")), "s")
    assert server.dispatch() == [(job.id, "a")]
    return server, job


def commands(store) -> dict[str, int]:
    return {name: stats["calls"] for name, stats in store.redis.info("commandstats").items()}


def test_reports_read_by_a_round_that_failed_are_applied_first_in_the_next(store, dispatched, monkeypatch):
    server, job = dispatched
    assert server.fold_reports(block_ms=None) == 0  # a healthy round: nothing left unacked
    store.report("a", job.id, 1, "started")
    real, failed = store.update_jobs, []

    def outage_once(*args, **kwargs):
        if not failed:
            failed.append(True)
            raise redis.ConnectionError("redis went away mid-round")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "update_jobs", outage_once)
    with pytest.raises(redis.ConnectionError):
        server.fold_reports(block_ms=None)  # read `started`, never applied nor acked
    store.report("a", job.id, 1, "exited", reason="finished", code=0)
    assert server.fold_reports(block_ms=None) == 1  # `started` again, alone
    assert store.get_job(job.id).state == JobState.running
    assert server.fold_reports(block_ms=None) == 1
    assert store.get_job(job.id).state == JobState.done


def test_a_healthy_replica_claims_other_replicas_reports_only_now_and_then(store, dispatched, monkeypatch):
    server, _ = dispatched
    monkeypatch.setattr(server_module, "RECOVER_EVERY_S", 3600.0)
    before = commands(store)
    for _ in range(10):
        server.round(block_ms=1)
    after = commands(store)
    calls = {name: after.get(name, 0) - before.get(name, 0) for name in after}
    assert calls["cmdstat_xautoclaim"] == 1 and calls["cmdstat_xgroup|create"] == 1  # the first round only
    assert calls["cmdstat_xreadgroup"] == 11  # its own unacked ones once, then each round's new ones
    server._last_recover -= 3600.0  # an hour on
    server.round(block_ms=1)
    assert commands(store)["cmdstat_xautoclaim"] == after["cmdstat_xautoclaim"] + 1


def test_a_cleared_report_stream_is_made_again_and_read(store, dispatched):
    server, job = dispatched
    assert server.fold_reports(block_ms=None) == 0
    store.redis.delete("broker:agent-events")  # its consumer group goes with it
    store.report("a", job.id, 1, "started")
    applied = [server.fold_reports(block_ms=None) for _ in range(2)]  # the group made again, from the start
    assert sum(applied) == 1
    assert store.get_job(job.id).state == JobState.running


def test_a_new_job_wakes_a_server_waiting_for_reports(store, catalog, dispatched):
    server, _ = dispatched
    assert server.fold_reports(block_ms=None) == 0  # nothing left: a round would wait its whole block for a report
    offer = store.get_agent("a").offer
    store.register_agent(AgentInfo(id="b", offer=offer, host="h", pid=2, registered_at=datetime.now(UTC)), 60_000)
    job = Broker(store, catalog, planning.get(), SystemClock()).submit(
        make_spec(name="k", resources={"accelerators": ["L4:1"]})
    )
    started = time.monotonic()
    server.round(block_ms=4_000)
    assert time.monotonic() - started < 2  # woken by the submit, not by the end of its wait
    assert store.get_job(job.id).current_run.agent == "b"
    assert store.redis.xpending("broker:agent-events", "broker")["pending"] == 0  # the wake acked: it is no report


def test_reports_behind_a_burst_of_wakes_are_read_in_the_same_call(store, dispatched):
    server, job = dispatched
    assert server.fold_reports(block_ms=None) == 0
    with store.redis.pipeline() as pipe:
        for i in range(5):  # more than a page of wakes: jobs submitted at once
            store.wake(pipe, f"burst-{i}")
        pipe.execute()
    store.report("a", job.id, 1, "started")
    reports = store.read_reports("s", count=2, recover=False)
    assert [report["type"] for _, report in reports] == ["started"]
    assert store.redis.xpending("broker:agent-events", "broker")["pending"] == 1  # the report, to be acked once applied


def test_a_server_does_not_parse_again_the_jobs_it_wrote(store, dispatched, monkeypatch):
    server, job = dispatched
    parsed, real = [], Job.model_validate_json
    monkeypatch.setattr(Job, "model_validate_json", lambda raw: parsed.append(raw) or real(raw))
    store.report("a", job.id, 1, "started")
    server.fold_reports(block_ms=None)
    store.report("a", job.id, 1, "exited", reason="finished", code=0)
    server.fold_reports(block_ms=None)
    assert store.get_job(job.id).state == JobState.done
    assert parsed == []  # each text it read back was one it wrote (the dispatch's, then each fold's)
    store.redis.set(f"broker:job:{job.id}", job.model_copy(update={"reason": "by another"}).model_dump_json())
    assert store.get_job(job.id).reason == "by another" and len(parsed) == 1  # a text it did not write: parsed


def test_a_round_reads_the_agents_only_when_a_job_waits(store, catalog, dispatched, monkeypatch):
    server, _ = dispatched
    monkeypatch.setattr(server_module, "GUARD_EVERY_S", 3600.0)  # the guard and the reclaim read agents on their
    server.lease_s = 3600.0  # own clocks: kept out of these rounds
    server.round(block_ms=1)  # the first round guards and reclaims

    def agent_reads_in_a_round() -> int:
        before = commands(store).get("cmdstat_smembers", 0)
        server.round(block_ms=1)
        return commands(store).get("cmdstat_smembers", 0) - before

    assert agent_reads_in_a_round() == 0  # the one job runs; nothing waits
    Broker(store, catalog, planning.get(), SystemClock()).submit(
        make_spec(name="k", resources={"accelerators": ["L4:1"]})
    )
    assert agent_reads_in_a_round() == 1  # a job waits (for agent `a`, busy)
