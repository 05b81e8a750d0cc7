"""The numbers users look at, computed from stored jobs: spend, savings, counts, misses, spend over time.

Pure functions of jobs and a time, shared by the dashboard and the demo summary. A job's
on-demand equivalent (Job.on_demand_usd) is what its productive hours (run hours less work
lost) would have cost at the price of the on-demand option its quote was compared with.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np
import pandas as pd

from broker.domain.figures import JobFigures, spend_usd
from broker.domain.model import Job, JobState


def savings_pct(spend_usd: float, on_demand_usd: float) -> float | None:
    """The share saved against on-demand, in percent; None without an on-demand cost to compare with."""
    return 100 * (1 - spend_usd / on_demand_usd) if on_demand_usd > 0 else None


def overview(jobs: Sequence[JobFigures], now: datetime) -> dict:
    """The overview page's KPIs."""
    spend = sum(j.spend_usd for j in jobs)
    baseline = sum(j.on_demand_usd for j in jobs)
    budgeted = [j for j in jobs if j.budget_usd]
    counts = {s: 0 for s in ("queued", "running", "done", "failed", "cancelled")}
    for job in jobs:
        counts["running" if job.state in (JobState.running, JobState.migrating) else job.state.value] += 1
    return {
        "spend_usd": spend,
        "on_demand_usd": baseline,
        "savings_usd": baseline - spend,
        "savings_pct": savings_pct(spend, baseline),
        **counts,
        "deadline_misses": sum(j.hours_late(now) > 0 for j in jobs),
        "budget_used_pct": 100 * sum(j.spend_usd for j in budgeted) / sum(j.budget_usd for j in budgeted)
        if budgeted
        else None,
    }


def quote_record(jobs: Sequence[JobFigures], now: datetime) -> dict:
    """How the quotes did on these jobs, a backtest's calibration (sim/calibration.py) on the live store: over the
    finished jobs with a quoted cost, the median |cost / quote - 1| and the shares that cost at most their quote (a
    true median: half) and within its p10-p90 (a true band: 80%); over the jobs whose deadline is decided (finished,
    or unfinished past it; not failed or cancelled) and whose quote gave odds, how many met it against the odds. Jobs
    run on local stand-ins (a demo's, `broker run`'s) keep no quote to be set against (domain/figures.figures)."""
    costed = [j for j in jobs if j.state == JobState.done and j.final and j.quoted_usd]
    banded = [j for j in costed if j.quoted_p10_usd is not None and j.quoted_p90_usd is not None]
    decided = [
        j
        for j in jobs
        if j.quoted_p_meet is not None
        and j.deadline is not None
        and (j.state == JobState.done or (j.state not in (JobState.failed, JobState.cancelled) and now > j.deadline))
    ]

    def pct(values) -> float | None:
        return round(100 * float(np.mean(values)), 1) if len(values) else None

    errors = [abs(j.spend_usd / j.quoted_usd - 1) for j in costed]
    return {
        "finished": len(costed),
        "median_cost_error_pct": round(100 * float(np.median(errors)), 1) if errors else None,
        "at_or_below_quote_pct": pct([j.spend_usd <= j.quoted_usd for j in costed]),
        "banded": len(banded),
        "within_p10_p90_pct": pct([j.quoted_p10_usd <= j.spend_usd <= j.quoted_p90_usd for j in banded]),
        "deadlines": len(decided),
        "met": sum(j.met_deadline(now) for j in decided),
        "quoted_p_meet_mean": round(float(np.mean([j.quoted_p_meet for j in decided])), 3) if decided else None,
    }


