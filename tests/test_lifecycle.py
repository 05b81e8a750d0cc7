"""Jobs' lifecycles under random interleavings of what users (submit, cancel, amend), agents (take and start,
progress, a preemption notice, exit, heed the broker's view, lose their lease, restart) and two server replicas
(rounds on a simulated clock, the planning lease lost) do, over the real store (hypothesis's stateful testing). After
every step the store keeps its promises: a job that ended stays ended (but a budget-stopped one given more budget), a
job has one run under way at most and never runs again in a zone it was handed back from as unfit (a bubble its steps
do not fit), an agent's record names only the job whose run it holds and offers what the agent last offered (one
may offer another speed in the middle of a round, as a user may cancel a job), and the indexes and counters kept
beside the jobs agree with the jobs. After a round, every run under way is held by a live agent that names it."""

import itertools
import math
from pathlib import Path

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker import planning
from broker.agents.checkpoints import CheckpointStore
from broker.agents.contract import Contract, Unregistered, Verdict
from broker.core.broker import Broker
from broker.core.clock import SimulatedClock
from broker.core.server import BrokerServer
from broker.domain.errors import BrokerError
from broker.domain.model import Job, JobState, Tier
from broker.store import figures, totals
from broker.store.jobs import Store
from conftest import NOW, Users, make_spec, run_machine

AGENTS = ("a0", "a1")
LEASE_MS = 10**10  # the simulated clock does not move leases: they lapse only when a rule takes one
PREFIXES = itertools.count()
QUOTES = {}  # (hours, deadline, budget) -> the quote of such a job, or None where it is refused


