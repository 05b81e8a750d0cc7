"""A backtest's output directory: the policy table (CSV and JSON), per-job rows, cumulative spend over
time, and three plots (PNG). The dashboard's Backtest page reads the CSVs back with `load`."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from broker.domain.errors import BrokerError
from broker.domain.figures import figures, missed_deadline
from broker.models.accounting import spend_over_time
from broker.sim.backtest import JOINT, OMNISCIENT, SCHEDULE, Result, tier_hours

POLICIES_CSV, JOBS_CSV, SPEND_CSV, SUMMARY_JSON = "policies.csv", "jobs.csv", "spend.csv", "summary.json"
TIERS = ("bubble", "spot", "on_demand")


def spend_frame(result: Result, points: int = 100) -> pd.DataFrame:
    """Cumulative spend (USD) of each policy (columns) against hours since the start (index)."""
    ends = [o.end for o in result.outcomes]
    start = pd.Timestamp(min(o.jobs[0].submitted_at for o in result.outcomes if o.jobs)).tz_convert("UTC")
    times = pd.date_range(start, pd.Timestamp(max(ends)).tz_convert("UTC"), periods=points)
    frame = pd.DataFrame(index=(times - start).total_seconds() / 3600)
    for out in result.outcomes:
        by_tier = spend_over_time([figures(j, out.end) for j in out.jobs], out.end, times=times)
        frame[out.policy] = by_tier.sum(axis=1).to_numpy() if not by_tier.empty else 0.0
    frame.index.name = "hours"
    return frame


def jobs_frame(result: Result) -> pd.DataFrame:
    """One row per (policy, job): state, cost, quote, hours per tier, migrations, deadline met, its bound."""
    rows = []
    for out in result.outcomes:
        for job in out.jobs:
            hours = tier_hours([job], out.end)
            bound = result.bound.get(job.id)
            rows.append(
                {
                    "policy": out.policy,
                    "job": job.id,
                    "state": job.state.value,
                    "cost_usd": round(job.cost_usd, 4),
                    "quote_usd": round(job.quote.cost_usd, 4),
                    "migrations": job.migrations,
                    "missed_deadline": missed_deadline(job, out.end),
                    "omniscient_usd": round(bound.cost_usd, 4) if bound else None,
                    **{f"{t}_h": round(h, 3) for t, h in hours.items()},
                }
            )
    return pd.DataFrame(rows)


def write(result: Result, directory: Path) -> list[Path]:
    """Write the table, per-job rows, spend over time and the plots; returns the files written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(result.rows)
    spend = spend_frame(result)
    files = {name: directory / name for name in (POLICIES_CSV, JOBS_CSV, SPEND_CSV, SUMMARY_JSON)}
    table.to_csv(files[POLICIES_CSV], index=False)
    jobs_frame(result).to_csv(files[JOBS_CSV], index=False)
    spend.to_csv(files[SPEND_CSV])
    files[SUMMARY_JSON].write_text(
        json.dumps({**result.setting, "policies": result.rows, "skipped": result.skipped}, indent=1)
    )
    return list(files.values()) + _plots(table, spend, directory)


def _plots(table: pd.DataFrame, spend: pd.DataFrame, directory: Path) -> list[Path]:
    import matplotlib  # here, not at the top: importing it costs every `broker` command half a second

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    paths = [directory / "cost_by_policy.png", directory / "spend_over_time.png", directory / "tier_mix.png"]
    fig, ax = plt.subplots(figsize=(8, 4))
    colors = ["#888888" if p in (OMNISCIENT, JOINT, SCHEDULE) else "#1f77b4" for p in table.policy]
    ax.barh(table.policy, table.cost_usd, color=colors)
    ax.set_xlabel("total cost (USD)")
    ax.set_title("Cost by policy (grey: the omniscient bounds and the offline schedule)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(paths[0], dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 4))
    for policy in spend.columns:
        ax.plot(spend.index, spend[policy], label=policy)
    ax.set_xlabel("hours since the first job")
    ax.set_ylabel("cumulative spend (USD)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 4))
    left = pd.Series(0.0, index=table.index)
    for tier, color in zip(TIERS, ("#2ca02c", "#ff7f0e", "#d62728")):
        ax.barh(table.policy, table[f"{tier}_h"], left=left, label=tier, color=color)
        left = left + table[f"{tier}_h"]
    ax.set_xlabel("instance hours")
    ax.set_title("Tier mix")
    ax.invert_yaxis()
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[2], dpi=100)
    plt.close(fig)
    return paths


def load(directory: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(policy table, spend over time, summary) of a backtest output directory; BrokerError when it is not one."""
    directory = Path(directory)
    if not (directory / POLICIES_CSV).exists():
        raise BrokerError(
            f"backtest: {directory} has no {POLICIES_CSV}; write one with `broker backtest --out {directory}`"
        )
    summary = json.loads((directory / SUMMARY_JSON).read_text()) if (directory / SUMMARY_JSON).exists() else {}
    return pd.read_csv(directory / POLICIES_CSV), pd.read_csv(directory / SPEND_CSV, index_col="hours"), summary