def spend_over_time(
    jobs: Sequence[JobFigures], now: datetime, buckets: int = 60, times: pd.DatetimeIndex | None = None
) -> pd.DataFrame:
    """Cumulative spend by tier (columns) over time (index, `buckets` steps to now, or to the last run's end when
    that is later, unless `times` are given): each run accrues evenly over its hours. All runs at once (numpy): a
    store keeps every job it ever ran."""
    runs = [r for j in jobs for r in j.runs]
    if not runs:
        return pd.DataFrame()
    begin = pd.to_datetime([r.begin for r in runs], utc=True)  # stored times carry pydantic's UTC tzinfo
    end = pd.to_datetime([r.end for r in runs], utc=True)
    if times is None:  # up to the last run's end: a demo's compressed clock stamps runs after the wall clock's now
        times = pd.date_range(begin.min(), max(pd.Timestamp(now).tz_convert("UTC"), end.max()), periods=buckets)
    span = np.maximum((end - begin).total_seconds().to_numpy(), 1e-9)
    elapsed = (_utc_ns(times)[:, None] - _utc_ns(begin)[None, :]) / np.timedelta64(1, "s")
    accrued = np.clip(elapsed, 0, span) / span * np.array([r.cost_usd for r in runs])
    tiers = np.array([r.tier for r in runs])
    return pd.DataFrame(
        {tier: accrued[:, tiers == tier].sum(axis=1) for tier in ("bubble", "spot", "on_demand")}, index=times
    )


def _utc_ns(times: pd.DatetimeIndex) -> np.ndarray:
    return times.tz_convert("UTC").tz_localize(None).to_numpy("datetime64[ns]")


def progress_frame(job: Job) -> pd.DataFrame:
    """The job's progress points (time, done, run), on the server's clock like its runs."""
    rows = [{"time": at, "done": done, "run": r.id} for r in job.runs for at, done in r.progress_points]
    frame = pd.DataFrame(rows, columns=["time", "done", "run"])
    frame["time"] = pd.to_datetime(frame["time"], utc=True)
    return frame


def jobs_frame(jobs: list[Job], now: datetime) -> pd.DataFrame:
    """One row per job, as the jobs page shows it."""
    rows = []
    for job in jobs:
        offer = job.runs[-1].offer if job.runs else job.quote.chosen.offer
        spend = spend_usd(job, now)
        slack_h = (job.spec.deadline - now).total_seconds() / 3600 if job.spec.deadline else None
        rows.append(
            {
                "job": job.id,
                "state": job.state.value,
                "tier": offer.tier.value,
                "offer": f"{offer.cloud} {offer.instance_type} {offer.zone or offer.region}",
                "deadline slack h": None if job.state.terminal or slack_h is None else round(slack_h, 2),
                "cost so far $": round(spend, 4),
                "quote $": round(job.quote.cost_usd, 4),
                "budget used %": round(100 * spend / job.spec.budget_usd, 1) if job.spec.budget_usd else None,
                "migrations": job.migrations,
                "tags": ", ".join(job.tags),
            }
        )
    return pd.DataFrame(rows)


def cost_report(jobs: Sequence[JobFigures]) -> pd.DataFrame:
    """Per job (`broker cost-report`, like `sky cost-report`): spend on each tier, the total, what the same
    productive hours cost on on-demand, the share saved, the hours on each tier, and what its quote said (names with
    their units, as `--json` gives them to machines)."""
    rows = []
    for job in jobs:
        by_tier = {tier: [r for r in job.runs if r.tier == tier] for tier in ("bubble", "spot", "on_demand")}
        rows.append(
            {
                "job": job.id,
                "state": job.state.value,
                "tags": list(job.tags),
                **{f"{tier}_usd": sum(r.cost_usd for r in runs) for tier, runs in by_tier.items()},
                "total_usd": job.spend_usd,
                "all_on_demand_usd": job.on_demand_usd,
                "saved_pct": savings_pct(job.spend_usd, job.on_demand_usd),
                **{f"{tier}_h": sum(r.hours for r in runs) for tier, runs in by_tier.items()},
                "quoted_usd": job.quoted_usd,  # what its quote said (quote_record sets them against the spend)
                "quoted_p10_usd": job.quoted_p10_usd,
                "quoted_p90_usd": job.quoted_p90_usd,
                "quoted_p_meet": job.quoted_p_meet,
            }
        )
    return pd.DataFrame(rows)
