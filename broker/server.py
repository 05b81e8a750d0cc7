"""`broker server`: the control loop. Each round applies what agents reported, moves the jobs of
agents whose lease expired, and dispatches pending jobs to idle agents chosen by the policy.

Exactly one active run per job: every dispatch raises the job's fence token, and a report
carrying an older token is ignored (the agent holding it is told to stop by its fence check).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from broker.agents.checkpoints import CheckpointStore
from broker.errors import InfeasibleError
from broker.model import AgentInfo, Job, JobState, Run
from broker.policies.risk import fits
from broker.store import Store

log = logging.getLogger(__name__)

PENDING = {JobState.queued, JobState.migrating}


class BrokerServer:
    """One broker replica's control loop over the shared store."""

    def __init__(self, store: Store, policy, clock, checkpoints: CheckpointStore, consumer: str = "server-1", lease_s: float = 5.0):
        self.store, self.policy, self.clock, self.checkpoints = store, policy, clock, checkpoints
        self.consumer = consumer
        self.lease = timedelta(seconds=lease_s)

    def round(self, block_ms: int = 100) -> None:
        """Apply reports, reclaim lost agents' jobs, dispatch."""
        for entry_id, report in self.store.read_reports(self.consumer, block_ms=block_ms):
            self.apply(report)
            self.store.ack_report(entry_id)  # after the change is stored: a crash re-applies, and apply is idempotent
        self.reclaim_lost()
        self.dispatch()

    def serve(self, until=lambda: False, interval_s: float = 0.05) -> None:
        while not until():
            self.round()
            time.sleep(interval_s)

    # -- reports --------------------------------------------------------------------------

    def apply(self, report: dict) -> Job | None:
        """Fold one agent report into its job; stale fences and repeats change nothing."""
        kind, data = report["type"], report["data"]
        now = self.clock.at(data["at"]) if "at" in data else self.clock.now()

        def change(job: Job) -> Job | None:
            run = job.current_run
            if run is None or report["fence"] != job.fence or run.agent != report["agent"]:
                return None
            run = run.model_copy()
            update: dict = {"updated_at": now}
            if kind == "started":
                if run.started_at is not None:
                    return None
                run.started_at = now
                update.update(state=JobState.running, reason=f"running on {run.agent}")
            elif kind == "progress":
                run.progress_done, run.progress_total, run.last_progress_at = data["done"], data["total"], now
            elif kind == "checkpoint":
                run.checkpoint_url, run.checkpoint_step, run.checkpoint_at = data["url"], data["step"], now
            elif kind == "notice":
                update.update(state=JobState.migrating, reason=f"preemption notice on {run.agent}")
            elif kind == "exited":
                _end_run(run, now, data["reason"], data.get("code"))
                update.update(self._after_run(job, run, data))
            else:
                return None
            return job.model_copy(update={**update, "runs": job.runs[:-1] + [run]})

        def free_agent(pipe, job: Job) -> None:
            if kind == "exited":
                self._release_agent(pipe, report["agent"], job.id)

        return self.store.update_job(report["job"], change, also=free_agent)

    def _after_run(self, job: Job, run: Run, data: dict) -> dict:
        reason = run.end_reason
        if reason == "finished":
            return {"state": JobState.done, "reason": "finished"}
        if reason == "failed":
            restarts = job.restarts + 1
            if restarts > job.spec.max_restarts:
                why = f"failed {restarts} times (exit code {run.exit_code}); last output below"
                return {"state": JobState.failed, "reason": why, "restarts": restarts, "log_tail": data.get("log_tail", [])}
            return {"state": JobState.queued, "reason": f"restart {restarts} after exit code {run.exit_code}", "restarts": restarts}
        if reason in ("preempted", "lost"):
            return {"state": JobState.migrating, "reason": f"{reason} on {run.agent}"}
        return {}  # fenced or cancelled: the job already moved on

    def _release_agent(self, pipe, agent_id: str, job_id: str) -> None:
        agent = self.store.get_agent(agent_id)
        if agent and agent.job == job_id:
            self.store.put_agent(pipe, agent.model_copy(update={"job": None, "fence": None}))

    # -- lost agents ----------------------------------------------------------------------

    def reclaim_lost(self) -> None:
        """End the runs of agents whose lease expired; their jobs go back to be dispatched."""
        now = self.clock.now()
        for job in self.store.list_jobs(PENDING | {JobState.running}):
            run = job.current_run
            if run is None or self.store.lease_alive(run.agent):
                continue

            def lose(current: Job, fence=job.fence) -> Job | None:
                live = current.current_run
                if live is None or current.fence != fence:
                    return None
                live = live.model_copy()
                _end_run(live, now, "lost", None)
                return current.model_copy(
                    update={"state": JobState.migrating, "reason": f"lost agent {live.agent}", "updated_at": now,
                            "runs": current.runs[:-1] + [live]}
                )  # fmt: skip

            self.store.update_job(job.id, lose)
        for agent in self.store.agents():  # gone: its job (if any) was handled above
            if not self.store.lease_alive(agent.id):
                self.store.remove_agent(agent.id)

    # -- dispatch -------------------------------------------------------------------------

    def dispatch(self) -> list[tuple[str, str]]:
        """Give pending jobs to idle agents, most urgent first; returns (job, agent) pairs."""
        idle = [a for a in self.store.agents() if a.job is None and self.store.available(a.id)]
        pending = [j for j in self.store.list_jobs(PENDING) if j.current_run is None]
        pending.sort(key=lambda j: (-j.spec.priority, j.spec.deadline or datetime.max.replace(tzinfo=j.submitted_at.tzinfo), j.submitted_at))
        done = []
        for job in pending:
            agent = self._choose(job, idle)
            if agent is None:
                continue
            if self._assign(job, agent):
                idle.remove(agent)
                done.append((job.id, agent.id))
        return done

    def _choose(self, job: Job, idle: list[AgentInfo]) -> AgentInfo | None:
        """The idle agent the policy prices cheapest for the job (the earliest finish if none is feasible)."""
        by_offer: dict[str, AgentInfo] = {}
        for agent in idle:
            if fits(job.spec, agent.offer):
                by_offer.setdefault(agent.offer.id, agent)
        if not by_offer:
            return None
        offers = [a.offer for a in by_offer.values()]
        try:
            option = self.policy.quote(job.spec, offers, self.clock.now()).chosen
        except InfeasibleError:  # late or over budget already: run it where it finishes first
            option = min(self.policy.options(job.spec, offers, self.clock.now()), key=lambda o: o.expected_finish)
        return by_offer[option.offer.id]

    def _assign(self, job: Job, agent: AgentInfo) -> bool:
        latest, skipped = self.checkpoints.latest_verified(job.id)
        for line in skipped:
            log.warning("job=%s checkpoint skipped: %s", job.id, line)
        now = self.clock.now()
        fence = job.fence + 1
        run = Run(fence=fence, agent=agent.id, offer=agent.offer, resume_from=latest.url if latest else None, dispatched_at=now)

        def change(current: Job) -> Job | None:
            if current.fence != job.fence or current.current_run is not None or current.state not in PENDING:
                return None  # someone else moved it meanwhile
            return current.model_copy(update={"fence": fence, "runs": current.runs + [run], "updated_at": now})

        def send(pipe, _job: Job) -> None:
            self.store.assign(pipe, agent.id, job.id, fence)
            self.store.put_agent(pipe, agent.model_copy(update={"job": job.id, "fence": fence}))

        return self.store.update_job(job.id, change, also=send) is not None


def _end_run(run: Run, now: datetime, reason: str, code: int | None) -> None:
    """Close a run: its cost, and the work done since its last checkpoint when it did not finish."""
    run.ended_at, run.end_reason, run.exit_code = now, reason, code
    run.cost_usd = run.offer.price_usd_per_h * run.hours(now)
    if reason != "finished" and run.last_progress_at is not None:
        since = run.checkpoint_at or run.started_at or run.dispatched_at
        run.work_lost_s = max(0.0, (run.last_progress_at - since).total_seconds())
