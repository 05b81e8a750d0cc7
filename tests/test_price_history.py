"""Price history in Redis: only changes are stored, imports, the catalog's newest prices, the CLI."""

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from broker.app.cli.main import app
from broker.pricing.points import points_from_rows, points_from_spot_tsv
from broker.store.prices import PriceHistory

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "prices"
TSV = SHARED / "aws_spot_price_history_2022-05-31.tsv"
T0 = datetime(2025, 7, 1, tzinfo=UTC)


def points(*rows):
    return pd.DataFrame(rows, columns=["offer", "usd", "at"])


def test_only_changes_are_appended_and_a_repeat_writes_nothing(store):
    history = PriceHistory(store)
    first = points(
        ("aws/use1-az1/p3.2xlarge/spot", 0.9, T0),
        ("aws/use1-az1/p3.2xlarge/spot", 0.9, T0 + timedelta(hours=1)),
        ("aws/use1-az1/p3.2xlarge/spot", 1.1, T0 + timedelta(hours=2)),
    )
    assert history.record(first) == 2
    assert history.record(first) == 0
    assert history.record(points(("aws/use1-az1/p3.2xlarge/spot", 0.95, T0 + timedelta(hours=3)))) == 1
    series = history.series("aws/use1-az1/p3.2xlarge/spot")
    assert list(series["usd"]) == [0.9, 1.1, 0.95] and series["at"].is_monotonic_increasing
    assert history.latest()["aws/use1-az1/p3.2xlarge/spot"] == (0.95, T0 + timedelta(hours=3))


@pytest.mark.skipif(not TSV.exists(), reason="shared price data not here")
def test_the_aws_spot_export_imports_as_history(store):
    raw = pd.read_csv(TSV, sep="\t", header=None)
    linux = raw[raw[2] == "Linux/UNIX"]
    pts = points_from_spot_tsv(TSV)
    assert len(pts) == len(linux) and pts["at"].min().year == 2022
    appended = PriceHistory(store).record(pts)
    distinct = linux.sort_values(4).groupby([0, 1])[3].apply(lambda s: int((s != s.shift()).sum())).sum()
    assert appended == distinct


def test_the_catalog_takes_newer_recorded_prices_and_keeps_older_ones_as_history(store, catalog):
    history = PriceHistory(store)
    row = catalog.rows[(catalog.rows.instance_type == "p3.2xlarge") & (catalog.rows.zone == "use1-az1")]
    history.record(points_from_rows(row.assign(spot_usd_per_h=0.5), T0))
    history.record(points(("aws/use1-az2/p3.2xlarge/spot", 9.99, datetime(2022, 5, 31, tzinfo=UTC))))
    live = catalog.with_history(history.latest())
    assert live.by_id["aws/use1-az1/p3.2xlarge/spot"].price_usd_per_h == 0.5
    assert (
        live.by_id["aws/use1-az2/p3.2xlarge/spot"].price_usd_per_h
        == catalog.by_id["aws/use1-az2/p3.2xlarge/spot"].price_usd_per_h
    )
    table = live.table(gpu="V100", cloud="aws", spot_only=True)
    assert table[table.zone == "use1-az1"].as_of.iloc[0].startswith("live 2025-07-01")
    assert table[table.zone == "use1-az2"].as_of.iloc[0].startswith("snapshot")


