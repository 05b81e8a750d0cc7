"""A waiting job whose shard has no agent that fits it moves to a shard that has one, on a real Redis Cluster (the
move spans two slots) and on one Redis; a mover that dies midway is finished by the next pass, and a job that
changed meanwhile stays where it is."""

import time

import pytest

from broker import planning
from broker.agents.agent import Agent
from broker.agents.checkpoints import CheckpointStore
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.core.rehoming import rehome
from broker.core.replica import Replica
from broker.core.server import BrokerServer
from broker.core.waiting import waiting_for
from broker.domain import specfile
from broker.domain.errors import NotFoundError
from broker.domain.figures import JobFigures, figures
from broker.domain.model import JobState, Tier
from broker.store import figures as records
from broker.store import moves
from broker.store.moves import MOVING, ROUTE, parse_mark
from broker.store.shards import ShardedStore, shard_of
from conftest import NOW, make_spec

SHARDS = 4
L4 = {"run": ["true"], "resources": {"accelerators": ["L4:1"]}, "work": {"gpu_hours": 0.01}}


def in_shard(prefix: str, shard: int) -> str:
    return next(n for n in (f"{prefix}-{i}" for i in range(200)) if shard_of(n, SHARDS) == shard)


class World:
    """A sharded store with one L4 agent, in shard 2, and a job given an id in shard 1 (as if its agents had gone)."""

    def __init__(self, url, tmp_path, catalog):
        self.store = ShardedStore(url, "broker:", SHARDS)
        self.root = str(tmp_path / "ckpt")
        offers = [o for o in catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1]
        offer = min((o for o in offers if o.tier == Tier.on_demand), key=lambda o: o.price_usd_per_h)
        name = in_shard("agent", 2)
        # a lease that outlasts a test's submits on a busy machine (nothing here steps the agent)
        self.agent = Agent(
            self.store.of_agent(name), name, offer, self.root, tmp_path / "runs", heartbeat_s=0.2, lease_s=60
        )
        self.agent.register()
        self.broker = Broker(self.store, catalog, planning.get(), SystemClock())
        self.job = self.broker.submit(make_spec(**L4), job_id=in_shard("l4", 1))

    def lead(self, shard: int, name: str = "replica-a") -> None:
        BrokerServer(self.store.shards[shard], planning.get(), SystemClock(), CheckpointStore(self.root), name).lead()


def cut_off(monkeypatch, step: str, call) -> None:
    """Run `call` with the mover dying at `step` (a function of store/moves.py), as a killed process would."""

    def died(*_):
        raise ConnectionError("the mover died")

    monkeypatch.setattr(moves, step, died)
    with pytest.raises(ConnectionError):
        call()
    monkeypatch.undo()


def queued_in_totals(store) -> list[int]:
    """Each shard's count of queued jobs in its totals (store/totals.py), which a move carries from one to the other."""
    return [shard.totals_and_running()[0].jobs[JobState.queued] for shard in store.shards]


def kept_figures(store) -> list[dict[str, JobFigures]]:
    """Each shard's figures kept beside its jobs (store/figures.py), which a move carries from one to the other."""
    return [
        {i: JobFigures.from_json(i, text) for i, text in shard.redis.hgetall(shard.key(records.KEY)).items()}
        for shard in store.shards
    ]


@pytest.fixture
def world(redis_url, tmp_path, catalog):
    return World(redis_url, tmp_path, catalog)


def test_a_stranded_job_moves_to_a_shard_with_an_agent_and_runs_there_on_a_cluster(cluster_url, tmp_path, catalog):
    world = World(cluster_url, tmp_path, catalog)
    store, job = world.store, world.job

    def make(shard):
        return BrokerServer(shard, planning.get(), SystemClock(), CheckpointStore(world.root), "replica-a")

    replica = Replica(store, make, "replica-a", lease_s=1.0)
    replica.round(block_ms=1)  # it plans every shard, and its first round looks for stranded jobs
    assert store.of_job(job.id) is store.shards[2]
    assert parse_mark(store.shards[1].redis.hget(store.shards[1].key(ROUTE), job.id))[0] == 2
    assert store.shards[1].pending_count() == 0 and not store.shards[1].list_jobs()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and store.get_job(job.id).state != JobState.done:
        replica.round(block_ms=5)
        world.agent.step(block_ms=5)
    done = store.get_job(job.id)
    assert done.state == JobState.done and [r.agent for r in done.runs] == [world.agent.id]
    assert [j.id for j in store.list_jobs()] == [job.id]  # listed once
    reasons = [e["reason"] for e in store.events(job.id)]  # its events from both shards, in order
    assert reasons[0] == "submitted" and reasons[1] == "moved from shard 1: no agent there fits it"
    assert store.events(job.id)[-1]["state"] == "done"


