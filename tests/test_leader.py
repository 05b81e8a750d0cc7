"""Several `broker server` replicas on one Redis: one plans at a time (a lease with a fencing token), a
standby takes over within two lease periods when the leader dies, and a deposed leader writes nothing."""

import os
import signal
import subprocess
import sys
import time

import pytest

from broker import planning
from broker.agents.checkpoints import CheckpointStore
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.core.replica import Replica
from broker.core.server import BrokerServer
from broker.domain.model import AgentInfo, Job, JobState
from broker.store.shards import ShardedStore
from conftest import make_spec

LEASE_S = 1.0  # a pause of a busy machine shorter than this changes nothing; the tests wait 1.2 leases


def replica(store, tmp_path, name, lease_s=LEASE_S):
    return BrokerServer(
        store,
        planning.get(),
        SystemClock(),
        CheckpointStore(str(tmp_path / "ckpt")),
        consumer=name,
        leader_lease_s=lease_s,
    )


def idle_agent(store, catalog, agent_id="od-1"):
    offer = min(
        (
            o
            for o in catalog.offers
            if o.tier.value == "on_demand" and o.accelerator == "L4" and o.accelerator_count == 1
        ),
        key=lambda o: o.price_usd_per_h,
    )
    store.register_agent(
        AgentInfo(id=agent_id, offer=offer, host="test", pid=1, registered_at=SystemClock().now()), 60_000
    )


def submit(store, catalog, name="j"):
    return Broker(store, catalog, planning.get(), SystemClock()).submit(
        make_spec(name=name, resources={"accelerators": ["L4:1"]})
    )


def test_only_the_lease_holder_plans_and_a_standby_takes_over_with_a_higher_token(store, catalog, tmp_path):
    a, b = replica(store, tmp_path, "a"), replica(store, tmp_path, "b")
    assert a.lead() and a.token == 1
    assert not b.lead() and b.token is None
    idle_agent(store, catalog)
    job = submit(store, catalog)
    assert a.lead()  # renewed (submitting took a while)
    assert b.dispatch() == [] and store.get_job(job.id).fence == 0  # the standby dispatches nothing
    assert a.dispatch() == [(job.id, "od-1")]
    time.sleep(LEASE_S * 1.2)  # a stops renewing (it died)
    assert b.lead() and b.token == a.token + 1
    assert not a.lead()


def test_a_deposed_leader_cannot_dispatch_even_mid_round(store, catalog, tmp_path):
    a, b = replica(store, tmp_path, "a"), replica(store, tmp_path, "b")
    assert a.lead()
    idle_agent(store, catalog)
    job = submit(store, catalog)
    time.sleep(LEASE_S * 1.2)
    assert b.lead()  # a's lease lapsed (a long pause) and b took over
    agent = store.agents()[0]
    assert (
        a._assign([(store.get_job(job.id), agent)], hash_wait_s=None) == []
    )  # a still thinks it plans: the fence refuses the write
    assert store.get_job(job.id).fence == 0 and store.get_job(job.id).state == JobState.queued


def leading_server_process(redis_url, store, tmp_path, lease_s: float) -> subprocess.Popen:
    """`broker server --consumer proc` as a process, once it holds the planning lease."""
    env = {**os.environ, "BROKER_REDIS_URL": redis_url, "BROKER_HOME": str(tmp_path / "home")}
    argv = ["--consumer", "proc", "--leader-lease-s", str(lease_s), "--metrics-port", "0"]
    leader = subprocess.Popen(
        [sys.executable, "-m", "broker", "server", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "server.err").open("w"),  # a file: a pipe nobody reads could fill and stop the server
    )
    deadline = time.monotonic() + 60
    while store.redis.get("broker:leader") != "proc":
        if time.monotonic() > deadline or leader.poll() is not None:
            leader.kill()
            raise AssertionError("the server process never took the lease")
        time.sleep(0.05)
    return leader


def test_sigterm_of_the_leading_server_gives_its_lease_up_at_once(redis_url, store, tmp_path):
    """As systemd stops it: the standbys take over now, not a lease later (it ended at once, holding the lease)."""
    leader = leading_server_process(redis_url, store, tmp_path, lease_s=60)
    try:
        leader.send_signal(signal.SIGTERM)
        leader.wait(timeout=30)
        assert store.planner() is None
        said = (tmp_path / "server.err").read_text().splitlines()
        assert said[-1] == "broker server proc stopped; its planning leases are given up"
    finally:
        leader.kill()
        leader.wait()


def test_a_stop_that_lands_as_the_lease_is_granted_still_gives_it_up(redis_url, tmp_path):
    """SIGTERM between Redis granting the lease and the server noting its token (CI caught it): the server did not
    know it led, gave nothing up, and the standbys waited out the lease."""
    sharded = ShardedStore(redis_url, "broker:", 1)
    shard = sharded.shards[0]
    granted = shard.lead

    def lead_then_stopped(holder, lease_ms):
        granted(holder, lease_ms)
        raise KeyboardInterrupt  # the signal's handler runs before the token comes back to the server

    shard.lead = lead_then_stopped
    server = replica(shard, tmp_path, "proc", lease_s=60)
    leaving = Replica(sharded, lambda _: server, "proc", lease_s=60)
    with pytest.raises(KeyboardInterrupt):
        leaving.round(block_ms=1)
    assert shard.planner() == "proc" and server.token is None
    leaving.stop()
    assert shard.planner() is None


def test_kill_9_of_the_leading_server_process_hands_planning_to_the_standby(redis_url, store, tmp_path):
    leader = leading_server_process(redis_url, store, tmp_path, lease_s=1)
    try:
        standby = BrokerServer(
            store,
            planning.get(),
            SystemClock(),
            CheckpointStore(str(tmp_path / "ckpt")),
            consumer="standby",
            leader_lease_s=1.0,
        )
        assert not standby.lead()
        os.kill(leader.pid, signal.SIGKILL)
        killed = time.monotonic()
        while not standby.lead():
            time.sleep(0.02)
        took_over_s = time.monotonic() - killed
        assert took_over_s < 2 * 1.0, took_over_s
        assert standby.token == 2
    finally:
        leader.kill()
        leader.wait()


def test_a_round_reads_the_queue_in_pages_and_still_finds_a_fitting_job_far_down(store, catalog, tmp_path):
    """100 more urgent jobs need an A100 and no agent has one: the L4 job behind them still gets the idle L4
    agent, though the round's first page (what one idle agent needs) holds only A100 jobs."""
    now = SystemClock().now()
    for i, (gpu, priority) in enumerate([("A100:1", 5)] * 100 + [("L4:1", 0)]):
        spec = make_spec(name=f"j{i}", resources={"accelerators": [gpu]}, priority=priority, now=now)
        quote = planning.get().quote(spec, catalog.offers, now)
        store.add_job(Job(id=f"j{i:03d}", spec=spec, submitted_at=now, updated_at=now, quote=quote))
    idle_agent(store, catalog)
    # a lease no pause of a busy machine outlasts: one that lapsed mid-round would fence the round's write out
    server, pages = replica(store, tmp_path, "a", lease_s=60.0), []
    read = store.pending_jobs
    store.pending_jobs = lambda start, count: pages.append((start, count)) or read(start, count)
    assert server.dispatch() == [("j100", "od-1")]
    assert pages == [(0, 16), (16, 32), (48, 64)]  # a page for one idle agent, then twice that while it stays idle
