"""Retention (`broker server --keep-ended-days`): the jobs that ended long enough ago are forgotten with their
checkpoints, and every reader agrees they are gone; a store kept every job it ever ran (7-20 KB of Redis each)."""

from datetime import UTC, datetime, timedelta

from broker import planning
from broker.agents.checkpoints import CheckpointStore
from broker.app.ledger import Ledger
from broker.app.metrics import ServerMetrics
from broker.core import retention
from broker.core.clock import ManualClock
from broker.core.replica import Replica
from broker.core.retention import Retention
from broker.core.server import BrokerServer
from broker.domain.model import AgentInfo, JobState
from broker.store import evidence, figures
from broker.store.retention import forget
from broker.store.shards import ShardedStore

ENDED = ["crashed", "late", "migrated", "stopped"]  # seeded_jobs: ended now; "waiting" is queued


def checkpoint(checkpoints: CheckpointStore, job_id: str):
    step = checkpoints.fs
    step.makedirs(checkpoints.step_dir(job_id, 1), exist_ok=True)
    step.pipe(checkpoints.step_dir(job_id, 1) + "/model.pt", b"weights")


def test_jobs_that_ended_before_the_retention_are_forgotten_with_their_checkpoints_and_every_reader_agrees(
    store, seeded, tmp_path
):
    now = datetime.now(UTC)
    checkpoints = CheckpointStore(str(tmp_path / "ckpt"))
    for job_id in ("migrated", "waiting"):
        checkpoint(checkpoints, job_id)
    market = store.redis.hgetall(store.key(evidence.KEY))
    metrics = ServerMetrics(store)
    keep = Retention(timedelta(hours=1), checkpoints, metrics)
    assert keep.forget_ended(store, now + timedelta(minutes=30)) == []  # ended half an hour before: kept
    assert sorted(keep.forget_ended(store, now + timedelta(hours=2))) == ENDED
    assert metrics.registry.get_sample_value("broker_jobs_forgotten_total") == len(ENDED)
    keep.wait()
    assert not checkpoints.fs.exists(checkpoints.job_dir("migrated"))
    assert checkpoints.fs.exists(checkpoints.job_dir("waiting"))  # a job not ended keeps them

    assert [j.id for j in store.list_jobs()] == ["waiting"] and store.job_count() == 1
    assert [f.id for f in Ledger(store).figures(now)] == ["waiting"]  # cost-report and the dashboard
    assert store.redis.hkeys(store.key(figures.KEY)) == ["waiting"]
    counted, _ = store.totals_and_running()  # the metrics' counters lost what the jobs added ...
    assert counted.jobs[JobState.queued] == 1 and sum(counted.jobs.values()) == 1 and counted.spend_usd == 0
    store.redis.delete(store.key("totals"))  # ... and agree with a count of the jobs left
    assert store.totals_and_running()[0] == counted
    assert store.redis.hgetall(store.key(evidence.KEY)) == market  # the market's evidence is the clouds', kept


def test_a_job_changed_since_it_was_read_or_a_lost_planning_lease_forgets_nothing(store, seeded):
    done = store.get_job("migrated")
    store.update_job("migrated", lambda j: j.model_copy(update={"updated_at": j.updated_at + timedelta(seconds=1)}))
    assert forget(store, [done]) == [] and store.get_job("migrated")  # changed: left for a later pass
    store.lead("server-a", 60_000)
    assert forget(store, [store.get_job("migrated")], leader="server-b") == []
    assert forget(store, [store.get_job("migrated"), store.get_job("waiting")], leader="server-a") == ["migrated"]
    run = store.get_job("crashed").runs[0].model_copy(update={"ended_at": None, "end_reason": None})
    store.update_job(  # cancelled while its run is under way: among the jobs with a run until its agent's exit
        "waiting", lambda j: j.model_copy(update={"state": JobState.cancelled, "runs": [run], "fence": 1})
    )
    assert forget(store, [store.get_job("waiting")]) == [] and store.redis.sismember(store.key("active"), "waiting")


