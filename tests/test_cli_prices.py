"""`broker prices`: the price table, the preemption risk behind it and its evidence, as a user reads them."""

import json
from datetime import UTC

from test_cli import job_file, run

from broker.domain.specfile import load_spec
from conftest import NOW


def test_prices_filters_by_gpu_cloud_and_spot(env):
    result = run("prices", "--gpu", "a100", "--cloud", "gcp", "--spot", "--limit", "0", "--json")
    rows = json.loads(result.stdout)
    assert rows and {r["accelerator"] for r in rows} == {"A100"} and {r["cloud"] for r in rows} == {"gcp"}
    spot = [r["spot_usd_per_h"] for r in rows]
    assert spot == sorted(spot)


def test_each_price_row_names_its_offer_ids_for_broker_agent(env, catalog):
    rows = json.loads(run("prices", "--limit", "0", "--json").stdout)
    for row in rows:  # one an agent takes as --offer: its tier's price, and none for a tier without one
        for tier in ("on_demand", "spot"):
            named = row[f"{tier}_offer_id"]
            assert (named is None) == (row[f"{tier}_usd_per_h"] is None), row
            assert named is None or catalog.offer(named).price_usd_per_h == row[f"{tier}_usd_per_h"], row
    assert any(r["spot_offer_id"] for r in rows) and any(r["spot_offer_id"] is None for r in rows)


def test_prices_of_a_shape_as_a_spec_writes_it(env):
    """`--gpu H100:8`, as a spec's accelerators say it, was an unknown accelerator."""
    rows = json.loads(run("prices", "--gpu", "h100:8", "--limit", "0", "--json").stdout)
    assert rows and {(r["accelerator"], r["accelerator_count"]) for r in rows} == {("H100", 8)}
    risk = json.loads(run("prices", "risk", "--gpu", "H100:8", "--limit", "0", "--json").stdout)
    assert risk and all(r["gpus"] == "8x H100" for r in risk)
    result = run("prices", "--gpu", "H100:eight")
    assert result.exit_code == 2 and "--gpu: the count in 'H100:eight' is a whole number" in result.stderr


def test_prices_with_an_unknown_gpu_suggests_names(env):
    result = run("prices", "--gpu", "H1000")
    assert result.exit_code == 2 and "did you mean H100" in result.stderr


def test_prices_in_a_cloud_or_region_with_no_prices_is_one_line_with_the_nearest_names(env):
    """A typo printed an empty table ("0 of 0 instance prices"), as if there were no GPUs there."""
    for command in (["prices"], ["prices", "risk"]):
        result = run(*command, "--region", "us-eats-1")
        assert (
            result.exit_code == 2
            and "--region: no prices in region 'us-eats-1'; did you mean us-east-1" in result.stderr
        )
        result = run(*command, "--cloud", "oracle")
        assert (
            result.exit_code == 2
            and "--cloud: no prices in cloud 'oracle'; there are aws, azure, gcp\n" in result.stderr
        )
    assert run("prices", "--cloud", "AWS", "--region", "us-east-1").exit_code == 0


def test_prices_risk_shows_lambda_its_band_and_the_evidence(env):
    rows = json.loads(run("prices", "risk", "--gpu", "V100", "--cloud", "aws", "--limit", "0", "--json").stdout)
    traced = [r for r in rows if r["instance_type"] == "p3.2xlarge" and r["region"] == "us-east-1"]
    assert traced and "observed" in traced[0]["evidence"] and traced[0]["availability"] < 1
    assert all(r["low"] < r["hazard_per_h"] < r["high"] for r in rows)
    assert "90% band" in run("prices", "risk", "--gpu", "V100").stdout


def test_price_tables_fit_80_columns_whole_with_the_evidence_in_notes_below(env):
    import pandas as pd
    from rich.console import Console

    from broker.app import render_prices

    rows = json.loads(run("prices", "risk", "--gpu", "V100", "--cloud", "aws", "--limit", "0", "--json").stdout)
    prices = json.loads(run("prices", "--gpu", "V100", "--json").stdout)
    console = Console(width=80, record=True)
    console.print(render_prices.risk_table(rows, total=len(rows)))
    shown = console.export_text()
    assert "90% band" in shown and "…" not in shown and max(map(len, shown.splitlines())) <= 80, shown
    traced = next(r for r in rows if r["instance_type"] == "p3.2xlarge" and r["region"] == "us-east-1")
    line = next(row for row in shown.splitlines() if row.split()[1:3] == ["us-east-1", "p3.2xlarge"])
    note = next(row for row in shown.splitlines() if row.startswith(line.split()[-1]))  # "[n] hazard: ..."
    assert note.split()[2:4] == traced["evidence"].split()[:2], shown  # "296 preemptions"
    console = Console(width=80, record=True)
    console.print(render_prices.prices_table(pd.DataFrame(prices), total=len(prices)))
    shown = console.export_text()
    assert "…" not in shown and max(map(len, shown.splitlines())) <= 80 and "on-demand" in shown, shown


def test_preemptions_our_agents_saw_move_the_hazard(env, tmp_path):
    from datetime import datetime, timedelta

    from broker.app.cli.common import make_broker
    from broker.domain.model import Job, Run

    broker = make_broker(live=True)
    before = broker.catalog.hazard.spot("aws", "ap-south-1", "g6.xlarge")
    spec = load_spec(job_file(tmp_path), datetime.now(UTC))  # quote() prices against the wall clock
    offer = next(
        o
        for o in broker.catalog.offers
        if o.instance_type == "g6.xlarge" and o.region == "ap-south-1" and o.tier.value == "spot"
    )
    runs = [
        Run(
            fence=k,
            agent="a",
            offer=offer,
            dispatched_at=NOW,
            started_at=NOW,
            ended_at=NOW + timedelta(hours=1),
            end_reason="preempted",
        )
        for k in range(1, 21)
    ]
    broker.store.add_job(
        Job(id="seen", spec=spec, submitted_at=NOW, updated_at=NOW, quote=broker.quote(spec), runs=runs)
    )
    after = make_broker(live=True).catalog.hazard.spot("aws", "ap-south-1", "g6.xlarge")
    assert after.per_hour > before.per_hour and "20 preemptions in 20 h observed" in after.source