def test_status_says_a_stranded_job_is_moving(world):
    world.lead(1)
    why = waiting_for(world.store, world.store.get_job(world.job.id))
    assert why == (
        "its shard (1 of 4, BROKER_SHARDS) has no agent that fits it; 1 in other shards do: the server moves it to one"
        " within 10 s"
    )


def test_only_the_shard_s_leader_moves_its_jobs_and_only_stranded_ones(world, catalog):
    store, job = world.store, world.job
    world.lead(1)
    assert rehome(store, {1: "replica-b"}, NOW) == 0  # not the leader: nothing moves
    assert store.of_job(job.id) is store.shards[1]
    stays = world.broker.submit(make_spec(**L4), job_id=in_shard("l4", 2))  # an agent of its shard fits it
    world.lead(2)
    assert rehome(store, {2: "replica-a"}, NOW) == 0 and store.of_job(stays.id) is store.shards[2]
    assert rehome(store, {1: "replica-a"}, NOW) == 1 and store.of_job(job.id) is store.shards[2]


def test_a_move_cut_off_after_the_hand_over_is_finished_by_the_next_pass(world, monkeypatch):
    store, job = world.store, world.job
    world.lead(1)
    cut_off(monkeypatch, "_land", lambda: rehome(store, {1: "replica-a"}, NOW))
    target = store.shards[2]
    assert store.get_job(job.id).state == JobState.queued  # read through the route: nothing lost
    assert target.pending_count() == 0  # not yet in the target's queue: no server there runs it half moved
    assert parse_mark(store.shards[1].redis.hget(store.shards[1].key(MOVING), job.id))[0] == 2
    assert queued_in_totals(store) == [0, 0, 0, 0]  # counted in neither shard until it lands
    assert kept_figures(store) == [{}] * 4  # nor its figures kept: it is read (through the route)
    assert rehome(store, {1: "replica-a"}, NOW) == 0  # finished, not moved again
    assert [j.id for j in target.pending_jobs()] == [job.id] and not store.shards[1].redis.hlen(
        store.shards[1].key(MOVING)
    )
    assert queued_in_totals(store) == [0, 0, 1, 0]  # then in the target's, once
    assert kept_figures(store) == [{}, {}, {job.id: figures(store.get_job(job.id), NOW)}, {}]


def test_a_job_cancelled_between_the_hand_over_and_its_landing_is_counted_once(world, monkeypatch):
    store, job = world.store, world.job
    world.broker.submit(make_spec(**L4), job_id=in_shard("l4", 2))  # the target counts from its first job on
    world.lead(1)
    cut_off(monkeypatch, "_land", lambda: rehome(store, {1: "replica-a"}, NOW))
    world.broker.cancel(job.id)  # through the route, to the copy not yet landed
    assert rehome(store, {1: "replica-a"}, NOW) == 0  # the next pass lands it
    counted = [shard.totals_and_running()[0].jobs for shard in store.shards]
    assert [c[JobState.queued] for c in counted] == [0, 0, 1, 0]  # the target's own job
    assert [c[JobState.cancelled] for c in counted] == [0, 0, 1, 0]
    assert kept_figures(store)[2][job.id].state == JobState.cancelled  # its figures as they are, not as handed over


def test_a_job_cancelled_before_the_hand_over_stays_cancelled_where_it_was(world, monkeypatch):
    store, job = world.store, world.job
    world.lead(1)
    cut_off(monkeypatch, "finish_move", lambda: moves.move_job(store.shards, job.id, 1, 2, "replica-a", NOW))
    world.broker.cancel(job.id)  # no route yet: the cancel goes to the job in shard 1
    rehome(store, {1: "replica-a"}, NOW)
    assert store.of_job(job.id) is store.shards[1] and store.get_job(job.id).state == JobState.cancelled
    assert store.shards[2].redis.get(store.shards[2].key("job", job.id)) is None  # the copy is gone
    assert not store.shards[1].redis.hlen(store.shards[1].key(MOVING))


