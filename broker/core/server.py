"""`broker server`: the control loop. Each round applies what agents reported, moves the jobs of
agents whose lease expired, and dispatches pending jobs to idle agents chosen by the policy.

Replicas share one Redis; the one holding the planning lease (a fencing token per holder) runs
the rounds, the others stand by and take over when it lapses. Every dispatch and deadline move
is written only while its replica still holds the lease (watched in the same transaction).

Exactly one active run per job: every dispatch raises the job's fence token, and a report
carrying an older token is ignored (the agent holding it is told to stop by its fence check).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import datetime

from broker.agents.checkpoints import CheckpointStore
from broker.agents.tokens import refusal, stale_pool
from broker.core.budget import fallback_option, stop_over_budget
from broker.core.guard import DeadlineGuard
from broker.core.renewal import renew_tokens
from broker.core.reports import end_run, fold, folding, with_run
from broker.core.reserved import reserved_pairs, tell_ended
from broker.core.rounds import serve_rounds
from broker.domain.errors import InfeasibleError
from broker.domain.model import AgentInfo, Job, JobSpec, JobState, Run
from broker.domain.offer import Offer
from broker.models.fit import fits
from broker.planning.fill import SCORES, order_bubbles
from broker.planning.option_table import PlanItem
from broker.store.capacity import CapacityHistory
from broker.store.jobs import Store
from broker.store.renewals import drop_refused

log = logging.getLogger(__name__)

PLAN_PAGE = 1000  # pending jobs planned per round at most, most urgent first
# read (and parse) pending jobs in pages: first this many per idle agent, doubling while agents stay idle, so a
# deep queue costs a round only what its idle agents need, and a job far down that fits an idle agent still runs
PLAN_PAGE_PER_AGENT, PLAN_PAGE_MIN = 2, 16
GUARD_EVERY_S = 1.0
HASH_WAIT_S = 0.1  # a round waits this long, all jobs together, for their checkpoints' hashes; the rest go next round
PRICES_EVERY_S = 60.0  # the catalog changes when prices are refreshed or our agents see preemptions
RECOVER_EVERY_S = 5.0  # how often a replica claims dead replicas' reports (they are claimable after 30 s idle)


class BrokerServer:
    """One broker replica's control loop over the shared store."""

    def __init__(
        self,
        store: Store,
        policy,
        clock,
        checkpoints: CheckpointStore,
        consumer: str = "server-1",
        lease_s: float = 5.0,
        metrics=None,
        agent_secret: str | None = None,
        leader_lease_s: float = 5.0,
        prices=None,
        fill_order: str | None = None,
        shards: list[Store] | None = None,
    ):
        self.store, self.policy, self.clock, self.checkpoints = store, policy, clock, checkpoints
        self.metrics = metrics  # a broker.app.metrics.ServerMetrics, or None
        self.consumer = consumer
        self.lease_s = lease_s
        self._last_reclaim = 0.0
        self._last_guard = 0.0
        self._last_recover = 0.0
        self._all_acked = False  # whether every report this replica read is acked (not known at start: a crash)
        self._guarded_at: datetime | None = None  # the clock's time of the guard's last pass
        self._pass_h = 0.0  # the time between its passes: a job placed now is looked at that much later
        self.agent_secret = agent_secret  # when set, only agents with a valid registration token get work
        self.leader_lease_ms = int(leader_lease_s * 1000)
        self.token: int | None = None  # our fencing token while we hold the planning lease
        self._led_at = 0.0
        self.prices = prices  # () -> the newest Offers (the catalog quotes use), or None: agents keep theirs
        if fill_order is not None and fill_order not in SCORES:
            raise ValueError(f"fill_order: {fill_order!r} is not a fill policy; use one of {', '.join(SCORES)}")
        self.fill_order = fill_order  # how idle bubble executors pick among fill jobs; None: as the plan gave
        self._newest: dict[str, Offer] = {}
        self.capacity = CapacityHistory(store)
        self.shards = shards or [store]  # all of the store's: each keeps a pool's renewed token (store/renewals.py)
        self._priced_at = -float("inf")

    def lead(self) -> bool:
        """Hold the planning lease (one replica plans at a time); False while another replica holds it.
        Renewed at most every quarter lease: writes are fenced by the lease key in their transaction anyway."""
        if self.token is not None and time.monotonic() - self._led_at < self.leader_lease_ms / 4000:
            return True
        token = self.store.lead(self.consumer, self.leader_lease_ms)
        self._led_at = time.monotonic()
        if token != self.token:
            log.info("server=%s %s", self.consumer, f"leads with token={token}" if token else "is standby")
            self.token = token
        return token is not None

    def round(self, block_ms: int = 100) -> None:
        """As the leader: apply reports (one transaction per job), reclaim lost agents' jobs, dispatch.
        A standby replica only waits for the lease to lapse."""
        started = time.monotonic()
        if not self.lead():
            time.sleep(block_ms / 1000)
            return
        self.fold_reports(block_ms)
        if time.monotonic() - self._last_reclaim >= self.lease_s / 4:  # leases last seconds: no need every round
            self._last_reclaim = time.monotonic()
            self.reclaim_lost()
        if time.monotonic() - self._last_guard >= GUARD_EVERY_S:
            self._last_guard = time.monotonic()
            self.guard()
        self.dispatch()
        if self.metrics:
            self.metrics.round_seconds.observe(time.monotonic() - started)

    def step(self) -> list[tuple[str, str]]:
        """One round on a simulated clock (the backtest): what round() does, nothing throttled by wall time;
        returns the (job, agent) pairs dispatched. Agents learn of guard moves from their views, as live ones."""
        if not self.lead():
            return []
        while self.fold_reports(block_ms=None):
            pass
        self.reclaim_lost()
        self.guard()
        return self.dispatch(hash_wait_s=None)

    def fold_reports(self, block_ms: int | None) -> int:
        """Apply one batch of agent reports (all their jobs in one transaction), then ack them; returns how many.
        Reports read but not acked (a round that failed) are read again first, before newer ones of their jobs."""
        recover = not self._all_acked or time.monotonic() - self._last_recover >= RECOVER_EVERY_S
        if recover:
            self._last_recover = time.monotonic()
        self._all_acked = False
        by_job: dict[str, list[tuple[str, dict]]] = {}
        for entry_id, report in self.store.read_reports(self.consumer, block_ms=block_ms, recover=recover):
            by_job.setdefault(report["job"], []).append((entry_id, report))
        if by_job:
            self.apply_batch([[report for _, report in entries] for entries in by_job.values()])
            self.store.ack_reports([e for entries in by_job.values() for e, _ in entries])  # after: a crash re-applies
        self._all_acked = True
        return sum(len(entries) for entries in by_job.values())

    def serve(self, until=lambda: False) -> None:
        serve_rounds(self.round, self.consumer, until)

    def resign(self) -> None:
        """Give up the planning lease (core/replica.py: another replica is to plan this shard). Asked of the store
        even with no token: a stop that landed between Redis granting the lease and `lead` noting it left one."""
        if self.store.resign(self.consumer):
            log.info("server=%s resigns (token=%s)", self.consumer, self.token)
        self.token = None

    # -- reports --------------------------------------------------------------------------

    def apply(self, reports: list[dict]) -> Job | None:
        """Fold one job's reports into it, in order, in one transaction; stale fences and repeats change nothing."""
        return self.apply_batch([reports]).get(reports[0]["job"])

    def apply_batch(self, batch: list[list[dict]]) -> dict[str, Job | None]:
        """Fold each job's reports (one list per job) into it; all the jobs in one store transaction."""
        exits = self.store.get_agents(sorted({r["agent"] for rs in batch for r in rs if r["type"] == "exited"}))
        folds = [folding(reports, exits, self._fold, self.store) for reports in batch]
        jobs = self.store.update_jobs(folds, emit=False)
        for reports in batch:
            job_id = reports[0]["job"]
            if job_id not in jobs:
                log.warning("report for unknown job=%r dropped", job_id)
            elif jobs[job_id] is not None and self.metrics:
                self.metrics.folded(jobs[job_id], {r["type"] for r in reports}, self.clock.now())
        return jobs

    def _fold(self, job: Job, report: dict) -> Job | None:
        """The job after one report (core/reports.py), at the agent's time mapped through our clock."""
        data = report["data"]
        now = self.clock.at(data["at"]) if "at" in data else self.clock.now()
        return fold(job, report, now, self.checkpoints)

    # -- lost agents ----------------------------------------------------------------------

    def reclaim_lost(self) -> None:
        """End the runs of agents whose lease expired, or that registered again since (a restarted process: its
        record no longer names the job, whose reports will never come); their jobs go back to be dispatched."""
        now = self.clock.now()
        active = self.store.active_jobs()
        agents = self.store.agents_with_leases()  # after the jobs: a run dispatched meanwhile is not among them
        holding = {agent.id: agent.job for agent, lease in agents if lease is not None}
        for job in active:
            run = job.current_run
            if run is None or holding.get(run.agent) == job.id:
                continue
            why = (
                f"agent {run.agent} registered again without it" if run.agent in holding else f"lost agent {run.agent}"
            )

            def lose(current: Job, fence=job.fence, why=why) -> Job | None:
                live = current.current_run
                if live is None or current.fence != fence:
                    return None
                live = live.model_copy()
                end_run(live, now, "lost", None)
                return with_run(current, live, {"state": JobState.migrating, "reason": why}, now)

            if self.store.update_job(job.id, lose) is not None and self.metrics:
                self.metrics.preemptions.inc()
        live = [a for a, lease in agents if lease not in (None, "leaving") and a.on_cloud]  # stand-ins: no evidence
        self.capacity.record(now, live)  # market evidence
        tell_ended(self.store, agents)
        if self.agent_secret:
            renew_tokens(self.store, self.agent_secret, agents, now)
        for agent, lease in agents:  # gone: its job (if any) was handled above
            if lease is None:
                self.store.remove_agent(agent.id, lapsed=True)

    # -- dispatch -------------------------------------------------------------------------

    def dispatch(self, hash_wait_s: float | None = HASH_WAIT_S) -> list[tuple[str, str]]:
        """Plan the most urgent pending jobs onto idle agents with the policy; returns (job, agent) pairs. A job
        whose checkpoint to resume from is still hashing past `hash_wait_s` waits for a later round (None: waits).

        A job the policy cannot place within its own deadline or budget still runs where it finishes first
        (it is late or over either way); one that lacks capacity, or the round's budget, waits for the next round.
        """
        if not self.lead() or not self.store.pending_count():  # nothing waits: no need to read the agents
            return []
        pairs, idle = reserved_pairs(self.store, self._idle_agents(), self.clock.now(), self.consumer)
        if not pairs and not idle:
            return []
        taken = {job.id for job, _ in pairs}
        by_offer: dict[str, list[AgentInfo]] = {}
        for agent in idle:
            by_offer.setdefault(agent.offer.id, []).append(agent)
        start, page = 0, max(PLAN_PAGE_MIN, PLAN_PAGE_PER_AGENT * len(idle))
        while start < PLAN_PAGE and any(by_offer.values()):
            jobs = self.store.pending_jobs(start, min(page, PLAN_PAGE - start))  # most urgent first
            if not jobs:
                break
            pairs += self._plan_page([j for j in jobs if j.id not in taken], by_offer)
            start, page = start + len(jobs), page * 2
        return self._assign(pairs, hash_wait_s)

    def _plan_page(self, jobs: list[Job], by_offer: dict[str, list[AgentInfo]]) -> list[tuple[Job, AgentInfo]]:
        """Plan one page of pending jobs onto the agents still idle (taken from `by_offer` as they are given); a
        capped job that spent its budget before it came back (a run lost past it) ends here, not on a new run."""
        spent = set(stop_over_budget(self.store, jobs, self.clock.now(), 0.0, self.consumer))
        jobs = [j for j in jobs if j.id not in spent]
        left = {offer_id: group for offer_id, group in by_offer.items() if group}
        newest = self.newest_offers()
        offers = [newest.get(offer_id, group[0].offer) for offer_id, group in left.items()]
        items = [replace(PlanItem.from_job(j), pass_h=self._pass_h) for j in jobs]
        by_item = {item.id: item for item in items}
        plan = self.policy.plan(items, offers, {k: len(v) for k, v in left.items()}, self.clock.now())
        pairs = []
        for job in jobs:
            offer_id = plan.assignments.get(job.id)
            why = plan.unplaced.get(job.id)
            if offer_id is None and why is not None and why.own_constraint:
                agent = self._choose(by_item[job.id].spec, [a for group in by_offer.values() for a in group])
                offer_id = agent.offer.id if agent else None
            if offer_id is None or not by_offer.get(offer_id):
                continue
            pairs.append((job, by_offer[offer_id].pop()))
        if self.fill_order:
            pairs = self._fill_in_order(pairs, jobs, by_item, plan)
        return pairs

    def _fill_in_order(self, pairs: list[tuple[Job, AgentInfo]], jobs: list[Job], by_id: dict[str, PlanItem], plan):
        """The bubble executors of this page take fill jobs in the fill policy's order (planning/fill.py)."""
        by_job = {job.id: job for job in jobs}
        waiting = [by_id[i] for i, why in plan.unplaced.items() if i in by_id and not why.own_constraint]
        ordered = order_bubbles(
            [(by_id[job.id], agent) for job, agent in pairs], waiting, self.clock.now(), self.fill_order
        )
        return [(by_job[item.id], agent) for item, agent in ordered]

    def newest_offers(self) -> dict[str, Offer]:
        """Offers by id as the catalog prices them now (refreshed every PRICES_EVERY_S): an agent registered
        at start-up is planned at today's price and hazard, not at those of the day it started."""
        if self.prices is not None and time.monotonic() - self._priced_at >= PRICES_EVERY_S:
            self._newest = {o.id: o for o in self.prices()}
            self._priced_at = time.monotonic()
        return self._newest

    def _admits(self, agent: AgentInfo) -> bool:
        """Whether an agent process not yet admitted may get work: its token verifies now (then the process stays
        admitted until it is refused, or a day after its removal: a token bounds when agents may join, not how long
        they run)."""
        why = refusal(self.agent_secret, agent.id, agent.token, now := self.clock.now())
        if why is None:
            self.store.admit(agent)
            return True
        log.warning("agent=%s refused: %s; removed", agent.id, why)
        self.store.refuse_agent(agent, why)
        drop_refused(self.store, agent.id, agent.token, stale_pool(self.agent_secret, agent.token, now), self.shards)
        return False

    def guard(self) -> list[str]:
        """The deadline guard's moves between rounds (core/guard.py), as the leader only, after the budget cap's
        stops (core/budget.py, under every policy); the ids of the jobs moved or stopped."""
        if not self.lead():
            return []  # a standby replica
        now, before = self.clock.now(), self._guarded_at
        self._guarded_at = now
        if before is not None and now > before:  # a pass at the same time (a backtest's tick) is not a shorter one
            self._pass_h = (now - before).total_seconds() / 3600  # what a run does before the guard looks again
        active = self.store.active_jobs()
        stopped = stop_over_budget(self.store, active, now, self._pass_h, self.consumer)
        if not getattr(self.policy, "deadline_guard", True):
            return stopped  # baselines without deadlines (SkyPilot's)
        rule_moves = hasattr(self.policy, "leaves_on_demand")  # the rule may take jobs off on-demand or to a zone
        running = [j for j in active if j.id not in stopped]
        return stopped + DeadlineGuard(self.store, self.policy, self.consumer).moves(
            now, self._idle_agents() if rule_moves else [], self._pass_h, running
        )

    def _idle_agents(self) -> list[AgentInfo]:
        """Agents that take work, admitted, without a job."""
        idle = [a for a in self.store.working_agents() if a.job is None]
        if self.agent_secret is None:
            return idle
        admitted = self.store.admitted(idle)
        return [a for a in idle if a.id in admitted or self._admits(a)]

    def _choose(self, spec: JobSpec, idle: list[AgentInfo]) -> AgentInfo | None:
        """The idle agent the policy prices cheapest for the job (the earliest finish if none is feasible); `spec`
        as the planner sees it (PlanItem.from_job: the guard's pinned tier, no stage it was unfit for)."""
        by_offer: dict[str, AgentInfo] = {}
        for agent in idle:
            if fits(spec, agent.offer):
                by_offer.setdefault(agent.offer.id, agent)
        if not by_offer:
            return None
        offers = [a.offer for a in by_offer.values()]
        try:
            option = self.policy.quote(spec, offers, self.clock.now()).chosen
        except InfeasibleError as refused:  # late or over budget already
            option = fallback_option(spec, refused, self.policy.options(spec, offers, self.clock.now()))
        return by_offer[option.offer.id]

    def _assign(self, pairs: list[tuple[Job, AgentInfo]], hash_wait_s: float | None) -> list[tuple[str, str]]:
        """Dispatch each job to its agent, all in one store transaction fenced by the planning lease; returns the
        (job, agent) pairs that were assigned (a job someone else moved meanwhile, or whose checkpoint is still
        hashing, is not)."""
        now, ends = self.clock.now(), None if hash_wait_s is None else time.monotonic() + hash_wait_s
        changes, ready = [], []
        for job, agent in pairs:
            if not job.runs:  # never ran: no checkpoint to resume from
                found = None, []
            else:
                wait_s = None if ends is None else max(0.0, ends - time.monotonic())
                found = self.checkpoints.latest_verified_soon(job.id, job.fence, wait_s)
            if found is None:
                log.debug("job=%s waits for its checkpoint's hash", job.id)  # each round it waits
                continue
            changes.append(self._dispatching(job, agent, now, *found))
            ready.append((job, agent))
        assigned = self.store.update_jobs(changes, leader=self.consumer)
        done = [(job, agent) for job, agent in ready if assigned.get(job.id) is not None]
        if self.metrics:
            moved = sum(1 for job, _ in done if job.runs and job.runs[-1].end_reason in ("preempted", "lost", "moved"))
            self.metrics.migrations.inc(moved)
        return [(job.id, agent.id) for job, agent in done]

    def _dispatching(self, job: Job, agent: AgentInfo, now, latest, skipped: list[str]) -> tuple:
        """(job id, change, also) that start a new run of the job on the agent from its newest verified checkpoint
        (`latest`, CheckpointStore.latest_verified's, with the newer ones `skipped`), for Store.update_jobs."""
        for line in skipped:
            log.warning("job=%s checkpoint skipped: %s", job.id, line)
        fence = job.fence + 1
        run = Run(
            fence=fence,
            agent=agent.id,
            offer=agent.offer,
            on_cloud=agent.on_cloud,
            resume_from=latest.url if latest else None,
            dispatched_at=now,
        )

        def change(current: Job) -> Job | None:
            if current.fence != job.fence or not current.pending:
                return None  # someone else moved it meanwhile
            return current.model_copy(update={"fence": fence, "runs": current.runs + [run], "updated_at": now})

        def send(shard, pipe, assigned: Job) -> None:
            shard.assign(pipe, agent.id, assigned)
            shard.set_agent_job(pipe, agent, job.id, fence)

        return job.id, change, send
