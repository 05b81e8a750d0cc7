"""`broker prices`: GPU instance prices, and `broker prices risk`: the preemption hazard behind them."""

from __future__ import annotations

from typing import Optional

import typer

from broker import render
from broker.cli_common import JsonOpt, make_broker, out, print_json, user_errors
from broker.pricing.accelerators import lookup

prices_app = typer.Typer(help="GPU instance prices and their preemption risk.")

Gpu = typer.Option(None, help="Only this accelerator (A100, L4, H100, ...).")
Cloud = typer.Option(None, help="Only this cloud (aws, gcp, azure).")
Region = typer.Option(None, help="Only this region.")
Limit = typer.Option(20, help="Rows to show (0 for all).")


@prices_app.callback(invoke_without_command=True)
@user_errors
def prices(
    ctx: typer.Context,
    gpu: Optional[str] = Gpu,
    cloud: Optional[str] = Cloud,
    region: Optional[str] = Region,
    spot: bool = typer.Option(False, "--spot", help="Only rows with a spot price, cheapest spot first."),
    limit: int = Limit,
    as_json: bool = JsonOpt,
) -> None:
    """Show GPU instance prices: on-demand and spot, with the interruption band."""
    if ctx.invoked_subcommand:
        return
    catalog = make_broker(with_store=False).catalog
    rows = catalog.table(gpu=lookup(gpu).name if gpu else None, cloud=cloud, region=region, spot_only=spot)
    shown = rows.head(limit) if limit else rows
    print_json(render.prices_records(shown)) if as_json else out.print(render.prices_table(shown, total=len(rows)))


@prices_app.command("risk")
@user_errors
def risk(gpu: Optional[str] = Gpu, cloud: Optional[str] = Cloud, region: Optional[str] = Region, limit: int = Limit,
         as_json: bool = JsonOpt) -> None:  # fmt: skip
    """Preemption hazard per spot instance type and region: lambda per hour, its 90% band, availability, evidence."""
    broker = make_broker()  # with the store: preemptions our agents saw count as evidence
    rows = broker.catalog.table(gpu=lookup(gpu).name if gpu else None, cloud=cloud, region=region, spot_only=True)
    rows = rows.drop_duplicates(["cloud", "region", "instance_type"])
    records = []
    for row in rows.itertuples(index=False):
        h = broker.catalog.hazard.spot(row.cloud, row.region, row.instance_type)
        records.append({"cloud": row.cloud, "region": row.region, "instance_type": row.instance_type, "gpus": f"{row.accelerator_count}x {row.accelerator}",
                        "hazard_per_h": h.per_hour, "low": h.low, "high": h.high, "availability": h.availability, "band": h.band, "evidence": h.source})  # fmt: skip
    records.sort(key=lambda r: (-("observed" in r["evidence"]), r["hazard_per_h"]))
    shown = records[:limit] if limit else records
    print_json(shown) if as_json else out.print(render.risk_table(shown, total=len(records)))
