"""A store split into shards on a real 3-node Redis Cluster: keys spread over the nodes, each shard's
transactions stay in one slot, and server replicas share out the shards' planning and take over a leaver's."""

import time

import pytest
from redis.cluster import RedisCluster

from broker import planning
from broker.agents.agent import Agent
from broker.agents.checkpoints import CheckpointStore
from broker.app.cli.jobs import newest_jobs
from broker.app.ledger import Ledger
from broker.app.settings import Settings
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.core.replica import Replica, owner
from broker.core.server import BrokerServer
from broker.domain.errors import BrokerError
from broker.domain.model import JobState, Tier
from broker.store import evidence, figures
from broker.store.capacity import CapacityHistory, fleet_seen
from broker.store.shards import ShardedStore, agent_id_in, shard_of
from conftest import NOW, make_spec

SHARDS = 4


def l4_on_demand(catalog):
    offers = [o for o in catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1]
    return min((o for o in offers if o.tier == Tier.on_demand), key=lambda o: o.price_usd_per_h)


class Fleet:
    """A sharded store on the cluster, two agents per shard, server replicas made on demand."""

    def __init__(self, url, tmp_path, catalog):
        self.store = ShardedStore(url, "broker:", SHARDS)
        self.root, self.runs = str(tmp_path / "ckpt"), tmp_path / "runs"
        self.policy = planning.get()
        self.broker = Broker(self.store, catalog, self.policy, SystemClock())
        offer = l4_on_demand(catalog)
        names = [f"agent-{i}" for i in range(200)]
        per_shard = [[n for n in names if shard_of(n, SHARDS) == s][:2] for s in range(SHARDS)]
        self.agents = [
            Agent(self.store.of_agent(name), name, offer, self.root, self.runs, heartbeat_s=0.2, lease_s=3.0)
            for names in per_shard
            for name in names
        ]
        for agent in self.agents:
            agent.register()
        self.spec = make_spec(run=["true"], resources={"accelerators": ["L4:1"]}, work={"gpu_hours": 0.01})

    def replica(self, name):
        def make(shard):
            return BrokerServer(shard, self.policy, SystemClock(), CheckpointStore(self.root), name, lease_s=3.0)

        return Replica(self.store, make, name, lease_s=1.0)

    def drive(self, replicas, until, timeout_s=60):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for agent in self.agents:
                agent.step(block_ms=5)
            for replica in replicas:
                replica.round(block_ms=5)
            if until():
                return
        jobs = [(j.id, j.state.value, j.reason) for j in self.store.list_jobs()]
        raise AssertionError(f"timed out; jobs: {jobs}; planners: {[s.planner() for s in self.store.shards]}")

    def all_done(self, jobs):
        return lambda: all(self.store.get_job(j.id).state == JobState.done for j in jobs)


@pytest.fixture
def fleet(cluster_url, tmp_path, catalog):
    return Fleet(cluster_url, tmp_path, catalog)


def test_shards_spread_over_the_cluster_and_read_back_as_one_store(cluster_url, catalog):
    store = ShardedStore(cluster_url, "broker:", SHARDS)
    broker = Broker(store, catalog, planning.get(), SystemClock())
    jobs = [broker.submit(make_spec(name=f"job{i}", priority=i % 3)) for i in range(12)]
    assert isinstance(store.redis, RedisCluster)
    assert [s.prefix for s in store.shards] == [f"broker:{{{i}}}:" for i in range(SHARDS)]
    nodes = {store.redis.get_node_from_key(s.key("jobs")).port for s in store.shards}
    assert len(nodes) >= 2  # the shards' slots lie on more than one node
    assert [j.id for j in store.list_jobs()] == [j.id for j in jobs]
    assert store.pending_count() == 12 and len(store.pending_jobs(0, 5)) == 5
    queue = store.pending_jobs(0, 12)
    assert [j.urgency for j in queue] == sorted(j.urgency for j in queue)
    assert [j.id for j in store.pending_jobs(5, 4)] == [j.id for j in queue[5:9]]
    assert [j.id for j in store.recent_jobs(3)] == [j.id for j in jobs[-3:]]
    index = {job_id: at for shard in store.shards for job_id, at in shard.job_index().items()}
    assert index == {j.id: j.submitted_at.timestamp() for j in jobs} and store.job_count() == 12
    assert [j.id for j in store.unfinished_jobs()] == [j.id for j in jobs]  # each shard's indexes, in one read
    assert [evidence.seen(s) for s in store.shards] == [{}] * SHARDS  # tallied in each shard's slot (no spot runs)
    assert all(s.redis.hget(s.key(evidence.KEY), evidence.COUNTED) for s in store.shards if s.job_count())
    cancelled = broker.cancel(jobs[5].id)  # a transaction in the job's shard: job, event, indexes, totals
    assert cancelled.state == JobState.cancelled and store.pending_count() == 11
    counted = [shard.totals_and_running() for shard in store.shards]  # each read in one transaction, in its slot
    assert [c.jobs[JobState.cancelled] for c, _ in counted] == [s is store.of_job(jobs[5].id) for s in store.shards]
    assert sum(c.jobs[JobState.queued] for c, _ in counted) == 11 and not any(running for _, running in counted)
    assert [e["state"] for e in store.events(jobs[5].id)] == ["queued", "cancelled"]
    assert sum(1 for e in store.events() if e["state"] == "queued") == 12
    assert len(Ledger(store).figures(NOW)) == 12
    newest = newest_jobs(store, {JobState.queued}, 3)  # each shard's records read in its slot, merged
    assert ([j.id for j in newest[0]], newest[1]) == ([j.id for j in jobs if j.id != cancelled.id][-3:], 11)
    for shard in store.shards:  # each job's figures kept in its shard's slot, read back there
        assert set(figures.read(shard, [j.id for j in jobs])) == {j.id for j in jobs if store.of_job(j.id) is shard}
    assert [(f.id, f.state) for f in Ledger(store).figures(NOW) if f.final] == [(cancelled.id, JobState.cancelled)]
    assert sorted(len(s.list_jobs()) for s in store.shards)[-1] < 12  # spread, not all in one shard
    assert store.clear_namespace() > 0 and store.list_jobs() == []


