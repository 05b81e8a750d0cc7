"""How the CLI shows tables of figures: a backtest's policies, the single-job settings, a training job's layouts.
Short headers, explained in a note under the table; every number whole; the least needed columns left out first
where the terminal is narrow (`--json` has them all)."""

from __future__ import annotations

from rich.table import Table

from broker.app.narrow import Fitted, narrow_safe

BACKTEST_COLUMNS = {
    "policy": "policy",
    "cost_usd": "cost $",
    "savings_pct": "saved %",
    "deadline_misses": "misses",
    "hours_late": "h late",
    "cost_vs_omniscient": "x bound",
    "cost_vs_joint_omniscient": "x joint",
    "cost_vs_joint_schedule": "x sched",
    "migrations": "moves",
    "work_lost_h": "lost h",
    "median_abs_cost_error_pct": "quote err %",
    "brier": "brier",
}
BACKTEST_OPTIONAL = ("brier", "lost h", "x sched", "moves", "x bound", "h late")  # left out first, first named first
BACKTEST_NOTE = (
    "x bound: cost over the omniscient bound per job; x joint: over the joint bound (every job at once, on shared "
    "capacity); x sched: over the joint schedule; quote err: median |realised / quoted - 1|. --json and --out have "
    "every column."
)
SINGLE_JOB_COLUMNS = {
    "setting": "setting",
    "deadline_h": "deadline h",
    "windows": "windows",
    "policy": "policy",
    "mean_cost_usd": "mean $",
    "savings_pct": "saved %",
    "vs_uniform_1_zone_pct": "vs UP %",
    "vs_uniform_zone_range_pct": "per zone %",
    "cost_vs_omniscient": "x bound",
    "worst_vs_omniscient": "worst x",
    "deadline_misses": "misses",
}
SINGLE_JOB_OPTIONAL = ("windows", "worst x", "per zone %", "misses")
SINGLE_JOB_NOTE = (
    "vs UP: cheaper than Uniform Progress in one zone (the paper's baseline); per zone: the least and the most it "
    "saves against Uniform Progress in each zone; x bound and worst x: the mean and the worst window over the "
    "omniscient bound."
)


def figures_table(rows: list[dict], columns: dict[str, str], title: str, note: str, optional=()) -> Fitted:
    """Rows of figures (a backtest's policies, the single-job settings) under short headers, explained in `note`:
    every number whole, the `optional` columns left out first where the terminal is narrow."""
    table = Table(title=title, title_justify="left", caption=note, caption_justify="left")
    for key, header in columns.items():
        text = any(isinstance(row.get(key), str) for row in rows)  # names left, numbers right
        table.add_column(header, justify="left" if text else "right")
    for row in rows:
        table.add_row(*(_figure(row.get(key), money=header.endswith("$")) for key, header in columns.items()))
    return narrow_safe(table, optional=optional)  # policy names whole: they are what --policies takes


def _figure(value, money: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return " to ".join(_figure(v) for v in value)
    if isinstance(value, float) and money:
        return f"{value:,.2f}"
    return f"{value:,}" if isinstance(value, (int, float)) else str(value)
