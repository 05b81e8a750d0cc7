"""`broker prices`: GPU instance prices, and `broker prices risk`: the preemption hazard behind them."""

from __future__ import annotations

import difflib
from datetime import UTC, datetime
from pathlib import Path

import typer

from broker.app.cli.common import JsonOpt, err, make_broker, out, print_json, user_errors
from broker.domain.accelerators import lookup
from broker.domain.errors import BrokerError
from broker.domain.model import Tier, parse_deadline

prices_app = typer.Typer(help="GPU instance prices and their preemption risk.")

Gpu = typer.Option(None, help="Only this accelerator (A100, L4, H100, ...), or this many on one instance (H100:8).")


def gpu_shape(gpu: str | None) -> tuple[str | None, int | None]:
    """--gpu as a spec's accelerators write it: A100 (any count) or A100:8 (eight on one instance), which was an
    unknown accelerator."""
    if not gpu:
        return None, None
    name, _, count = gpu.partition(":")
    if count and not count.isdigit():
        raise BrokerError(f"--gpu: the count in {gpu!r} is a whole number, as in H100:8")
    return lookup(name).name, int(count) if count else None


Cloud = typer.Option(None, help="Only this cloud (aws, gcp, azure).")
Region = typer.Option(None, help="Only this region.")
Limit = typer.Option(20, min=0, help="Rows to show (0 for all).")


def known_place(catalog, cloud: str | None, region: str | None) -> None:
    """A --cloud or --region that names no row of the catalog is a typo: one line with the nearest names, not an
    empty table."""
    import difflib

    for option, value, column in (("--cloud", cloud and cloud.lower(), "cloud"), ("--region", region, "region")):
        names = sorted(set(catalog.rows[column]))
        if value is not None and value not in names:
            close = difflib.get_close_matches(value, names, n=3)
            more = ", ..." if len(names) > 6 else ""
            hint = f"did you mean {', '.join(close)}?" if close else f"there are {', '.join(names[:6])}{more}"
            raise BrokerError(f"{option}: no prices in {column} {value!r}; {hint}")


@prices_app.callback(invoke_without_command=True)
@user_errors
def prices(
    ctx: typer.Context,
    gpu: str | None = Gpu,
    cloud: str | None = Cloud,
    region: str | None = Region,
    spot: bool = typer.Option(False, "--spot", help="Only rows with a spot price, cheapest spot first."),
    limit: int = Limit,
    as_json: bool = JsonOpt,
) -> None:
    """Show GPU instance prices: on-demand and spot, with the interruption band."""

    from broker.app import render_prices

    if ctx.invoked_subcommand:
        return
    catalog = make_broker(live=True).catalog  # refreshed prices and their age
    known_place(catalog, cloud, region)
    name, count = gpu_shape(gpu)
    rows = catalog.table(gpu=name, count=count, cloud=cloud, region=region, spot_only=spot)
    shown = rows.head(limit) if limit else rows
    print_json(render_prices.prices_records(shown)) if as_json else out.print(
        render_prices.prices_table(shown, total=len(rows))
    )


@prices_app.command("risk")
@user_errors
def risk(
    gpu: str | None = Gpu,
    cloud: str | None = Cloud,
    region: str | None = Region,
    limit: int = Limit,
    as_json: bool = JsonOpt,
) -> None:
    """Preemption hazard per spot instance type and region: lambda per hour, its 90% band, availability, evidence;
    and the market model quotes are simulated on: mean up/down spells, P(launch now), hazard by run age."""

    from broker.app import render_prices

    broker = make_broker(live=True)  # preemptions our agents saw count as evidence
    known_place(broker.catalog, cloud, region)
    name, count = gpu_shape(gpu)
    rows = broker.catalog.table(gpu=name, count=count, cloud=cloud, region=region, spot_only=True)
    rows = rows.drop_duplicates(["cloud", "region", "instance_type"])
    records = []
    spot = {(o.cloud, o.region, o.instance_type): o for o in broker.catalog.offers if o.tier == Tier.spot}
    model = broker.market_now()  # the traces and the spot capacity our fleet had lately
    for row in rows.itertuples(index=False):
        h = broker.catalog.hazard.spot(row.cloud, row.region, row.instance_type)
        market = model.for_offer(spot[(row.cloud, row.region, row.instance_type)])
        records.append(
            {
                "cloud": row.cloud,
                "region": row.region,
                "instance_type": row.instance_type,
                "gpus": f"{row.accelerator_count}x {row.accelerator}",
                "hazard_per_h": h.per_hour,
                "low": h.low,
                "high": h.high,
                "availability": h.availability,
                "band": h.band,
                "evidence": h.source,
                "mean_up_h": round(market.mean_up_h, 3),
                "mean_down_h": round(market.mean_down_h, 3),
                "p_launch_now": round(market.p_launch, 4),
                "hazard_by_age_per_h": [round(rate, 4) for _, _, rate in market.hazard_by_age()],
                "market_evidence": market.evidence,
            }
        )
    records.sort(key=lambda r: (-("observed" in r["evidence"]), r["hazard_per_h"]))
    shown = records[:limit] if limit else records
    print_json(shown) if as_json else out.print(render_prices.risk_table(shown, total=len(records)))


