"""How the CLI shows prices: the price table, preemption risk per offer, and recorded price history with
sparklines; plain records for `--json`."""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd
from rich.console import Group
from rich.table import Table
from rich.text import Text

from broker.app.narrow import Fitted, narrow_safe
from broker.app.render import relative, when
from broker.domain.model import Tier
from broker.domain.offer import offer_id

PRICE_COLUMNS = {
    "cloud": "cloud",
    "region": "region",
    "zone": "zone",
    "instance_type": "instance",
    "accelerator": "gpu",
    "accelerator_count": "n",
    "gpu_memory_gb": "GB/gpu",
    "vcpus": "vCPU",
    "memory_gb": "mem GB",
    "on_demand_usd_per_h": "on-demand",
    "spot_usd_per_h": "spot",
    "spot_savings_pct": "saves",
    "spot_band": "interrupts/mo",
    "as_of": "as of",
}
# left out, first named first, where the terminal is too narrow for every column
# (the zone stays longest: an offer's id, `broker agent --offer`, is cloud/zone/instance/tier)
PRICE_OPTIONAL = ("as of", "mem GB", "vCPU", "GB/gpu", "interrupts/mo", "region")


def prices_table(rows: pd.DataFrame, total: int) -> Fitted:
    table = Table(title=f"{len(rows)} of {total} instance prices (USD per hour)", title_justify="left")
    for col, label in PRICE_COLUMNS.items():
        table.add_column(label, justify="right" if rows[col].dtype.kind in "fi" else "left")
    for row in rows.itertuples(index=False):
        cells = []
        for col in PRICE_COLUMNS:
            value = getattr(row, col)
            if value is None or (isinstance(value, float) and pd.isna(value)):
                cells.append("-")
            elif col == "as_of":
                cells.append(
                    relative(datetime.fromisoformat(value[5:]), datetime.now(UTC))
                    if value.startswith("live ")
                    else "snapshot"
                )
            elif col == "spot_savings_pct":
                cells.append(f"{value:.0f}%")
            elif col.endswith("usd_per_h"):
                cells.append(f"{value:,.4f}")
            elif isinstance(value, float):
                cells.append(f"{value:g}")
            else:
                cells.append(str(value))
        table.add_row(*cells)
    return narrow_safe(table, optional=PRICE_OPTIONAL)


RISK_COLUMNS = ("cloud", "region", "instance", "gpus", "λ /h", "90% band", "avail", "advisor")
MARKET_COLUMNS = ("up h", "down h", "P(launch)", "λ by run age 0-1/1-4/4-12 h", "evidence")
RISK_OPTIONAL = ("λ by run age 0-1/1-4/4-12 h", "advisor", "gpus", "down h", "up h")


def risk_table(rows: list[dict], total: int) -> Group:
    """The hazard per row, the market model's spells beside it, and what each rests on in notes under the table
    (rows resting on the same evidence share a note): in a column, those sentences took the table's width."""
    table = Table(
        title=f"spot preemption hazard ({len(rows)} of {total} instance types and regions)", title_justify="left"
    )
    for col in RISK_COLUMNS + MARKET_COLUMNS:
        right = col in ("λ /h", "avail", "up h", "down h", "P(launch)", "evidence")
        table.add_column(col, justify="right" if right else "left")
    notes: dict[str, int] = {}
    for r in rows:
        note = f"hazard: {r['evidence']}; market: {r['market_evidence']}"
        number = notes.setdefault(note, len(notes) + 1)
        table.add_row(
            r["cloud"],
            r["region"],
            r["instance_type"],
            r["gpus"],
            f"{r['hazard_per_h']:.3f}",
            f"{r['low']:.3f}-{r['high']:.3f}",
            f"{r['availability']:.0%}",
            r["band"],
            f"{r['mean_up_h']:,.1f}",
            f"{r['mean_down_h']:,.1f}",
            f"{r['p_launch_now']:.0%}",
            "/".join("-" if h != h else f"{h:.2f}" for h in r["hazard_by_age_per_h"][:3]),
            f"[{number}]",
        )
    lines = [Text(f"[{n}] {note}", style="dim") for note, n in notes.items()]
    return Group(narrow_safe(table, optional=RISK_OPTIONAL), *lines)


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values) -> str:
    """Unicode bars scaled between the series' min and max."""
    values = list(values)
    low, high = min(values), max(values)
    if high == low:
        return SPARKS[3] * len(values)
    return "".join(SPARKS[round((v - low) / (high - low) * (len(SPARKS) - 1))] for v in values)


def history_table(series: dict[str, pd.DataFrame], now: datetime) -> Fitted:
    table = Table(title="price history (USD per hour): every recorded change", title_justify="left")
    for col in ("offer", "changes", "first", "last", "min", "max", "now", "as of", "trend"):
        table.add_column(col, justify="right" if col in ("changes", "min", "max", "now") else "left", no_wrap=True)
    for offer, s in series.items():
        table.add_row(
            offer,
            str(len(s)),
            when(s["at"].iloc[0]),
            when(s["at"].iloc[-1]),
            f"{s['usd'].min():.4f}",
            f"{s['usd'].max():.4f}",
            f"{s['usd'].iloc[-1]:.4f}",
            relative(s["at"].iloc[-1], now),
            sparkline(s["usd"].tail(40)),
        )
    return narrow_safe(table, "trend", optional=("first", "min", "max", "as of", "trend"))


def prices_records(rows: pd.DataFrame) -> list[dict]:
    """Price rows as JSON-ready dicts (NaN becomes null), with each tier's offer id (`broker agent --offer`; null
    where the tier has no price)."""
    records = rows.astype(object).where(rows.notna(), None).to_dict(orient="records")
    for r in records:
        for tier in (Tier.on_demand, Tier.spot):
            priced = r[f"{tier.value}_usd_per_h"] is not None
            where = r["zone"] or r["region"]
            r[f"{tier.value}_offer_id"] = offer_id(r["cloud"], where, r["instance_type"], tier) if priced else None
    return records
