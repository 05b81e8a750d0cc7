"""Quotes against what happened: per job the quoted cost and P(meet) beside the realised cost and whether it met
its deadline, and the figures that say whether quotes can be trusted (cost error, reliability, Brier score)."""

from __future__ import annotations

import math

import numpy as np

from broker.domain.figures import missed_deadline, spend_usd
from broker.domain.model import Job, JobState
from broker.models.risk import window_hours

BINS = 10  # reliability diagram: P(meet) in 10-point bins
MIN_PER_BIN = 20  # a bin counts toward the calibration gap only with this many jobs
NOISE_DRAWS = 1000  # outcomes drawn at the quoted odds for the noise floor of the largest gap


def job_rows(jobs: list[Job], end, outlooks: dict | None = None) -> list[dict]:
    """One row per job with a deadline or a cost: quoted and realised cost, quoted P(meet), and whether it met.
    With `outlooks` (job id -> (when, Forecast): Outcome.outlooks), one row per job that has one, against it in place
    of the quote, with the share of the job's window gone when it was made (`window_gone`). `quoted_after_h`: hours
    after the first job's submission (a backtest starts with a broker that has seen no job come)."""
    rows = []
    first = min((job.submitted_at for job in jobs), default=None)
    for job in jobs:
        extra, at = {}, job.submitted_at
        if outlooks is None:
            forecast, quoted, p_meet = job.quote.forecast, job.quote.cost_usd, job.quote.p_meet_deadline
        elif job.id in outlooks:
            at, forecast = outlooks[job.id]
            quoted, p_meet = forecast.cost_p50_usd, forecast.p_meet_deadline
            window_h = window_hours(job.spec, job.submitted_at)
            gone_h = (at - job.submitted_at).total_seconds() / 3600
            extra = {"window_gone": round(gone_h / window_h, 4) if math.isfinite(window_h) else None}
        else:
            continue
        rows.append(
            {
                "job": job.id,
                "quoted_cost_usd": quoted,  # the forecast's median, else the money model's
                "cost_usd": spend_usd(job, end),
                "p_meet": p_meet,
                "met": job.state == JobState.done and not missed_deadline(job, end),
                # hours from the first job's submission to this quote: the first are quoted with no arrivals seen
                "quoted_after_h": round((at - first).total_seconds() / 3600, 3),
                # the runs spot took back after the quote (or outlook) was made: what its futures count
                "preemptions": sum(1 for r in job.runs if r.end_reason == "preempted" and r.ended_at > at),
                **(
                    {f"quoted_{q}_usd": getattr(forecast, f"cost_{q}_usd") for q in ("p10", "p90", "mean")}
                    | {"quoted_spread_pct": forecast.cost_spread_pct, "quoted_likely_usd": forecast.cost_likely_usd}
                    | {"quoted_preemptions": forecast.preemptions_mean}
                    if forecast
                    else {}
                ),
                **extra,
            }
        )
    return rows


def cost_errors_pct(rows: list[dict]) -> tuple[float | None, float | None]:
    """Median and 90th percentile of |realised / quoted - 1|, in percent, over jobs with a quoted cost."""
    errors = [abs(r["cost_usd"] / r["quoted_cost_usd"] - 1) for r in rows if r["quoted_cost_usd"] > 0]
    if not errors:
        return None, None
    return round(100 * float(np.median(errors)), 1), round(100 * float(np.percentile(errors, 90)), 1)