def test_cli_import_and_history_with_a_sparkline(redis_url, monkeypatch, tmp_path):
    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    runner = CliRunner()
    csv = tmp_path / "vms.csv"
    header = (
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,"
        "Price,SpotPrice,Region,AvailabilityZone\n"
    )
    csv.write_text(header + "p3.2xlarge,V100,1.0,8.0,61.0,{},3.06,0.41,us-east-1,use1-az1\n")
    refused = runner.invoke(app, ["prices", "import", str(csv)])
    assert refused.exit_code == 2 and "--at" in refused.output
    refused = runner.invoke(app, ["prices", "import", str(csv), "--at", "yesterday"])
    assert refused.exit_code == 2 and refused.output.startswith("error: --at: 'yesterday' is not a time")
    for at, spot in (("2025-07-01", "0.41"), ("2025-08-01", "0.52"), ("2025-09-01", "0.47")):
        csv.write_text(header + f"p3.2xlarge,V100,1.0,8.0,61.0,{{}},3.06,{spot},us-east-1,use1-az1\n")
        assert runner.invoke(app, ["prices", "import", str(csv), "--at", at]).exit_code == 0
    body = json.loads(runner.invoke(app, ["prices", "history", "--instance", "p3.2xlarge", "--json"]).stdout)
    assert [p["usd"] for p in body["aws/use1-az1/p3.2xlarge/spot"]] == [0.41, 0.52, 0.47]
    shown = runner.invoke(app, ["prices", "history", "--instance", "p3.2xlarge"]).stdout
    assert "▁█▄" in shown or "▁█▅" in shown
    from datetime import UTC, datetime

    import pandas as pd
    from rich.console import Console

    from broker.app.render_prices import history_table

    series = {
        offer: pd.DataFrame(points).assign(at=lambda f: pd.to_datetime(f["at"])) for offer, points in body.items()
    }
    console = Console(width=80, record=True)
    console.print(history_table(series, datetime.now(UTC)))
    narrow = console.export_text()  # 80 columns: the offer, its last change and price whole; the rest as it fits
    assert "…" not in narrow and "aws/use1-az1/p3.2xlarge/spot" in narrow and "0.4700" in narrow, narrow
    missing = runner.invoke(app, ["prices", "history", "--instance", "g6.xlarge"])  # in the catalog, not recorded
    assert missing.exit_code == 2 and "broker prices refresh" in missing.output
    typo = runner.invoke(app, ["prices", "history", "--instance", "p3.2xlargee"])
    assert typo.exit_code == 2 and "no instance type 'p3.2xlargee'" in typo.output and "p3.2xlarge" in typo.output
    assert runner.invoke(app, ["prices", "history", "--instance", "p3.2xlarge", "--tier", "spott"]).exit_code == 2
    for where, found in (("use1-az1", True), ("us-east-1", True), ("eu-west-1", False)):  # a zone, or its region
        result = runner.invoke(app, ["prices", "history", "--instance", "p3.2xlarge", "--zone", where, "--json"])
        assert (result.exit_code == 0) == found, (where, result.output)


def test_cli_refresh_without_credentials_keeps_the_snapshot_and_says_so(redis_url, monkeypatch, tmp_path):
    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    result = CliRunner().invoke(app, ["prices", "refresh", "--cloud", "aws"])
    assert result.exit_code == 0 and "no credentials" in result.stdout and "keeping the snapshot" in result.stdout
    wrong = CliRunner().invoke(app, ["prices", "refresh", "--cloud", "oracle"])
    assert wrong.exit_code == 2 and "--cloud: no live source for oracle" in wrong.output


def test_cli_import_of_a_file_of_another_shape_says_what_shape_it_must_have(redis_url, monkeypatch, tmp_path):
    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    runner = CliRunner()
    csv, tsv = tmp_path / "prices.csv", tmp_path / "spot.tsv"
    csv.write_text("zone,price\nuse1-az1,0.41\n")
    tsv.write_text("use1-az1\tp3.2xlarge\tLinux/UNIX\tfree\t2025-07-01T00:00:00Z\n")
    ragged, yml = tmp_path / "ragged.csv", tmp_path / "job.yaml"  # pandas' error for a ragged CSV spans two lines
    ragged.write_text("name: job\nrun: python t.py\nx: 1\ny: [a, b, c]\n")
    yml.write_text("name: job\n")
    shapes = (
        (csv, "is not a catalog CSV with the columns InstanceType"),
        (tsv, "is not an AWS spot"),
        (ragged, "is not a catalog CSV with the columns InstanceType"),
        (yml, "job.yaml is neither an AWS spot price history (.tsv) nor a catalog (.csv)"),
    )
    empty, windows = tmp_path / "empty.tsv", tmp_path / "windows.tsv"  # parsed, but nothing to record
    empty.write_text("")
    windows.write_text("use1-az1\tp3.2xlarge\tWindows\t0.9\t2025-07-01T00:00:00Z\n")
    shapes += ((empty, "empty.tsv has no Linux/UNIX spot prices"), (windows, "windows.tsv has no Linux/UNIX spot"))
    for path, shape in shapes:
        result = runner.invoke(app, ["prices", "import", str(path), "--at", "2025-07-01"])
        assert result.exit_code == 2 and shape in result.output and "internal error" not in result.output
        assert len(result.output.strip().splitlines()) == 1
    result = runner.invoke(app, ["prices", "import", str(csv)])  # its shape first: --at given, it was refused again
    assert result.exit_code == 2 and "csv is not a catalog CSV with the columns InstanceType" in result.output
    result = runner.invoke(app, ["prices", "import", str(csv), "--at", "yesterday"])
    assert result.exit_code == 2 and "is not a catalog CSV" in result.output  # the shape, then the time
