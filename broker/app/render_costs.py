"""How the CLI shows what jobs cost: `broker cost-report`'s table, the quotes' record under it (the dashboard's
overview shows it too), and a finished job's cost and deadline against its quote (`broker status`)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from rich.table import Table

from broker.app.narrow import Fitted, narrow_safe
from broker.app.render import money, plural, shown_of
from broker.domain.figures import figures
from broker.domain.model import Job, JobState

if TYPE_CHECKING:  # pandas costs a read command a third of a second: imported where a table needs it
    import pandas as pd


def cost_report_table(frame: pd.DataFrame, every: pd.DataFrame | None = None) -> Fitted:
    """`broker cost-report`: a row per job and the totals, of `every` job when the rows are the newest of them
    (spend per tier in US$, headers without the unit so a 30-character job id and every column fit 80 columns; the
    hours are in --json)."""
    import pandas as pd

    from broker.models import accounting

    every = frame if every is None else every
    table = Table(title=f"cost report (US$): {shown_of(len(frame), len(every))}", title_justify="left")
    spent = [c for c in frame.columns if c.endswith("_usd") and not c.startswith("quoted")]  # spend: summed
    for col in ["job", "state", *spent, "saved_pct"]:
        header = col.removesuffix("_usd").removesuffix("_pct").replace("all_on_demand", "all on-demand")
        table.add_column(header.replace("_", "-"), justify="left" if col in ("job", "state") else "right")

    def cells(row) -> list[str]:
        saved = row["saved_pct"]
        return [*(f"{row[c]:,.2f}" for c in spent), "-" if saved is None or pd.isna(saved) else f"{saved:.0f}%"]

    for row in frame.to_dict(orient="records"):
        table.add_row(row["job"], " ".join([row["state"], *(f"({tag})" for tag in row["tags"])]), *cells(row))
    total = every[spent].sum().to_dict()
    total["saved_pct"] = accounting.savings_pct(total["total_usd"], total["all_on_demand_usd"])
    table.add_section()
    table.add_row("total" if len(every) == len(frame) else f"total of {len(every):,}", "", *cells(total))
    return narrow_safe(table, "all on-demand", optional=("state",))  # its cells are one word each: never folded


def quote_record_line(record: dict) -> str | None:
    """How the quotes did (accounting.quote_record) in a line; None before a job with a quote has finished or
    reached its deadline."""
    parts = []
    if record["finished"]:
        parts.append(
            f"{plural(record['finished'], 'finished job')} cost {record['median_cost_error_pct']:.0f}% off the "
            f"quote (median), {record['at_or_below_quote_pct']:.0f}% at or under it (true quotes: 50%)"
        )
    if record["banded"]:
        parts.append(f"{record['within_p10_p90_pct']:.0f}% of {record['banded']:,} within the quote's p10-p90 (80%)")
    if record["deadlines"]:
        parts.append(
            f"{record['met']:,} of {plural(record['deadlines'], 'deadline')} met, "
            f"quoted at {record['quoted_p_meet_mean']:.2f} on average"
        )
    return f"quotes against what jobs did: {'; '.join(parts)}" if parts else None


def quote_verdict(job: Job, now: datetime) -> str | None:
    """A finished job's cost and deadline against its quote, as the quotes' record counts them (None where it
    does not: unfinished, or run on a local stand-in)."""
    kept = figures(job, now)
    if job.state != JobState.done or not kept.quoted_usd:
        return None
    off = kept.spend_usd / kept.quoted_usd - 1
    said = f"cost {money(kept.spend_usd)}, {abs(off):.0%} {'over' if off > 0 else 'under'} the quote's "
    said += money(kept.quoted_usd)
    low, high = kept.quoted_p10_usd, kept.quoted_p90_usd
    if low is not None and high is not None:
        where = "within" if low <= kept.spend_usd <= high else "above" if kept.spend_usd > high else "below"
        said += f" ({where} its p10-p90, {money(low)} - {money(high)})"
    if kept.quoted_p_meet is not None:
        said += f"; deadline {'met' if kept.met_deadline(now) else 'missed'}, quoted at {kept.quoted_p_meet:.2f}"
    return f"against its quote: {said}"
