"""The budget cap: a job whose spec says `if_over_budget: stop` ends failed once what it spent reaches its budget.

Checked on the guard's pass, for every policy, by the leading replica: a running job is stopped when the pass to
come would take its spend past the budget (what it spent so far, and its offer's price over one more pass), so it
ends at most a pass and its save past it; and when it is planned, so a job back in the queue with its budget spent
(a run lost past it) is not started again. Ending the job is a state change, as a cancel is: the agent sees its run
fenced, stops the job (which saves on the stop signal) and reports the exit, which closes the run at its cost.
"""

from __future__ import annotations

import logging
from datetime import datetime

from broker.domain.figures import spend_usd
from broker.domain.model import IfOverBudget, Job, JobState
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
            f"its checkpoints stay in the checkpoint store"
        )

        def fail(current: Job, fence=job.fence, why=why) -> Job | None:
            if current.fence != fence or not over_budget(current, now, pass_h):
                return None
            return current.model_copy(update={"state": JobState.failed, "reason": why, "updated_at": now})

        if store.update_job(job.id, fail, leader=leader, reason=why) is not None:
            log.info("job=%s stopped: %s", job.id, why)
            stopped.append(job.id)
    return stopped