def test_two_replicas_share_the_shards_and_one_takes_over_when_the_other_leaves(fleet):
    first, second = fleet.replica("replica-a"), fleet.replica("replica-b")
    jobs = [fleet.broker.submit(fleet.spec) for _ in range(16)]

    def shared() -> bool:  # each shard planned by its owner; the first replica, alone when it started, looks who
        owners = [owner(["replica-a", "replica-b"], i) for i in range(SHARDS)]  # is alive every quarter lease
        return [shard.planner() for shard in fleet.store.shards] == owners

    fleet.drive([first, second], lambda: fleet.all_done(jobs)() and shared())  # the jobs may be done before that
    assert sorted(first.owned + second.owned) == list(range(SHARDS))
    assert first.owned and second.owned  # crc32 of these names splits 4 shards between them
    for job in jobs:  # each ran once, on an agent of its own shard
        (run,) = fleet.store.get_job(job.id).runs
        assert shard_of(run.agent, SHARDS) == shard_of(job.id, SHARDS)

    first.stop()
    later = [fleet.broker.submit(fleet.spec) for _ in range(8)]
    fleet.drive([second], fleet.all_done(later))
    assert second.owned == list(range(SHARDS))
    assert all(shard.planner() == "replica-b" for shard in fleet.store.shards)


def test_a_replica_gives_up_only_its_own_lease(fleet):
    shard = fleet.store.shards[0]
    assert shard.lead("replica-a", 5000) is not None
    assert not shard.resign("replica-b") and shard.planner() == "replica-a"
    assert shard.resign("replica-a") and shard.planner() is None
    assert shard.lead("replica-b", 5000) is not None  # the next holder gets a new fencing token


def test_fleet_capacity_sums_what_each_shard_saw(cluster_url):
    store = ShardedStore(cluster_url, "broker:", 2)  # each shard's series written by its Lua script on the cluster
    zone = ("aws", "us-east-1a", "g6.xlarge")
    at = NOW.timestamp()
    CapacityHistory(store.shards[0]).series.append([("|".join(zone), at, 2), ("|".join(zone), at + 60, 1)])
    CapacityHistory(store.shards[1]).series.append([("|".join(zone), at + 30, 3)])
    seen = fleet_seen(store.shards, NOW)
    assert seen[zone] == [(at, 2), (at + 30, 5), (at + 60, 4)]


def test_one_shard_on_one_redis_keeps_the_keys_stores_were_written_with(redis_url):
    assert ShardedStore(redis_url).shards[0].prefix == "broker:"
    assert [s.prefix for s in ShardedStore(redis_url, "broker:", 2).shards] == ["broker:{0}:", "broker:{1}:"]


def test_a_local_agent_for_a_job_is_named_into_the_job_s_shard():
    for job_id in ("train-1", "eval-2", "x"):
        name = agent_id_in(f"local-{job_id}", shard_of(job_id, 8), 8)
        assert name.startswith(f"local-{job_id}") and shard_of(name, 8) == shard_of(job_id, 8)


@pytest.mark.parametrize("value", ["0", "four", "-2"])
def test_a_bad_shard_count_is_one_line(value):
    with pytest.raises(BrokerError, match=r"BROKER_SHARDS: .* is not a shard count; set a whole number"):
        Settings.from_env({"BROKER_SHARDS": value})


