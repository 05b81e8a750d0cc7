"""How one agent report changes its job: one small handler per kind of report, looked up in HANDLERS, the way
DeepSpeed's pipeline engine maps each instruction type to one method. A new kind of report is one handler
and one entry; the server folds reports through `fold` and nothing else (`folding` applies it to one job's
reports inside a store transaction).

Reports are untrusted: every field is coerced here (a pydantic model_copy does not validate, and a bad value
stored would poison the job), and a handler that raises leaves the job unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from broker.agents.checkpoints import CheckpointStore
from broker.domain.model import AgentInfo, Job, JobState, Run

if TYPE_CHECKING:
    from broker.store.jobs import Store

log = logging.getLogger(__name__)

# what a malformed report raises when folded (a missing field, a wrong type, a bad number or url)
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, OverflowError, OSError)

# unfit: a bubble agent found that no configuration of the job's steps fits its windows (time or free memory)
END_REASONS = {"finished", "failed", "preempted", "lost", "fenced", "cancelled", "moved", "unfit"}

# what a report leaves as it was on a job that has ended (a cancel or the budget cap ended it while its run went on)
ENDED_KEEPS = ("state", "reason", "restarts")

# (job, its current run (a copy to change), the report's data, the report's time, the checkpoint store)
#   -> the job's other fields to update, or None when the report changes nothing
Handler = Callable[[Job, Run, dict, datetime, CheckpointStore], dict | None]


def started(job: Job, run: Run, data: dict, now: datetime, checkpoints: CheckpointStore) -> dict | None:
    if run.started_at is not None:  # a repeat
        return None
    run.started_at = now
    return {"state": JobState.running, "reason": f"running on {run.agent}"}


def progress(job: Job, run: Run, data: dict, now: datetime, checkpoints: CheckpointStore) -> dict | None:
    total = data.get("total")
    run.progress_done, run.progress_total = float(data["done"]), None if total is None else float(total)
    run.last_progress_at = now
    run.record_progress(now, run.progress_done)
    return {}


def checkpoint(job: Job, run: Run, data: dict, now: datetime, checkpoints: CheckpointStore) -> dict | None:
    url, step = str(data["url"]), int(data["step"])
    if not checkpoints.owns(url, job.id):  # not taken (a resume reads the job's directory in this store): said
        run.checkpoint_error = (
            f"step {step}: saved at {url[:200]!r}, outside the job's directory in this broker's checkpoint store "
            f"{checkpoints.job_dir(job.id)}: its runs resume from nothing; give the server and its agents the same "
            "BROKER_CHECKPOINTS"
        )
        log.warning("job=%s %s", job.id, run.checkpoint_error)
        return {}
    run.checkpoint_url, run.checkpoint_step, run.checkpoint_at = url, step, now
    if run.checkpoint_requested_at is not None:
        run.checkpoints_asked += 1
    run.checkpoint_error = run.checkpoint_requested_at = None
    return {}


def checkpoint_failed(job: Job, run: Run, data: dict, now: datetime, checkpoints: CheckpointStore) -> dict | None:
    run.checkpoint_error = f"step {int(data['step'])}: {str(data['reason'])[:300]}"
    run.checkpoint_requested_at = None  # settled: the guard asks again if the deadline still needs one
    return {}


def notice(job: Job, run: Run, data: dict, now: datetime, checkpoints: CheckpointStore) -> dict | None:
    return {"state": JobState.migrating, "reason": f"preemption notice on {run.agent}"}


def exited(job: Job, run: Run, data: dict, now: datetime, checkpoints: CheckpointStore) -> dict | None:
    if data["reason"] not in END_REASONS:
        raise ValueError(f"unknown end reason {data['reason']!r}")
    code = data.get("code")
    end_run(run, now, data["reason"], None if code is None else int(code))
    return after_run(job, run, [str(line) for line in data.get("log_tail") or []][-50:])


HANDLERS: dict[str, Handler] = {
    "started": started,
    "progress": progress,
    "checkpoint": checkpoint,
    "checkpoint_failed": checkpoint_failed,
    "notice": notice,
    "exited": exited,
}


def fold(job: Job, report: dict, now: datetime, checkpoints: CheckpointStore) -> Job | None:
    """The job after one report, or None when the report does not apply (stale fence, another agent, a repeat,
    an unknown kind)."""
    run, handler = job.current_run, HANDLERS.get(report["type"])
    if run is None or handler is None or report["fence"] != job.fence or run.agent != report["agent"]:
        return None
    run = run.model_copy()
    update = handler(job, run, report["data"], now, checkpoints)
    if update is None:
        return None
    return with_run(job, run, update, now)


def with_run(job: Job, run: Run, update: dict, now: datetime) -> Job:
    """The job with its current run replaced by `run` and its other fields by `update`. One that ended while its run
    went on (cancelled, stopped at its budget) has the run recorded, and is not started or queued again."""
    if job.state.terminal:
        update = {k: v for k, v in update.items() if k not in ENDED_KEEPS}
    return job.model_copy(update={"updated_at": now, **update, "runs": job.runs[:-1] + [run]})


def end_run(run: Run, now: datetime, reason: str, code: int | None) -> None:
    """Close a run: its cost, and the work done since its last checkpoint when it did not finish."""
    run.ended_at, run.end_reason, run.exit_code = now, reason, code
    run.cost_usd = run.offer.price_usd_per_h * run.hours(now)
    if reason != "finished" and run.last_progress_at is not None:
        since = run.checkpoint_at or run.started_at or run.dispatched_at
        run.work_lost_s = max(0.0, (run.last_progress_at - since).total_seconds())


def after_run(job: Job, run: Run, log_tail: list[str]) -> dict:
    """What a job becomes when its run ended: done, failed or queued again, or migrating elsewhere."""
    reason = run.end_reason
    if reason == "finished":
        return {"state": JobState.done, "reason": "finished"}
    if reason == "failed":
        restarts = job.restarts + 1
        # no exit code: the agent could not start it (a missing program or workdir), and its one line says why
        cause = f"exit code {run.exit_code}" if run.exit_code is not None else "could not start"
        if run.exit_code is None and log_tail:
            cause += f": {log_tail[-1][:200]}"
        if restarts > job.spec.max_restarts:
            why = f"failed {'once' if restarts == 1 else f'{restarts} times'} ({cause})"
            return {"state": JobState.failed, "reason": why, "restarts": restarts, "log_tail": log_tail}
        return {"state": JobState.queued, "reason": f"restart {restarts} after {cause}", "restarts": restarts}
    if reason in ("preempted", "lost"):
        return {"state": JobState.migrating, "reason": f"{reason} on {run.agent}"}
    if reason == "unfit":
        return {"state": JobState.migrating, "reason": f"its steps fit no window of {run.agent}; placed elsewhere"}
    if reason == "moved":
        return {
            "state": JobState.migrating,
            "reason": f"moved off {run.agent} by the deadline guard",
            "move_requested": False,
        }
    return {}  # fenced or cancelled: the job already moved on


def folding(
    reports: list[dict],
    exited: dict[str, AgentInfo],
    fold_one: Callable[[Job, dict], Job | None],
    store: Store,
) -> tuple:
    """(job id, change, also) that fold one job's reports in order, for Store.update_jobs: `change` applies each
    report with `fold_one` (a malformed one changes nothing), `also` writes the state changes' events and frees
    the agents whose runs ended (`exited`: their records, read for the batch) in the same transaction."""
    job_id = reports[0]["job"]
    transitions: list[tuple[JobState, str | None]] = []

    def change(job: Job) -> Job | None:
        transitions.clear()
        folded = job
        for report in reports:
            try:
                after = fold_one(folded, report)
            except MALFORMED as err:  # no change
                log.warning("report=malformed job=%s type=%r error=%r", job.id, report.get("type"), err)
                continue
            if after is not None:
                if after.state != folded.state:
                    transitions.append((after.state, after.reason))
                folded = after
        return None if folded is job else folded

    agents = [exited[r["agent"]] for r in reports if r["type"] == "exited" and r["agent"] in exited]

    def also(shard, pipe, job: Job) -> None:
        for state, reason in transitions:
            shard.event(pipe, job.id, state, job.updated_at, reason)
        for agent in agents:
            if agent.job == job.id:
                shard.set_agent_job(pipe, agent, None, None)

    return job_id, change, also