class Lifecycle(Users, RuleBasedStateMachine):
    redis_url = catalog = root = None  # set by the test

    def __init__(self):
        super().__init__()
        self.prefix = prefix = f"life{next(PREFIXES)}"
        self.store = Store(self.redis_url, prefix=f"{prefix}:")
        self.clock = SimulatedClock(NOW)
        policy = planning.get()
        self.broker = Broker(self.store, self.catalog, policy, self.clock)
        self.checkpoints = checkpoints = CheckpointStore(str(self.root / prefix))
        self.saved: dict[str, list[tuple[int, str]]] = {}  # job -> (step, url) of each checkpoint saved, oldest first
        self.rotten: set[str] = set()  # urls of checkpoints whose file no longer matches its manifest
        # a lease longer than any test: a replica that led believes it still leads (it renews every quarter lease,
        # by wall time), so one deposed by a lapse goes on with its rounds, and only the fences stop its writes
        self.servers = [
            BrokerServer(self.store, policy, self.clock, checkpoints, consumer=f"s{i}", leader_lease_s=10**6)
            for i in (1, 2)
        ]
        l4 = [o for o in self.catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1]
        spot = min((o for o in l4 if o.tier == Tier.spot), key=lambda o: o.price_usd_per_h)
        on_demand = min((o for o in l4 if o.tier == Tier.on_demand), key=lambda o: o.price_usd_per_h)
        self.offers = dict(zip(AGENTS, (spot, on_demand)))
        self.contracts = {name: Contract(self.store, name) for name in AGENTS}
        self.registered = set(AGENTS)
        self.holding: dict[str, tuple[str, int]] = {}  # agent -> (job, fence) it runs
        self.lapsed: set[str] = set()  # agents whose lease lapsed and that have not noticed yet
        self.jobs: list[str] = []
        self.ended: set[str] = set()  # jobs seen ended

    def now_s(self) -> float:
        return self.clock.now().timestamp()

    def free(self, name: str) -> bool:
        """Whether the agent would take work now."""
        return name in self.registered and name not in self.holding and name not in self.lapsed

    def holder(self, pick: int) -> str:
        """One of the agents that run a job (rules that act on a run are drawn only while one does)."""
        return sorted(self.holding)[pick % len(self.holding)]

    # -- users ---------------------------------------------------------------------------

    @rule(
        hours=st.sampled_from([0.5, 2.0, 8.0]),
        deadline=st.sampled_from([None, "+6h", "+48h"]),
        budget=st.sampled_from([None, 0.5, 50.0]),
        restarts=st.integers(0, 2),
    )
    def submit(self, hours, deadline, budget, restarts):
        """A job stored as `broker submit` stores it, with the quote of its kind made once (a quote simulates its
        futures: most of a step's time), or refused as that quote was."""
        fields = {"resources": {"accelerators": ["L4:1"]}, "work": {"gpu_hours": hours}, "max_restarts": restarts}
        fields |= {k: v for k, v in (("deadline", deadline), ("budget_usd", budget)) if v is not None}
        spec = make_spec(self.clock.now(), **fields)
        kind = (hours, deadline, budget)
        if kind not in QUOTES:
            try:
                QUOTES[kind] = self.broker.quote(make_spec(NOW, **fields))
            except BrokerError:  # refused (no option meets it): nothing stored
                QUOTES[kind] = None
        if QUOTES[kind] is not None:
            job_id = f"job-{len(self.jobs)}"
            now = self.clock.now()
            self.store.add_job(Job(id=job_id, spec=spec, submitted_at=now, updated_at=now, quote=QUOTES[kind]))
            self.jobs.append(job_id)

    @precondition(lambda self: self.jobs)
    @rule(pick=st.integers(0, 50), budget=st.sampled_from([None, 1.0, 100.0]), deadline=st.sampled_from([None, "+3h"]))
    def amend(self, pick, budget, deadline):
        if budget or deadline:
            job_id = self.jobs[pick % len(self.jobs)]
            try:
                self.broker.amend(job_id, deadline=deadline, budget_usd=budget)
            except BrokerError:  # ended, or its stopped run not closed yet, or less than it spent
                return
            if not self.store.get_job(job_id).state.terminal:
                self.ended.discard(job_id)  # a budget-stopped job given more: back in the queue

    # -- agents --------------------------------------------------------------------------

    @initialize()
    def register(self):
        """The fleet registered and two jobs waiting (an example that starts empty spends its steps filling it)."""
        for name in AGENTS:
            self.contracts[name].register(self.offers[name], LEASE_MS, host="test", pid=0, at=self.clock.now())
        self.submit(2.0, None, 50.0, 1)
        self.submit(0.5, "+48h", None, 0)

    @precondition(lambda self: any(self.free(name) for name in AGENTS))
    @rule(name=st.sampled_from(AGENTS))
    def take_and_start(self, name):
        if not self.free(name):
            return
        try:
            assignment = self.contracts[name].take(None)
        except Unregistered:  # removed as lost: it registers again
            self.registered.discard(name)
            return
        if assignment is not None:
            self.contracts[name].started(assignment, at=self.now_s())
            self.holding[name] = (assignment.job, assignment.fence)

    @precondition(lambda self: self.holding)
    @rule(pick=st.integers(0, 1), done=st.integers(1, 999), saved=st.booleans())
    def progress(self, pick, done, saved):
        """The job's progress, and a checkpoint it saved (its files, then its manifest) reported with it."""
        name = self.holder(pick)
        job, fence = self.holding[name]
        self.contracts[name].report(job, fence, "progress", at=self.now_s(), done=done, total=1000)
        if saved:
            self.save(name, job, fence)

    def save(self, name: str, job: str, fence: int) -> None:
        """The job saves a checkpoint (its files, then its manifest) and the agent reports it."""
        step = len(self.saved.setdefault(job, [])) + 1
        files = self.root / "out" / f"{self.prefix}-{job}-{step}"
        files.mkdir(parents=True)
        (files / "state.pt").write_bytes(f"{job} {step}".encode())
        url = self.checkpoints.publish(job, step, files).url
        self.saved[job].append((step, url))
        self.contracts[name].report(job, fence, "checkpoint", at=self.now_s(), step=step, url=url)

    @precondition(lambda self: self.holding)
    @rule(pick=st.integers(0, 1), reason=st.sampled_from(["finished", "failed", "preempted", "unfit"]))
    def exit(self, pick, reason):
        name = self.holder(pick)
        job, fence = self.holding.pop(name)
        self.contracts[name].exited(job, fence, reason, code=int(reason == "failed"), at=self.now_s())

    def checkpoint_rots(self, pick):
        """A kept checkpoint of a job is damaged on disk (a torn upload, bit rot)."""
        kept = [url for saved in self.saved.values() for _, url in saved[-self.checkpoints.keep :]]
        if kept:
            url = kept[pick % len(kept)]
            (Path(self.checkpoints.path(url)) / "state.pt").write_bytes(b"rotten")
            self.rotten.add(url)

    @precondition(lambda self: self.holding)
    @rule(pick=st.integers(0, 1), saved=st.booleans(), gone=st.booleans())
    def preemption_notice(self, pick, saved, gone):
        """The cloud says the instance goes soon: the agent says so, the job saves a checkpoint (unless the notice was
        too short) and, once the instance is gone, the run ends preempted."""
        name = self.holder(pick)
        job, fence = self.holding[name]
        self.contracts[name].report(job, fence, "notice", at=self.now_s(), lead_s=120)
        if saved:
            self.save(name, job, fence)
        if gone:
            del self.holding[name]
            self.contracts[name].exited(job, fence, "preempted", at=self.now_s())

    @precondition(lambda self: self.holding)
    @rule(pick=st.integers(0, 1))
    def heed_the_view(self, pick):
        """What an agent's heartbeat does with the job it runs: stop it when the view moved on, hand it back when
        the guard moves it, save a checkpoint when the guard asks for one."""
        name = self.holder(pick)
        job, fence = self.holding[name]
        verdict = self.contracts[name].verdict(job, fence)
        if verdict == Verdict.checkpoint:
            self.save(name, job, fence)
        elif verdict in (Verdict.fenced, Verdict.moved):
            del self.holding[name]
            self.contracts[name].exited(job, fence, verdict.value, at=self.now_s())

    def lease_lapses(self, name):
        if name in self.registered:
            self.store.redis.delete(self.store.key("lease", name))
            self.lapsed.add(name)

    @precondition(lambda self: self.lapsed)
    @rule(name=st.sampled_from(AGENTS))
    def notice_the_lapse(self, name):
        """As Agent.step on a lease found lapsed: the job killed and reported lost, then a new registration."""
        if name in self.lapsed:
            self.lapsed.discard(name)
            if name in self.holding:
                job, fence = self.holding.pop(name)
                self.contracts[name].exited(job, fence, "lost", at=self.now_s())
            self.contracts[name].register(self.offers[name], LEASE_MS, host="test", pid=0, at=self.clock.now())
            self.registered.add(name)

    def restart(self, name):
        """The agent's process dies, with what it ran, and its service starts a new one under the same id."""
        if name not in self.lapsed:
            self.holding.pop(name, None)
            self.contracts[name] = Contract(self.store, name)
            self.contracts[name].register(self.offers[name], LEASE_MS, host="test", pid=1, at=self.clock.now())
            self.registered.add(name)

    def reoffer(self, name: str) -> None:
        """The agent offers another speed (as a fill agent does once its steps are measured)."""
        speed = 0.5 if self.offers[name].speed_factor == 1.0 else 1.0
        self.offers[name] = self.offers[name].model_copy(update={"speed_factor": speed})
        self.contracts[name].offer(self.offers[name])

    # -- the server ----------------------------------------------------------------------

    @rule(
        minutes=st.sampled_from([1, 30, 240]),
        replica=st.sampled_from([0, 1]),
        meanwhile=st.sampled_from([None, "reoffer", "cancel", "notice_the_lapse"]),
        at=st.sampled_from(["_fold", "agents_with_leases", "_plan_page"]),
        pick=st.integers(0, 50),
    )
    def server_round(self, minutes, replica, meanwhile, at, pick):
        """A round of either replica: one that never led stands by, one deposed still believes it leads. After it has
        read the jobs and agents and before it writes (`at`: once it folds a report, reads the agents' leases, or
        plans), an agent may offer another speed or register again after a lapse, or a user cancel a job (else after
        the round)."""
        self.clock.advance(minutes=minutes)
        before = {job.id: len(job.runs) for job in self.store.jobs_by_id(self.jobs)}
        server = self.servers[replica]
        name = AGENTS[pick % 2]
        act = {
            "reoffer": lambda: self.reoffer(name),
            "cancel": lambda: self.cancel(pick),
            "notice_the_lapse": lambda: self.notice_the_lapse(name),
        }
        pending = [act[meanwhile]] if meanwhile else []

        def act_once() -> None:
            while pending:
                pending.pop()()

        holder = self.store if at == "agents_with_leases" else server
        step = getattr(holder, at)

        def then_act(*args):  # the round goes on with what it read or worked out, and writes it later
            done = step(*args)
            act_once()
            return done

        setattr(holder, at, then_act)
        try:
            server.step()
        finally:
            delattr(holder, at)  # the class's again
        act_once()
        for job in self.store.jobs_by_id(self.jobs):  # a run dispatched resumes from the newest sound checkpoint
            if len(job.runs) > before[job.id]:
                sound = [
                    url for _, url in self.saved.get(job.id, [])[-self.checkpoints.keep :] if url not in self.rotten
                ]
                assert job.runs[-1].resume_from == (sound[-1] if sound else None), job.id
        if self.servers[replica].token is not None:  # it acted (the other only stands by)
            holding = {agent.id: agent.job for agent, lease in self.store.agents_with_leases() if lease}
            for job in self.store.active_jobs():
                assert holding.get(job.current_run.agent) == job.id, (job.id, job.current_run.agent, holding)

    def planning_lease_lapses(self):
        self.store.redis.delete(self.store.key("leader"))

    @rule(
        fault=st.sampled_from(["lease_lapses", "restart", "planning_lease_lapses", "checkpoint_rots"]),
        name=st.sampled_from(AGENTS),
        pick=st.integers(0, 50),
    )
    def a_fault(self, fault, name, pick):
        """One rule for the faults, so the ordinary course (jobs dispatched, run, saved, ended) gets most steps."""
        if fault == "planning_lease_lapses":
            self.planning_lease_lapses()
        else:
            getattr(self, fault)(pick if fault == "checkpoint_rots" else name)

    # -- what holds after every step -----------------------------------------------------

    @invariant()
    def an_ended_job_stays_ended_and_runs_once_at_a_time(self):
        for job in self.store.jobs_by_id(self.jobs):
            if job.id in self.ended:
                assert job.state.terminal, f"{job.id} ended, now {job.state.value}: {job.reason}"
            if job.state.terminal:
                self.ended.add(job.id)
            assert all(run.ended_at is not None for run in job.runs[:-1]), job.id
            unfit = {run.offer.zone for run in job.runs[:-1] if run.end_reason == "unfit"}
            assert not job.runs or job.runs[-1].offer.zone not in unfit or job.runs[-1].end_reason == "unfit", job.id

    @invariant()
    def an_agent_names_only_the_job_it_runs_and_offers_what_it_last_offered(self):
        for agent in self.store.agents():
            if agent.job is not None:
                run = self.store.get_job(agent.job).current_run
                assert run is not None and run.agent == agent.id, (agent.id, agent.job)
            assert agent.offer.speed_factor == self.offers[agent.id].speed_factor, (agent.id, agent.offer.speed_factor)
        kept = {agent.id for agent in self.store.agents()}
        assert self.registered - self.lapsed <= kept, (self.registered, self.lapsed, kept)  # none removed alive

    @invariant()
    def the_indexes_and_counters_agree_with_the_jobs(self):
        jobs = self.store.jobs_by_id(self.jobs)
        queue = dict(self.store.redis.zrange(self.store.key("pending"), 0, -1, withscores=True))
        assert queue == {j.id: pytest.approx(j.urgency) for j in jobs if j.pending}
        assert self.store.redis.smembers(self.store.key("active")) == {j.id for j in jobs if j.current_run}
        counted = totals.Totals.parse(self.store.redis.hgetall(self.store.key(totals.KEY)))
        ended = [j for j in jobs if j.current_run is None]
        assert {s: n for s, n in counted.jobs.items() if n} == {
            s: sum(j.state == s for j in ended) for s in JobState if any(j.state == s for j in ended)
        }
        assert math.isclose(counted.spend_usd, sum(j.cost_usd for j in ended), abs_tol=1e-6)
        kept = self.store.redis.hgetall(self.store.key(figures.KEY))
        assert kept == {j.id: figures.record(j) for j in ended}


def test_the_store_keeps_its_promises_whatever_the_order_of_events(redis_url, catalog, tmp_path):
    Lifecycle.redis_url, Lifecycle.catalog, Lifecycle.root = redis_url, catalog, tmp_path
    run_machine(Lifecycle)