def test_a_cancel_follows_a_job_handed_over_between_the_route_s_read_and_the_write(world, monkeypatch):
    store, job = world.store, world.job
    world.lead(1)
    of_job = ShardedStore.of_job

    def moved_meanwhile(self, job_id):  # the client reads where the job is, then the move hands it over
        shard = of_job(self, job_id)
        monkeypatch.setattr(ShardedStore, "of_job", of_job)
        assert rehome(store, {1: "replica-a"}, NOW) == 1
        return shard

    monkeypatch.setattr(ShardedStore, "of_job", moved_meanwhile)
    assert world.broker.cancel(job.id).state == JobState.cancelled  # not "no job"
    assert store.of_job(job.id) is store.shards[2] and store.get_job(job.id).state == JobState.cancelled


def test_an_amend_whose_job_is_handed_over_as_it_is_changed_is_made_where_the_job_went_on_a_cluster(
    cluster_url, tmp_path, catalog, monkeypatch
):
    world = World(cluster_url, tmp_path, catalog)
    store, job = world.store, world.job
    world.lead(1)
    validate, moved = specfile.validate_spec, []

    def moved_meanwhile(*args):  # the amend has read the job in shard 1; the move hands it over before the write
        if not moved:
            moved.append(rehome(store, {1: "replica-a"}, NOW))
        return validate(*args)

    monkeypatch.setattr(specfile, "validate_spec", moved_meanwhile)
    amended = world.broker.amend(job.id, budget_usd=7)  # not refused as a transaction across two slots
    assert moved == [1] and amended.spec.budget_usd == 7 and store.of_job(job.id) is store.shards[2]
    assert store.get_job(job.id).spec.budget_usd == 7
    assert [e["reason"] for e in store.events(job.id)][-1] == "amended: budget $7.00"


def test_a_job_moved_there_and_back_is_found_in_its_home_shard(world):
    store, job = world.store, world.job
    world.lead(1)
    world.lead(2)
    assert moves.move_job(store.shards, job.id, 1, 2, "replica-a", NOW)
    assert moves.move_job(store.shards, job.id, 2, 1, "replica-a", NOW)
    assert store.of_job(job.id) is store.shards[1]
    assert store.shards[1].redis.hget(store.shards[1].key(ROUTE), job.id) is None  # no route out of where it is
    assert [j.id for j in store.shards[1].pending_jobs()] == [job.id] and store.shards[2].pending_count() == 0
    assert [j.id for j in store.list_jobs()] == [job.id] and queued_in_totals(store) == [0, 1, 0, 0]
    assert [list(kept) for kept in kept_figures(store)] == [[], [job.id], [], []]  # none left where it was


def test_a_job_amended_after_its_move_was_noted_leaves_nothing_in_the_queue_it_left(world, monkeypatch):
    store, job = world.store, world.job
    world.lead(1)
    cut_off(monkeypatch, "finish_move", lambda: moves.move_job(store.shards, job.id, 1, 2, "replica-a", NOW))
    world.broker.amend(job.id, budget_usd=80.0)  # the move is only noted: the amend queues it in shard 1 again
    rehome(store, {1: "replica-a"}, NOW)  # the next pass finishes the move
    assert store.of_job(job.id) is store.shards[2] and store.get_job(job.id).spec.budget_usd == 80.0
    assert store.shards[1].pending_count() == 0


def moved_around(world) -> None:
    """The job moved from shard 1 to 2 and on to 3: shards 1 and 2 keep routes, shard 2's the newer."""
    for shard in (1, 2, 3):
        world.lead(shard)
    assert moves.move_job(world.store.shards, world.job.id, 1, 2, "replica-a", NOW)
    assert moves.move_job(world.store.shards, world.job.id, 2, 3, "replica-a", NOW)


def test_a_cancel_while_a_job_moves_back_to_a_shard_it_was_in_is_kept(world, monkeypatch):
    """The copy written in shard 2 is not reached through the route of the job's earlier stay there (a cancel reached
    it, and the next pass wrote the copy again over the cancel)."""
    store, job = world.store, world.job
    moved_around(world)
    hand_over = moves._hand_over

    def died_after_the_copy(*args):
        hand_over(*args)
        raise ConnectionError("the mover died")

    monkeypatch.setattr(moves, "_hand_over", died_after_the_copy)
    with pytest.raises(ConnectionError):
        moves.move_job(store.shards, job.id, 3, 2, "replica-a", NOW)
    monkeypatch.undo()
    assert world.broker.cancel(job.id).state == JobState.cancelled
    assert rehome(store, {3: "replica-a"}, NOW) == 0  # the next pass calls the move off: the job changed
    assert store.of_job(job.id) is store.shards[3] and store.get_job(job.id).state == JobState.cancelled
    assert store.shards[2].redis.get(store.shards[2].key("job", job.id)) is None  # the copy is gone


