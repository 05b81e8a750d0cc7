"""The budget cap: a job whose spec says `if_over_budget: stop` ends failed once what it spent reaches its budget.

Checked on the guard's pass, for every policy, by the leading replica: a running job is stopped when the pass to
come would take its spend past the budget (what it spent so far, and its offer's price over one more pass), so it
ends at most a pass and its save past it; and when it is planned, so a job back in the queue with its budget spent
(a run lost past it) is not started again. Ending the job is a state change, as a cancel is: the agent sees its run
fenced, stops the job (which saves on the stop signal) and reports the exit, which closes the run at its cost.
A larger budget given afterwards (`broker amend --budget`, core/broker.py) puts the job back in the queue, to resume
from its newest verified checkpoint as a preempted job does.
"""

from __future__ import annotations

import logging
from datetime import datetime

from broker.domain.errors import BrokerError, InfeasibleError
from broker.domain.figures import spend_usd
from broker.domain.jobspec import JobSpec
from broker.domain.model import IfOverBudget, Job, JobState, Option
from broker.store.jobs import Store

log = logging.getLogger(__name__)


def over_budget(job: Job, now: datetime, pass_h: float) -> bool:
    """Whether the job is capped and would pass its budget before the guard looks again (in `pass_h`)."""
    if job.spec.if_over_budget != IfOverBudget.stop or job.spec.budget_usd is None or job.state.terminal:
        return False
    run = job.current_run
    ahead = run.offer.price_usd_per_h * pass_h if run is not None else 0.0
    return spend_usd(job, now) + ahead >= job.spec.budget_usd


def stop_over_budget(store: Store, jobs: list[Job], now: datetime, pass_h: float, leader: str) -> list[str]:
    """End failed every one of `jobs` (those with a run under way, or those waiting to be planned) over its budget
    (over_budget); the ids of those ended."""
    stopped = []
    for job in jobs:
        if not over_budget(job, now, pass_h):
            continue
        why = (
            f"budget spent: ${spend_usd(job, now):.2f} of ${job.spec.budget_usd:.2f} (if_over_budget: stop); "
            f"`broker amend {job.id} --budget` with more resumes it from its checkpoint"
        )

        def fail(current: Job, fence=job.fence, why=why) -> Job | None:
            if current.fence != fence or not over_budget(current, now, pass_h):
                return None
            update = {"state": JobState.failed, "reason": why, "stopped_at_budget": True, "updated_at": now}
            return current.model_copy(update=update)

        if store.update_job(job.id, fail, leader=leader, reason=why) is not None:
            log.info("job=%s stopped: %s", job.id, why)
            stopped.append(job.id)
    return stopped


def fallback_option(spec: JobSpec, refused: InfeasibleError, options: list[Option]) -> Option:
    """Where a job no option places within both its deadline and its budget runs: where it finishes first (it is
    late or over either way). A capped job is stopped at its budget, so it runs where it finishes first within it
    (`refused.later`), or, where no option is, where the budget it will stop at buys the most work: the cheapest."""
    if spec.if_over_budget == IfOverBudget.stop and spec.budget_usd is not None:
        return refused.later or min(options, key=lambda o: o.expected_cost_usd)
    return min(options, key=lambda o: o.expected_finish)


def resumed(job: Job, spec: JobSpec, now: datetime) -> Job:
    """The job the cap stopped, back in the queue under `spec` (its larger budget): its next run resumes from its
    newest verified checkpoint, as a preempted job's does. Refused in one line while the stopped run has not closed
    (its checkpoint may still be saving), or when the budget is no more than the job has spent."""
    if job.current_run is not None:
        raise BrokerError(
            f"job: {job.id} is still stopping at its budget; amend it again once its run has closed "
            f"(`broker status {job.id}` shows it)"
        )
    spent = round(spend_usd(job, now), 2)  # to the cent, as it is shown
    if spec.budget_usd is None or spec.budget_usd <= spent:
        raise BrokerError(
            f"--budget: ${spec.budget_usd or 0:,.2f} is not above the ${spent:,.2f} job {job.id} has spent; "
            f"give more to resume it"
        )
    why = f"resumed: budget raised to ${spec.budget_usd:,.2f}; its next run starts from its newest checkpoint"
    update = {"spec": spec, "state": JobState.queued, "reason": why, "stopped_at_budget": False, "updated_at": now}
    return job.model_copy(update=update)
