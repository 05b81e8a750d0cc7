"""Waiting jobs moved between shards (store/moves.py) under random interleavings of what users (submit, cancel,
amend), agents (take and start, exit, leave the fleet, join it again), the shards' servers (rounds, a planning
lease lost), rehoming passes and movers do, the movers dying after any of a move's transactions or, deposed, going on
later (hypothesis's stateful testing over the real store). After every step: each job is found once, through its
routes; a shard queues or runs only the jobs that are its own; an ended job stays ended and an amend stays made; and
the shards' totals and figures agree with the jobs (but those of a move noted and not finished)."""

import contextlib
import itertools
from unittest import mock

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from redis.client import Pipeline
from redis.cluster import ClusterPipeline

from broker import planning
from broker.agents.checkpoints import CheckpointStore
from broker.agents.contract import Contract, Unregistered
from broker.core.broker import Broker
from broker.core.clock import SimulatedClock
from broker.core.rehoming import rehome
from broker.core.server import BrokerServer
from broker.domain.errors import BrokerError
from broker.domain.model import Job, JobState, Tier
from broker.store import figures, moves, totals
from broker.store.shards import ShardedStore, agent_id_in
from conftest import NOW, Users, make_spec, run_machine

SHARDS = 3
LEASE_MS = 10**10  # leases lapse only when a rule takes one
PREFIXES = itertools.count()
QUOTES = {}  # (hours, budget) -> the quote of such a job


class MoverDied(Exception):
    """The process moving a job died (its transactions after this one never ran)."""


@contextlib.contextmanager
def dies_after(transactions: int):
    """Patch a mover to die at its transaction number `transactions` + 1 (it never runs), on one Redis or a cluster."""
    done = itertools.count()

    def counting(execute):
        def counted(pipe, *args, **kwargs):
            if next(done) >= transactions:
                raise MoverDied
            return execute(pipe, *args, **kwargs)

        return counted

    with (
        mock.patch.object(Pipeline, "execute", counting(Pipeline.execute)),
        mock.patch.object(ClusterPipeline, "execute", counting(ClusterPipeline.execute)),
    ):
        yield