def cost_coverage(rows: list[dict]) -> dict:
    """How the realised costs fall against the quoted percentiles (true quotes: 10%, 50% and 90% of jobs at or
    below p10, p50 and p90), and the median of the quotes' own spread (the miss a right model still makes), over
    the jobs whose quote had a forecast with a spread: a point quote (p10 = p90: free bubble work in every future)
    is at or below its p10 whenever it was right, which would count as too dear (`quoted_free_*` count those). A cost
    equal to a percentile counts half (the mid-distribution rule for forecasts with a point mass): free work quoted
    free in most futures (p10 = p50 = $0 < p90) is at its p10 more often than 10% of the time when it is right.
    And the realised costs summed over the quoted means summed (`cost_realised_over_quoted_mean`: 1 when the quotes
    are right on average) and over the quoted p50s summed (`..._p50`): a job's cost is skewed (most futures keep
    spot, a few pay on-demand through a long gap), so right quotes' p50s sum to less than their jobs cost."""
    known = [r for r in rows if "quoted_p10_usd" in r and r["quoted_p90_usd"] > r["quoted_p10_usd"]]
    if not known:
        return {
            "cost_at_or_below_p10_p50_p90": None,
            "median_quoted_spread_pct": None,
            "cost_realised_over_quoted_mean": None,
            "cost_realised_over_quoted_p50": None,
        }

    def share(key: str) -> float:
        tie = [abs(r["cost_usd"] - r[key]) <= 1e-9 * max(1.0, r[key]) for r in known]
        below = [r["cost_usd"] < r[key] and not t for r, t in zip(known, tie)]
        return round(float(np.mean(below) + 0.5 * np.mean(tie)), 3)

    shares = [share(key) for key in ("quoted_p10_usd", "quoted_cost_usd", "quoted_p90_usd")]
    spread = round(float(np.median([r["quoted_spread_pct"] for r in known])), 1)
    realised = sum(r["cost_usd"] for r in known)

    def over(key: str) -> float | None:
        quoted = sum(r[key] for r in known)
        return round(realised / quoted, 3) if quoted > 0 else None

    return {
        "cost_at_or_below_p10_p50_p90": shares,
        "median_quoted_spread_pct": spread,
        "cost_realised_over_quoted_mean": over("quoted_mean_usd"),
        "cost_realised_over_quoted_p50": over("quoted_cost_usd"),
    }


def preemptions_over_quoted(rows: list[dict]) -> float | None:
    """The runs spot took back from the jobs, summed, over their quotes' futures' means summed: 1 where the futures
    lose runs as often as the world did (a pool's per-instance hazard, bench/results/forecast.md); None where the
    quotes expect none."""
    quoted = [r for r in rows if r.get("quoted_preemptions") is not None]
    expected = sum(r["quoted_preemptions"] for r in quoted)
    return round(sum(r["preemptions"] for r in quoted) / expected, 3) if expected > 0 else None


def reliability(rows: list[dict]) -> dict:
    """P(meet) against the share that met, in BINS bins: per bin (from, to, jobs, predicted, observed); the largest
    |predicted - observed| in points over bins with MIN_PER_BIN jobs, and the same gap weighted by jobs over all bins
    (`calibration_mean_gap_pts`); the Brier score; and `calibration_max_gap_if_calibrated_pts`: the median and 90th
    percentile of the largest gap that perfectly calibrated odds would show on these very quotes (each job meeting
    with its quoted P), the noise floor below which a largest gap says nothing. Rows with the same `case` (one job
    under several policies, pooled) meet or miss together in those draws, each at its own odds: drawn apart, one
    job's outcome under three policies would count as three independent ones, and the floor would be too low."""
    if not rows:
        return {
            "bins": [],
            "calibration_max_gap_pts": None,
            "calibration_mean_gap_pts": None,
            "calibration_max_gap_if_calibrated_pts": None,
            "brier": None,
        }
    p = np.array([r["p_meet"] for r in rows], dtype=float)
    y = np.array([r["met"] for r in rows], dtype=float)
    which = np.minimum((p * BINS).astype(int), BINS - 1)
    masks = {int(b): which == b for b in np.unique(which)}
    bins = [
        {
            "from": b / BINS,
            "to": (b + 1) / BINS,
            "jobs": int(m.sum()),
            "predicted": round(float(p[m].mean()), 4),
            "observed": round(float(y[m].mean()), 4),
        }
        for b, m in masks.items()
    ]
    gaps = np.array([abs(b["predicted"] - b["observed"]) for b in bins])
    jobs = np.array([b["jobs"] for b in bins])
    counted = [m for m in masks.values() if m.sum() >= MIN_PER_BIN]
    case = {}
    index = np.array([case.setdefault(r.get("case", ("row", i)), len(case)) for i, r in enumerate(rows)])
    draws = np.random.default_rng(0).random((NOISE_DRAWS, len(case)))[:, index] < p  # outcomes if the odds were true
    chance = np.max([np.abs(p[m].mean() - draws[:, m].mean(axis=1)) for m in counted] or [np.zeros(1)], axis=0)
    return {
        "bins": bins,
        "calibration_max_gap_pts": round(100 * float(gaps[jobs >= MIN_PER_BIN].max()), 1) if counted else None,
        "calibration_mean_gap_pts": round(100 * float(np.sum(gaps * jobs) / jobs.sum()), 1),
        "calibration_max_gap_if_calibrated_pts": [round(100 * float(np.percentile(chance, q)), 1) for q in (50, 90)],
        "brier": round(float(np.mean((p - y) ** 2)), 4),
    }
