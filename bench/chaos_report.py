"""What a chaos run left behind: why a job did not finish, and how each announced preemption ended (bench/chaos.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from broker.store.report_stream import is_wake

CLOUDS = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}  # each cloud's notice lead, seconds


def why_not_done(store, job) -> dict:
    """What a job that did not finish was doing: its state and reason, fence, how its runs ended, its newest
    run's agent (and whether that agent still holds a lease), progress, checkpoint, and its last report."""
    ends = Counter(r.end_reason or "open" for r in job.runs)
    last = job.current_run or (job.runs[-1] if job.runs else None)
    reports = [
        fields
        for _, fields in store.redis.xrevrange(store.key("agent-events"), count=5000)
        if fields["job"] == job.id and not is_wake(fields)  # an agent's report, not its submit's wake
    ]
    return {
        "job": job.id,
        "state": job.state.value,
        "reason": job.reason,
        "fence": job.fence,
        "runs": len(job.runs),
        "ends": dict(ends),
        "last_agent": last.agent if last else None,
        "last_agent_lease": store.leases([last.agent])[last.agent] if last else None,
        "last_started": last.started_at is not None if last else None,
        "last_progress": last.progress_done if last else None,
        "last_checkpoint_step": last.checkpoint_step if last else None,
        "last_report": {k: reports[0][k] for k in ("type", "fence", "data") if k in reports[0]} if reports else None,
    }


def notice_timing(notices: list[dict], jobs: dict, checkpoints) -> dict:
    """Seconds from each announced preemption to its run's checkpoint, counted only when the checkpoint holds
    all the run's progress (0 s when it was saved just before the notice), was written before the deadline,
    and is verified: the job's next run resumed from it (the
    server resumes only from a checkpoint whose checksums verify; older ones are pruned later), or it
    verifies now; p50/p99 over them."""
    import numpy as np

    seconds, missed, finished_first, lost_first = [], [], 0, 0
    for notice in notices:
        run = next((r for r in jobs[notice["job"]].runs if r.fence == notice["fence"]), None)
        if run is not None and run.end_reason == "finished":
            finished_first += 1  # the job ended on its own before it had to checkpoint
            continue
        if run is not None and run.end_reason == "lost":
            lost_first += 1  # the instance was killed (or its lease lapsed) before the notice reached it
            continue
        saved = (
            run
            and run.checkpoint_at
            and run.checkpoint_step >= run.progress_done
            and run.checkpoint_at <= notice["deadline"]
        )
        resumed = saved and any(
            r.fence > run.fence and r.resume_from == run.checkpoint_url for r in jobs[notice["job"]].runs
        )
        if saved and (resumed or checkpoints.verified_at(notice["job"], run.checkpoint_url)[0] is not None):
            seconds.append(max(0.0, (run.checkpoint_at - notice["posted"]).total_seconds()))
        else:
            missed.append(notice_outcome(notice, run))
    by_cloud = {c: sum(n["cloud"] == c for n in notices) for c in CLOUDS}
    percentile = (lambda q: round(float(np.percentile(seconds, q)), 3)) if seconds else (lambda q: None)
    return {
        "notices": len(notices),
        "notices_by_cloud": by_cloud,
        "notices_checkpointed_in_time": len(seconds),
        "notices_missed": len(missed),
        "missed": missed,
        "notices_job_finished_first": finished_first,
        "notices_run_lost_first": lost_first,
        "notice_to_checkpoint_p50_s": percentile(50),
        "notice_to_checkpoint_p99_s": percentile(99),
    }


def notice_outcome(notice: dict, run) -> dict:
    """What became of a notice's run, for a notice whose checkpoint did not count."""
    return {
        "agent": notice["agent"],
        "job": notice["job"],
        "fence": notice["fence"],
        "deadline": notice["deadline"].isoformat(),
        "end_reason": run.end_reason if run else None,
        "progress": run.progress_done if run else None,
        "checkpoint_step": run.checkpoint_step if run else None,
        "checkpoint_at": run.checkpoint_at.isoformat() if run and run.checkpoint_at else None,
        "checkpoint_error": run.checkpoint_error if run else None,
    }


def tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""