class Moves(Users, RuleBasedStateMachine):
    redis_url = catalog = root = None  # set by the test

    def __init__(self):
        super().__init__()
        self.store = ShardedStore(self.redis_url, f"moves{next(PREFIXES)}:", SHARDS)
        self.clock = SimulatedClock(NOW)
        policy = planning.get()
        self.broker = Broker(self.store, self.catalog, policy, self.clock)
        checkpoints = CheckpointStore(str(self.root))
        self.servers = [
            [
                BrokerServer(
                    shard, policy, self.clock, checkpoints, f"s{i}-{r}", leader_lease_s=10**6, shards=self.store.shards
                )
                for r in (0, 1)
            ]
            for i, shard in enumerate(self.store.shards)
        ]
        l4 = [
            o for o in self.catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1 and o.tier == Tier.spot
        ]
        self.offer = min(l4, key=lambda o: o.price_usd_per_h)
        self.agents = [agent_id_in("agent", i, SHARDS) for i in range(SHARDS)]
        self.contracts = {name: Contract(self.store.of_agent(name), name) for name in self.agents}
        self.present = set(self.agents)
        self.holding: dict[str, tuple[str, int]] = {}
        self.jobs: list[str] = []
        self.ended: set[str] = set()
        self.budgets: dict[str, float | None] = {}  # job -> the budget it was last given
        self.paused: list[tuple] = []  # movers deposed mid-move: (job, source, (target, epoch), leader)

    def index(self, shard) -> int:
        return self.store.shards.index(shard)

    # -- users ---------------------------------------------------------------------------

    @rule(shard=st.integers(0, SHARDS - 1), hours=st.sampled_from([0.5, 8.0]), budget=st.sampled_from([None, 50.0]))
    def submit(self, shard, hours, budget):
        fields = {"resources": {"accelerators": ["L4:1"]}, "work": {"gpu_hours": hours}}
        fields |= {"budget_usd": budget} if budget else {}
        if (hours, budget) not in QUOTES:
            QUOTES[hours, budget] = self.broker.quote(make_spec(NOW, **fields))
        job_id = agent_id_in(f"job-{len(self.jobs)}", shard, SHARDS)
        now = self.clock.now()
        job = Job(
            id=job_id, spec=make_spec(now, **fields), submitted_at=now, updated_at=now, quote=QUOTES[hours, budget]
        )
        self.store.add_job(job)
        self.jobs.append(job_id)
        self.budgets[job_id] = budget

    @precondition(lambda self: self.jobs)
    @rule(pick=st.integers(0, 50), budget=st.sampled_from([60.0, 70.0]))
    def amend(self, pick, budget):
        job_id = self.jobs[pick % len(self.jobs)]
        try:
            self.broker.amend(job_id, budget_usd=budget)
        except BrokerError:  # ended
            return
        self.budgets[job_id] = budget

    # -- agents --------------------------------------------------------------------------

    def register(self, name):
        self.contracts[name].register(self.offer, LEASE_MS, host="test", pid=0, at=self.clock.now())

    @initialize()
    def fleet(self):
        """The fleet registered and a job waiting in each shard (an example that starts empty spends its steps
        filling it)."""
        for name in self.agents:
            self.register(name)
        for shard in range(SHARDS):
            self.submit(shard, 8.0, None)

    @precondition(lambda self: self.present - set(self.holding))
    @rule(shard=st.integers(0, SHARDS - 1))
    def take_and_start(self, shard):
        name = self.agents[shard]
        if name not in self.present or name in self.holding:
            return
        try:
            assignment = self.contracts[name].take(None)
        except Unregistered:
            return
        if assignment is not None:
            self.contracts[name].started(assignment, at=self.clock.now().timestamp())
            self.holding[name] = (assignment.job, assignment.fence)

    @precondition(lambda self: self.holding)
    @rule(pick=st.integers(0, SHARDS - 1), reason=st.sampled_from(["finished", "preempted"]))
    def exit(self, pick, reason):
        name = sorted(self.holding)[pick % len(self.holding)]
        if name in self.holding:
            job, fence = self.holding.pop(name)
            self.contracts[name].exited(job, fence, reason, at=self.clock.now().timestamp())

    @precondition(lambda self: self.present)
    @rule(shard=st.integers(0, SHARDS - 1))
    def agent_goes(self, shard):
        """The instance is gone, with what it ran: its jobs in that shard are stranded until it comes back."""
        name = self.agents[shard]
        if name in self.present:
            self.present.discard(name)
            self.holding.pop(name, None)
            self.contracts[name].remove()

    @precondition(lambda self: len(self.present) < SHARDS)
    @rule(shard=st.integers(0, SHARDS - 1))
    def agent_comes(self, shard):
        name = self.agents[shard]
        if name not in self.present:
            self.present.add(name)
            self.contracts[name] = Contract(self.store.of_agent(name), name)
            self.register(name)

    # -- servers and movers ----------------------------------------------------------------

    @rule(shard=st.integers(0, SHARDS - 1), replica=st.integers(0, 1), minutes=st.sampled_from([1, 30]))
    def server_round(self, shard, replica, minutes):
        self.clock.advance(minutes=minutes)
        self.servers[shard][replica].step()

    @rule(shard=st.integers(0, SHARDS - 1))
    def planning_lease_lapses(self, shard):
        self.store.shards[shard].redis.delete(self.store.shards[shard].key("leader"))

    @rule(shard=st.integers(0, SHARDS - 1), dies=st.sampled_from([0, 1, 2, 3, 9]))
    def rehoming_pass(self, shard, dies):
        """The shard's leader finishes its moves left half done and moves its stranded jobs; it may die midway."""
        leader = self.store.shards[shard].planner()
        if leader is not None:
            try:
                with dies_after(dies):
                    rehome(self.store, {shard: leader}, self.clock.now())
            except MoverDied:
                pass

    @precondition(lambda self: self.jobs)
    @rule(
        pick=st.integers(0, 50),
        to=st.integers(1, SHARDS - 1),
        dies=st.sampled_from([0, 1, 2, 3, 9]),
        paused=st.booleans(),
    )
    def move(self, pick, to, dies, paused):
        """A move of a job by its shard's leader, which may die after any transaction, or be deposed there and go on
        later (`paused`)."""
        job_id = self.jobs[pick % len(self.jobs)]
        source = self.index(self.store.of_job(job_id))
        leader = self.store.shards[source].planner()
        if leader is None:
            return
        target = (source + to) % SHARDS
        try:
            with dies_after(dies):
                moves.move_job(self.store.shards, job_id, source, target, leader, self.clock.now())
        except MoverDied:
            noted = moves.unfinished_moves(self.store.shards[source]).get(job_id)
            if paused and noted:  # past the move's note: a mover deposed there goes on with it later
                self.paused.append((job_id, source, noted, leader))

    @precondition(lambda self: self.paused)
    @rule(pick=st.integers(0, 50))
    def paused_mover_goes_on(self, pick):
        """A mover deposed mid-move goes on (one whose replica leads again did not pause: that replica acted since)."""
        if self.paused:
            job_id, source, move, leader = self.paused.pop(pick % len(self.paused))
            if self.store.shards[source].planner() != leader:
                moves.finish_move(self.store.shards, job_id, source, move, leader, self.clock.now())

    # -- what holds after every step -----------------------------------------------------

    def noted(self) -> set[str]:
        """Jobs of a move noted and not finished."""
        return {job_id for shard in self.store.shards for job_id in moves.unfinished_moves(shard)}

    @invariant()
    def each_job_is_found_once_and_keeps_what_users_did(self):
        listed = [job.id for job in self.store.list_jobs()]
        assert sorted(listed) == sorted(set(listed)), listed
        for job_id in self.jobs:
            job = self.store.get_job(job_id)
            if job_id in self.ended:
                assert job.state.terminal, f"{job_id} ended, now {job.state.value}: {job.reason}"
            if job.state.terminal:
                self.ended.add(job_id)
            assert job.spec.budget_usd == self.budgets[job_id], (job_id, job.spec.budget_usd, self.budgets[job_id])

    @invariant()
    def a_shard_queues_and_runs_only_its_own_jobs(self):
        for i, shard in enumerate(self.store.shards):
            for job_id in shard.redis.zrange(shard.key("pending"), 0, -1) + list(
                shard.redis.smembers(shard.key("active"))
            ):
                assert self.index(self.store.of_job(job_id)) == i, (job_id, i)
            for agent in shard.agents():
                if agent.job is not None:
                    assert self.index(self.store.of_job(agent.job)) == i, (agent.id, agent.job, i)
        noted = self.noted()
        for job in self.store.list_jobs():
            shard = self.store.of_job(job.id)
            queued = shard.redis.zscore(shard.key("pending"), job.id) is not None
            assert queued == job.pending or job.id in noted, (job.id, job.state, queued)

    @invariant()
    def every_copy_handed_over_is_one_a_move_can_still_land(self):
        """A copy in a target belongs to a move noted in its source (or to a paused mover, which may yet drop it):
        none is left behind that no step would land or delete."""
        moving = {
            (job_id, move) for shard in self.store.shards for job_id, move in moves.unfinished_moves(shard).items()
        }
        moving |= {(job_id, move) for job_id, _, move, _ in self.paused}
        for i, shard in enumerate(self.store.shards):
            for job_id, text in shard.redis.hgetall(shard.key(moves.HANDED)).items():
                assert (job_id, (i, moves.parse_handed(text)[0])) in moving, (job_id, i, text[:20])

    @invariant()
    def the_totals_and_figures_agree_with_the_jobs(self):
        """As moves.py counts a job in a move: in the shard it leaves until it is handed over; then in the target's,
        its changes since the hand-over alone, until it lands there."""
        counted, records, handed = [], {}, set()
        for job_id in self.jobs:
            job = self.store.get_job(job_id)
            source = next((s for s in self.store.shards if job_id in moves.unfinished_moves(s)), None)
            raw = None if source is None else source.redis.get(source.key("job", job_id))
            target = self.store.of_job(job_id)
            held = moves.parse_handed(target.redis.hget(target.key(moves.HANDED), job_id))
            if source is None or raw is not None or held is None:  # no move, not handed over, or landed
                counted.append((job if raw is None else Job.model_validate_json(raw), 1))
                records[job_id] = figures.record(counted[-1][0])
                continue
            handed.add(job_id)
            counted += [(Job.model_validate_json(held[1]), -1), (job, 1)]
        states, spend = dict.fromkeys(JobState, 0), 0.0
        for job, sign in counted:
            if job.current_run is None:
                states[job.state] += sign
                spend += sign * job.cost_usd
        kept = {}
        for shard in self.store.shards:
            shard_totals = totals.Totals.parse(shard.redis.hgetall(shard.key(totals.KEY)))
            for state, n in shard_totals.jobs.items():
                states[state] -= n
            spend -= shard_totals.spend_usd
            for job_id, record in shard.redis.hgetall(shard.key(figures.KEY)).items():
                assert job_id not in kept, job_id
                kept[job_id] = record
        assert not any(states.values()) and spend == pytest.approx(0.0, abs=1e-6), states
        assert {k: v for k, v in kept.items() if k not in handed} == {k: v for k, v in records.items() if v}


def test_moves_between_shards_lose_nothing_whatever_the_order_of_events(redis_url, catalog, tmp_path):
    Moves.redis_url, Moves.catalog, Moves.root = redis_url, catalog, tmp_path
    run_machine(Moves, examples=100)  # each step reads three shards: 200 take 1.5 min


def test_moves_between_shards_on_a_cluster_write_each_transaction_in_one_slot(cluster_url, catalog, tmp_path):
    """The same on a real Redis Cluster, which refuses a transaction across slots (a write given the wrong shard)."""
    Moves.redis_url, Moves.catalog, Moves.root = cluster_url, catalog, tmp_path
    run_machine(Moves, examples=25)  # a cluster client's step is slower: 25 take 20 s
