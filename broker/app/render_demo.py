"""The demo's summaries as tables: `broker demo` (its jobs' runs, cost and savings) and `broker demo --bubbles` (the
main job's stages and the fill job's runs)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from broker.app.narrow import Fitted, narrow_safe


def run_summary(summary: dict) -> Fitted:
    """The demo's end-to-end result: per job its tiers, cost, on-demand cost, migrations, work lost (the job ids
    whole: the demo's last line tells the user to look them up)."""
    table = Table(title=f"demo run (clock x{summary['speedup']:g})", title_justify="left", caption_justify="left")
    for col in ("job", "state", "runs (tier@agent)", "cost", "on-demand", "migrations", "work lost"):
        table.add_column(col, justify="right" if col in ("cost", "on-demand", "migrations", "work lost") else "left")
    for row in summary["jobs"]:
        table.add_row(
            row["id"],
            row["state"],
            " -> ".join(f"{t}@{a}" for t, a in zip(row["tiers"], row["agents"])),
            f"${row['cost_usd']:,.4f}",
            f"${row['on_demand_cost_usd']:,.4f}",
            str(row["migrations"]),
            f"{row['work_lost_s']:.0f} s",
        )
    if summary["savings_pct"] is not None:
        table.caption = (
            f"total ${summary['cost_usd']:,.4f} vs ${summary['on_demand_cost_usd']:,.4f} on on-demand: "
            f"{summary['savings_pct']:.0f}% saved (times and costs on the compressed clock)"
        )
    return narrow_safe(table, "runs (tier@agent)", optional=("work lost", "migrations"))


def bubbles_summary(summary: dict) -> Group:
    """`broker demo --bubbles`: the main job's stages, and the fill job's runs from bubbles to elsewhere (title and
    note as lines of their own: the table is narrow, and a title or caption wraps at its width)."""
    job = summary["fill_job"]
    cost = f"${job['cost_usd']:,.4f} vs ${job['on_demand_cost_usd']:,.4f} on on-demand"
    title = f"fill job {job['id']} ({job['state']}): {cost}"
    table = Table()
    for col in ("run on", "tier", "end", "step", "resumed from", "seconds"):
        table.add_column(col, justify="right" if col in ("step", "seconds") else "left")
    for run in job["runs"]:
        table.add_row(
            run["agent"],
            run["tier"],
            str(run["end"]),
            str(run["checkpoint_step"]),
            (run["resume_from"] or "-")[-40:],
            str(run["seconds"]),
        )
    stages = ", ".join(f"stage {s['stage']}: {100 * s['bubble_fraction']:.0f}% idle" for s in summary["stages"])
    note = f"main job {summary['main_job']} ({stages}, measured on this machine); step: the run's last checkpoint"
    return Group(Text(title), narrow_safe(table, "resumed from", optional=("resumed from",)), Text(note))