def test_each_page_starts_after_the_jobs_the_last_kept_so_old_unended_jobs_hold_nothing_up(
    store, seeded, tmp_path, monkeypatch
):
    monkeypatch.setattr(retention, "PAGE", 2)
    now = datetime.now(UTC)
    for job_id in ("crashed", "late"):  # the oldest two by id (all were submitted together): ended later
        store.update_job(job_id, lambda j: j.model_copy(update={"updated_at": now + timedelta(hours=5)}))
    keep = Retention(timedelta(hours=1), CheckpointStore(str(tmp_path)))
    passes, due = [], []
    for _ in range(3):
        due.append(keep.due())
        passes.append(keep.forget_ended(store, now + timedelta(hours=2)))
    assert passes == [[], ["migrated", "stopped"], []]
    assert due == [True, True, True] and not keep.due()  # a pass each round while pages come full, then a minute
    assert sorted(j.id for j in store.list_jobs()) == ["crashed", "late", "waiting"]


def test_a_replica_forgets_ended_jobs_in_the_shards_it_leads(redis_url, catalog, tmp_path):
    from seeded_jobs import seed_jobs

    sharded = ShardedStore(redis_url, "broker:", 2)
    seed_jobs(sharded, catalog)
    clock = ManualClock(datetime.now(UTC) + timedelta(days=3))
    checkpoints = CheckpointStore(str(tmp_path))

    def make(shard):
        return BrokerServer(shard, planning.get(), clock, checkpoints, "r1")

    replica = Replica(sharded, make, "r1", retention=Retention(timedelta(days=2), checkpoints))
    replica.round(block_ms=10)
    assert [j.id for j in sharded.list_jobs()] == ["waiting"]
    assert {shard.job_count() for shard in sharded.shards} == {0, 1}


def test_the_log_streams_of_agents_removed_before_the_cutoff_go_unless_they_registered_again(store, catalog, tmp_path):

    now = datetime.now(UTC)
    for agent_id in ("gone", "back", "recent"):
        store.register_agent(
            AgentInfo(id=agent_id, offer=catalog.offers[0], host="h", pid=1, registered_at=now), 60_000
        )
        store.append_log(agent_id, "j", 1, ["step 1"])
    store.remove_agent("gone")
    store.remove_agent("back")
    store.register_agent(AgentInfo(id="back", offer=catalog.offers[0], host="h", pid=2, registered_at=now), 60_000)
    keep = Retention(timedelta(hours=1), CheckpointStore(str(tmp_path)))
    keep.forget_ended(store, now + timedelta(minutes=30))
    assert store.redis.exists(store.key("log", "gone"))  # removed half an hour before: kept
    keep.forget_ended(store, now + timedelta(hours=2))
    assert not store.redis.exists(store.key("log", "gone"))
    assert store.redis.exists(store.key("log", "back")) and store.redis.exists(store.key("log", "recent"))
    assert store.redis.zcard(store.key("removed")) == 0  # "back" is listed again when it is removed again


def test_on_a_cluster_each_shard_forgets_in_its_own_slot(cluster_url, catalog, tmp_path):
    from seeded_jobs import seed_jobs

    sharded, now = ShardedStore(cluster_url, "broker:", 3), datetime.now(UTC)
    seed_jobs(sharded, catalog)
    agents = sharded.of_agent("a1")
    agents.register_agent(AgentInfo(id="a1", offer=catalog.offers[0], host="h", pid=1, registered_at=now), 60_000)
    agents.append_log("a1", "j", 1, ["out"])
    agents.remove_agent("a1")
    keep = Retention(timedelta(hours=1), CheckpointStore(str(tmp_path)))
    gone = [i for shard in sharded.shards for i in keep.forget_ended(shard, now + timedelta(hours=2), None)]
    assert sorted(gone) == ENDED and [j.id for j in sharded.list_jobs()] == ["waiting"]
    assert not agents.redis.exists(agents.key("log", "a1"))