@pytest.mark.parametrize("value", ["team*:", "b{1}:", "my jobs:"])
def test_a_key_prefix_that_keys_cannot_carry_is_one_line(value):
    """A glob character widened every agent's ACL key pattern to other keys; braces took the shards' hash tags."""
    with pytest.raises(BrokerError, match=r"BROKER_PREFIX: .* has characters keys cannot carry; use letters"):
        Settings.from_env({"BROKER_PREFIX": value})
    assert Settings.from_env({"BROKER_PREFIX": "team-a.prod:"}).prefix == "team-a.prod:"


def test_a_silent_replica_s_shards_pass_to_the_live_one_after_its_lease(redis_url, tmp_path):
    store = ShardedStore(redis_url, "broker:", SHARDS)

    def replica(name):
        def make(shard):
            checkpoints = CheckpointStore(str(tmp_path))
            return BrokerServer(shard, planning.get(), SystemClock(), checkpoints, name, leader_lease_s=2.0)

        return Replica(store, make, name, lease_s=2.0)  # a pause of a busy machine under 2 s changes nothing

    first, second = replica("replica-a"), replica("replica-b")
    for r in (first, second, first):
        r.round(block_ms=1)
    assert first.owned and second.owned
    held = list(first.owned)
    assert all(store.shards[i].planner() == "replica-a" for i in held)
    time.sleep(2.4)  # replica-a goes silent: no heartbeat, its planning leases lapse
    second._checked = -float("inf")
    second.round(block_ms=1)
    assert second.owned == list(range(SHARDS))
    assert all(store.shards[i].planner() == "replica-b" for i in held)


def test_a_new_job_goes_to_a_shard_with_agents_it_fits_and_runs_there(redis_url, tmp_path, catalog):
    """A job runs only on its own shard's agents: with one L4 agent in four shards, every L4 job is given an id in
    that agent's shard, and runs; a job nothing fits is hashed to any shard, as before."""
    store = ShardedStore(redis_url, "broker:", SHARDS)
    name = next(n for n in (f"agent-{i}" for i in range(100)) if shard_of(n, SHARDS) == 2)
    root = str(tmp_path / "ckpt")
    # a lease that outlasts the submits below on a busy machine (it lapsed: jobs hashed to any shard)
    agent = Agent(
        store.of_agent(name), name, l4_on_demand(catalog), root, tmp_path / "runs", heartbeat_s=0.2, lease_s=60
    )
    agent.register()
    broker = Broker(store, catalog, planning.get(), SystemClock())
    l4 = make_spec(run=["true"], resources={"accelerators": ["L4:1"]}, work={"gpu_hours": 0.01})
    jobs = [broker.submit(l4) for _ in range(6)]
    assert {shard_of(job.id, SHARDS) for job in jobs} == {2}
    unfit = [broker.submit(make_spec(name=f"a100-{i}")) for i in range(12)]  # no A100 agent anywhere
    assert len({shard_of(job.id, SHARDS) for job in unfit}) > 1
    server = BrokerServer(store.shards[2], planning.get(), SystemClock(), CheckpointStore(root), "server")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(store.get_job(j.id).state != JobState.done for j in jobs):
        server.round(block_ms=5)
        agent.step(block_ms=5)
    assert [store.get_job(j.id).state for j in jobs] == [JobState.done] * 6


def test_a_job_in_a_shard_without_an_agent_that_fits_says_so_and_whether_another_shard_has_one(
    redis_url, tmp_path, catalog
):
    """`broker status` says when a job's own shard has no agent that fits it while others do (it is about to move:
    test_rehoming.py), rather than that no agent is registered."""
    from broker.core.waiting import waiting_for

    store = ShardedStore(redis_url, "broker:", SHARDS)
    name = next(n for n in (f"agent-{i}" for i in range(100)) if shard_of(n, SHARDS) == 2)
    agent = Agent(store.of_agent(name), name, l4_on_demand(catalog), str(tmp_path), tmp_path / "runs", lease_s=60)
    agent.register()  # its lease outlasts the submits below on a busy machine (nothing steps it)
    broker = Broker(store, catalog, planning.get(), SystemClock())
    job_id = next(j for j in (f"l4-{i}" for i in range(100)) if shard_of(j, SHARDS) == 1)
    l4 = broker.submit(make_spec(run=["true"], resources={"accelerators": ["L4:1"]}), job_id=job_id)
    BrokerServer(store.shards[1], planning.get(), SystemClock(), CheckpointStore(str(tmp_path)), "server").lead()
    why = waiting_for(store, store.get_job(l4.id))
    assert why.startswith("its shard (1 of 4, BROKER_SHARDS) has no agent that fits it; 1 in other shards do")
    a100 = broker.submit(
        make_spec(name="a100"), job_id=next(j for j in (f"a-{i}" for i in range(99)) if shard_of(j, SHARDS) == 1)
    )
    assert waiting_for(store, a100).endswith(
        f"nor does any other: start one (`broker agent`, `broker agents provision`, `broker run {a100.id}`)"
    )