def test_a_mover_deposed_mid_move_that_goes_on_later_hides_nothing_and_leaves_no_copy(world, monkeypatch):
    store, job = world.store, world.job
    moved_around(world)
    cut_off(monkeypatch, "finish_move", lambda: moves.move_job(store.shards, job.id, 3, 2, "replica-a", NOW))
    noted = moves.unfinished_moves(store.shards[3])[job.id]  # its mover pauses here and loses shard 3's lease
    store.shards[3].redis.delete(store.shards[3].key("leader"))
    world.lead(3, "replica-b")
    rehome(store, {3: "replica-b"}, NOW)  # the new leader finishes the move: the job waits in shard 2
    assert store.of_job(job.id) is store.shards[2]
    assert moves.move_job(store.shards, job.id, 2, 3, "replica-a", NOW)  # and it moves on to shard 3 again
    assert not moves.finish_move(store.shards, job.id, 3, noted, "replica-a", NOW)  # the paused mover goes on
    assert store.of_job(job.id) is store.shards[3]  # found where it waits (its routes were broken at shard 2)
    two = store.shards[2]  # nor a copy left there that no move will land or delete
    assert two.redis.get(two.key("job", job.id)) is None and not two.redis.hlen(two.key(moves.HANDED))
    assert [j.id for j in store.shards[3].pending_jobs()] == [job.id] and world.broker.cancel(job.id)
    assert store.shards[3].pending_count() == 0 and store.get_job(job.id).state == JobState.cancelled


def test_a_moved_job_s_deadline_is_indexed_where_it_waits_now(world):
    """Unfinished jobs past their deadline are counted from an index in each shard (store/overdue.py)."""
    from datetime import UTC, datetime

    store = world.store
    job = world.broker.submit(make_spec(datetime.now(UTC), **L4, deadline="+6h"), job_id=in_shard("due", 1))
    world.lead(1)
    assert moves.move_job(store.shards, job.id, 1, 2, "replica-a", NOW)
    due = [shard.redis.zscore(shard.key("due"), job.id) for shard in store.shards]
    assert due == [None, None, job.spec.deadline.timestamp(), None]  # counted once, where it is


def test_an_agent_started_for_another_job_neither_keeps_a_job_in_its_shard_nor_draws_new_ones(world):
    """An agent `broker run` started for one job takes no other: one in a stranded job's shard does not keep it there
    (it waited beside it for good), and new jobs are not given ids in its shard for it."""
    from broker.agents.contract import Contract

    offer, store = world.agent.offer, world.store
    for shard in (1, 3):
        name = in_shard("for-another", shard)
        Contract(store.of_agent(name), name).register(offer, 60_000, for_job="another-job")
    world.lead(1)
    assert rehome(store, {1: "replica-a"}, NOW) == 1 and store.of_job(world.job.id) is store.shards[2]
    new = [world.broker.submit(make_spec(**L4)) for _ in range(6)]
    assert {shard_of(job.id, SHARDS) for job in new} == {2}


def test_retention_forgets_a_moved_job_s_routes_with_it(world, tmp_path):
    from datetime import timedelta

    from broker.core.clock import ManualClock
    from broker.core.retention import Retention

    store, job = world.store, world.job
    world.lead(1)
    world.lead(2)
    assert moves.move_job(store.shards, job.id, 1, 2, "replica-a", NOW)
    assert moves.move_job(store.shards, job.id, 2, 3, "replica-a", NOW)  # a route in shards 1 and 2
    world.broker.cancel(job.id)
    clock = ManualClock(store.get_job(job.id).updated_at + timedelta(days=3))
    checkpoints = CheckpointStore(world.root)

    def make(shard):
        return BrokerServer(shard, planning.get(), clock, checkpoints, "replica-a")

    Replica(store, make, "replica-a", retention=Retention(timedelta(days=2), checkpoints)).round(block_ms=1)
    with pytest.raises(NotFoundError):
        store.get_job(job.id)
    assert [shard.redis.hlen(shard.key(ROUTE)) for shard in store.shards] == [0] * SHARDS