@prices_app.command("import")
@user_errors
def import_prices(
    path: Path = typer.Argument(
        ...,
        help="AWS spot price history (.tsv: az_id, type, product, usd, time) or a catalog CSV (AWS vms.csv format).",
    ),
    at: str | None = typer.Option(
        None, help="When a catalog CSV's prices were seen (ISO time); required for CSVs, which carry no time."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Add recorded prices to the price history (only changes are stored)."""

    import pandas as pd

    from broker.pricing.points import points_from_rows, points_from_spot_tsv
    from broker.pricing.refresh import one_line
    from broker.pricing.snapshot import AWS_COLUMNS, load_aws
    from broker.store.prices import PriceHistory

    if not path.is_file():
        raise BrokerError(f"path: no file {path}; give an AWS spot price history .tsv or a catalog .csv")
    if path.suffix not in (".tsv", ".csv"):
        raise BrokerError(
            f"path: {path.name} is neither an AWS spot price history (.tsv) nor a catalog (.csv); give one of those"
        )
    tsv = "an AWS spot price history .tsv (az_id, type, product, usd, time)"
    kind = tsv if path.suffix == ".tsv" else f"a catalog CSV with the columns {', '.join(AWS_COLUMNS)}"
    if path.suffix == ".csv":  # its shape before --at: a file of another shape was refused for --at first
        try:
            header = list(pd.read_csv(path, nrows=0).columns)
        except (ValueError, pd.errors.ParserError):  # no columns at all (an empty file is pandas' EmptyDataError)
            header = []
        if missing := [column for column in AWS_COLUMNS if column not in header]:
            raise BrokerError(f"path: {path.name} is not {kind} (it lacks {', '.join(missing)})")
        if at is None:
            raise BrokerError(
                f"--at: {path.name} has no times in it; say when its prices were seen, e.g. --at 2025-06-01"
            )
    try:
        seen = parse_deadline(at, datetime.now(UTC)) if at is not None else None
    except ValueError as error:
        raise BrokerError(f"--at: {error}") from None
    try:  # a file of another shape fails its parse somewhere: the user is told what shape it must have
        if path.suffix == ".tsv":
            points = points_from_spot_tsv(path)
        else:
            points = points_from_rows(load_aws(path), seen)
    except (KeyError, ValueError, TypeError, pd.errors.ParserError) as error:
        raise BrokerError(f"path: {path.name} is not {kind} ({type(error).__name__}: {one_line(error)})") from None
    if points.empty:  # an empty file, or an export of other products only: nothing recorded is not a success
        what = "Linux/UNIX spot prices" if path.suffix == ".tsv" else "prices"
        raise BrokerError(f"path: {path.name} has no {what} in it; give {kind}")
    prices = PriceHistory(make_broker().store)
    appended = prices.record(points)
    prices.mark_refreshed(f"file:{path.name}", datetime.now(UTC))
    result = {"file": str(path), "points": len(points), "appended": appended, "offers": points["offer"].nunique()}
    print_json(result) if as_json else out.print(
        f"{path.name}: {appended} price changes of {result['offers']} offers recorded ({len(points)} points read)"
    )


@prices_app.command("history")
@user_errors
def price_history(
    instance: str = typer.Option(..., help="Instance type, e.g. p3.2xlarge."),
    zone: str | None = typer.Option(None, help="Only this zone (AWS zone ID such as use1-az1) or region."),
    tier: str = typer.Option("spot", help="spot or on_demand."),
    as_json: bool = JsonOpt,
) -> None:
    """Recorded price changes of an instance type: a table and a sparkline per zone."""

    from broker.app import render_prices
    from broker.store.prices import PriceHistory

    if tier not in ("spot", "on_demand"):
        raise BrokerError(f"--tier: {tier!r} is not a tier with prices; give spot or on_demand")
    broker = make_broker()
    prices = PriceHistory(broker.store)
    recorded = prices.offers()
    types = set(broker.catalog.rows["instance_type"]) | {o.split("/")[2] for o in recorded}
    if instance not in types:
        close = difflib.get_close_matches(instance, sorted(types), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "`broker prices` lists them"
        raise BrokerError(f"--instance: no instance type {instance!r} in the catalog or the history; {hint}")
    region_of = {o.zone: o.region for o in broker.catalog.offers}
    wanted = [
        o
        for o in recorded
        if o.split("/")[2] == instance
        and o.endswith(f"/{tier}")
        and (zone is None or zone in (o.split("/")[1], region_of.get(o.split("/")[1])))
    ]
    if not wanted:
        raise BrokerError(
            f"--instance: no recorded {tier} prices for {instance}{' in ' + zone if zone else ''}; "
            "run `broker prices refresh` or `broker prices import FILE`"
        )
    series = {o: prices.series(o) for o in wanted}
    if as_json:
        print_json(
            {o: [{"at": at.isoformat(), "usd": usd} for at, usd in zip(s["at"], s["usd"])] for o, s in series.items()}
        )
        return
    out.print(render_prices.history_table(series, datetime.now(UTC)))


@prices_app.command("refresh")
@user_errors
def refresh_prices(
    cloud: list[str] = typer.Option(["aws", "gcp", "azure"], help="Which live sources to ask (aws, gcp, azure)."),
    region: list[str] | None = typer.Option(None, help="Only these regions (default: every region in the catalog)."),
    as_json: bool = JsonOpt,
) -> None:
    """Fetch live prices and record the changes; without credentials the snapshot stays and says so."""

    from broker.pricing.aws import AwsPrices
    from broker.pricing.azure import AzurePrices
    from broker.pricing.gcp import GcpPrices
    from broker.pricing.refresh import refresh
    from broker.store.prices import PriceHistory

    broker = make_broker()
    known = {c: set(broker.catalog.rows.loc[broker.catalog.rows.cloud == c, "region"]) for c in ("aws", "gcp", "azure")}
    builders = {
        "aws": lambda: AwsPrices(sorted(region or known["aws"])),
        "gcp": lambda: GcpPrices(sorted(region or known["gcp"])),
        "azure": lambda: AzurePrices(
            sorted(region or known["azure"]), _azure_types(broker.catalog.rows), *_azure_login()
        ),
    }
    unknown = [c for c in cloud if c not in builders]
    if unknown:
        raise BrokerError(f"--cloud: no live source for {', '.join(unknown)} yet; choose from {', '.join(builders)}")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    sources = [builders[c]() for c in cloud]
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=True) as bar:
        task, asked = bar.add_task("prices", total=len(sources)), []

        def progress(name: str) -> None:
            bar.update(task, completed=len(asked), description=f"asking {name} for prices")
            asked.append(name)

        reports = refresh(sources, PriceHistory(broker.store), known, datetime.now(UTC), progress)
    failed = [r["source"] for r in reports if r["status"] == "failed"]
    if as_json:
        print_json(reports)
    else:
        _print_refresh(reports)
    if failed:
        raise BrokerError(f"prices refresh: {', '.join(failed)} failed (above); check the network and retry")


def _print_refresh(reports: list[dict]) -> None:
    for r in reports:
        skipped = ", ".join(f"{n} {why}" for why, n in r["skipped"].items()) or "none"
        out.print(
            r["message"]
            if r["status"] != "ok"
            else f"{r['source']}: {r['rows']} rows, {r['recorded']} price changes recorded; skipped: {skipped}"
            + (f"\n  {r['message']}" if r["message"] else "")
        )


def _azure_types(rows) -> dict[str, dict]:
    """The catalog's Azure VM sizes and their GPUs (the SKU API gives a GPU count, not the model)."""
    azure = rows[rows.cloud == "azure"].drop_duplicates("instance_type")
    return {
        r.instance_type: {
            "accelerator": r.accelerator,
            "accelerator_count": r.accelerator_count,
            "vcpus": r.vcpus,
            "memory_gb": r.memory_gb,
        }
        for r in azure.itertuples(index=False)
    }


def _azure_login() -> tuple:
    """(credential, subscription) from azure-identity's chain when a subscription is configured, else (None, None)."""
    import os

    if not os.environ.get("AZURE_SUBSCRIPTION_ID"):
        return None, None
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential(), os.environ["AZURE_SUBSCRIPTION_ID"]
