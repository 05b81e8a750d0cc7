"""The dashboard: every page through streamlit.testing on a seeded real Redis, and once in headless Chromium."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from seeded_jobs import offer
from streamlit.testing.v1 import AppTest

from broker import planning
from broker.domain.model import Forecast, Job, Tier
from conftest import ROOT, make_spec

APP = ROOT / "dashboards" / "app.py"


@pytest.fixture
def app(redis_url, monkeypatch):
    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    monkeypatch.setenv("BROKER_PREFIX", "broker:")
    return AppTest.from_file(str(APP), default_timeout=60)


def dollars(text):
    return float(text.replace("$", "").replace(",", ""))


def test_overview_kpis_equal_the_seeded_numbers(app, seeded):
    app.run()
    assert not app.exception
    metrics = {m.label: m.value for m in app.metric}
    assert dollars(metrics["Spend to date"]) == pytest.approx(seeded["spend"], abs=0.01)
    assert dollars(metrics["Savings vs on-demand"]) == pytest.approx(seeded["baseline"] - seeded["spend"], abs=0.01)
    assert metrics["Budget used"] == f"{seeded['budget_used']:.1f}%"
    assert metrics["Deadline misses"] == "1"
    assert (
        metrics["Jobs done"],
        metrics["Jobs failed"],
        metrics["Jobs queued"],
        metrics["Jobs running"],
        metrics["Jobs cancelled"],
    ) == ("2", "1", "1", "0", "1")
    record = [c.value for c in app.caption if c.value.startswith("quotes against what jobs did")]
    assert len(record) == 1 and "2 finished jobs" in record[0] and "1 of 2 deadlines met" in record[0], record


def test_a_sharded_brokers_jobs_are_all_shown(app, redis_url, catalog, monkeypatch, own_caches):
    """With BROKER_SHARDS the jobs live under each shard's keys: the dashboard read the unsharded ones alone and said
    "no jobs yet" of a broker running hundreds."""
    from seeded_jobs import seed_jobs

    from broker.store.shards import ShardedStore

    sharded = ShardedStore(redis_url, "broker:", count=3)
    seeded = seed_jobs(sharded, catalog)
    assert len({sharded.shards.index(sharded.of_job(j.id)) for j in sharded.list_jobs()}) > 1  # spread over shards
    monkeypatch.setenv("BROKER_SHARDS", "3")
    app.run()
    assert not app.exception
    metrics = {m.label: m.value for m in app.metric}
    assert dollars(metrics["Spend to date"]) == pytest.approx(seeded["spend"], abs=0.01)
    app.sidebar.radio[0].set_value("Jobs").run()
    assert not app.exception and len(app.dataframe[0].value) == len(sharded.list_jobs())


def test_jobs_page_lists_every_job_and_shows_a_jobs_runs(app, seeded):
    app.run()
    app.sidebar.radio[0].set_value("Jobs").run()
    assert not app.exception
    table = app.dataframe[0].value
    assert sorted(table["job"]) == sorted(j.id for j in seeded["jobs"])
    migrated = table.set_index("job").loc["migrated"]
    assert migrated["migrations"] == 1 and migrated["tier"] == "on_demand"
    assert migrated["cost so far $"] == pytest.approx(sum(r.cost_usd for r in seeded["jobs"][0].runs), abs=1e-4)
    app.selectbox[0].set_value("migrated").run()
    runs = app.dataframe[1].value
    assert list(runs["end"]) == ["preempted", "finished"] and list(runs["work lost s"]) == [600.0, 0.0]
    odds = next(m for m in app.metric if m.label == "Quoted P(meet deadline)")
    assert odds.value == f"{seeded['jobs'][0].quote.p_meet_deadline:.2f}" and not odds.delta  # as the spec asked
    assert not [m for m in app.metric if m.label.startswith("Outlook")]  # it ended: its cost is known
    verdict = [c.value for c in app.caption if c.value.startswith("against its quote")]
    assert len(verdict) == 1 and "; deadline met, quoted at" in verdict[0], verdict  # as `broker status` says it
    assert not [i for i in app.info if i.value.startswith("waiting")]
    app.selectbox[0].set_value("waiting").run()  # what `broker status` says it waits for (it said nothing)
    assert [i.value for i in app.info] == [
        "waiting: no broker server is running: start `broker server` (or `broker run waiting`)"
    ]
    spent = next(m for m in app.metric if m.label == "Realised so far")
    assert spent.delta == "of the $20.00 budget"  # a capped job's says "(stops there)"
    assert spent.proto.direction == spent.proto.MetricDirection.NONE  # a note: no arrow up as for a rise
    app.selectbox[0].set_value("waiting").run()  # not started: the quote made again now, on the market model
    metrics = {m.label: m for m in app.metric}
    assert dollars(metrics["Outlook cost p50"].value) > 0
    assert float(metrics["Outlook P(meet deadline)"].value) >= 0.95 and not metrics["Outlook P(meet deadline)"].delta


def test_jobs_page_shows_a_quote_whose_odds_fall_short_of_what_was_asked(app, seeded, store):
    waiting = seeded["jobs"][3]
    quote = waiting.quote
    fell_short = Forecast(
        futures=1000,
        rule="hedge",
        zones=[quote.chosen.offer.id],
        cost_p10_usd=1.0,
        cost_p50_usd=2.0,
        cost_p90_usd=3.0,
        cost_mean_usd=2.0,
        finish_p50=None,
        finish_p90=None,
        p_meet_deadline=0.81,
        p_within_budget=1.0,
        spot_share=0.5,
        evidence="",
    )
    short = waiting.model_copy(update={"id": "short", "quote": quote.model_copy(update={"forecast": fell_short})})
    assert store.add_job(short)
    app.run()
    app.sidebar.radio[0].set_value("Jobs").run()
    app.selectbox[0].set_value("short").run()
    odds = next(m for m in app.metric if m.label == "Quoted P(meet deadline)")
    assert odds.value == "0.81" and odds.delta == "-0.14 vs the 0.95 asked"


def test_jobs_page_shows_a_waiting_job_without_a_deadline(app, seeded, store, catalog):
    """No deadline: its quote asks no odds (None), and its outlook has none to be at risk against."""
    now = datetime.now(UTC)
    spec = make_spec(name="open", now=now, resources={"accelerators": ["L4:1"]}, work={"gpu_hours": 1})
    assert spec.deadline is None
    quote = planning.get().quote(spec, [offer(catalog, Tier.spot), offer(catalog, Tier.on_demand)], now)
    assert quote.deadline_probability is None
    assert store.add_job(Job(id="open", spec=spec, submitted_at=now, updated_at=now, quote=quote))
    app.run()
    app.sidebar.radio[0].set_value("Jobs").run()  # the newest job is the one shown first
    assert not app.exception
    outlook = next(m for m in app.metric if m.label == "Outlook P(meet deadline)")
    assert outlook.value == "1.00" and not outlook.delta  # no odds asked: never at risk


def test_jobs_page_shows_the_newest_jobs_of_a_long_history(app, seeded, store):
    shown, waiting, now = 200, seeded["jobs"][3], datetime.now(UTC)  # dashboards/app.py's JOBS_SHOWN
    for i in range(shown):
        later = {"id": f"later-{i:03d}", "submitted_at": now + timedelta(seconds=i)}
        assert store.add_job(waiting.model_copy(update=later))
    app.run()
    app.sidebar.radio[0].set_value("Jobs").run()
    assert not app.exception
    assert list(app.dataframe[0].value["job"]) == [f"later-{i:03d}" for i in range(shown)]
    assert f"the newest {shown} of {shown + 5} jobs" in app.caption[0].value


def test_prices_page_shows_the_cheapest_spot_and_on_demand_and_the_hazard(app, redis_url, catalog):
    app.run()
    app.sidebar.radio[0].set_value("Prices and risk").run()
    assert not app.exception
    app.selectbox[0].set_value("A100").run()  # AWS sells A100s 8 to an instance, GCP one: compare per GPU
    cheapest = app.dataframe[0].value
    for cloud in ("aws", "gcp"):
        for tier in (Tier.spot, Tier.on_demand):
            expected = min(
                o.price_usd_per_h / o.accelerator_count
                for o in catalog.offers
                if o.accelerator == "A100" and o.cloud == cloud and o.tier == tier
            )
            assert cheapest.loc[cloud, tier.value] == pytest.approx(expected)
    hazards = app.dataframe[1].value
    assert (hazards["hazard_per_h"] > 0).all() and hazards["hazard_source"].str.contains(
        "advisor|default|observed|regions"
    ).all()
    assert (
        (hazards["hazard_low"] < hazards["hazard_per_h"]) & (hazards["hazard_per_h"] < hazards["hazard_high"])
    ).all()
    first = catalog.by_id[hazards["offer"].iloc[0]]
    assert hazards["hazard_high"].iloc[0] == pytest.approx(
        catalog.hazard.spot(first.cloud, first.region, first.instance_type).high
    )


def test_prices_page_charts_recorded_price_history_and_uses_the_newest_price(app, redis_url, store, catalog):
    from broker.store.prices import PriceHistory

    spot = next(o for o in catalog.offers if o.accelerator == "L4" and o.tier == Tier.spot)
    t0 = datetime(2025, 7, 1, tzinfo=UTC)
    PriceHistory(store).record(
        pd.DataFrame(
            {"offer": [spot.id] * 3, "usd": [0.31, 0.35, 0.29], "at": [t0 + timedelta(days=d) for d in range(3)]}
        )
    )
    app.run()
    app.sidebar.radio[0].set_value("Prices and risk").run()
    app.selectbox[0].set_value("L4").run()
    assert not app.exception
    assert app.selectbox[1].value == spot.id
    assert list(app.dataframe[-1].value["usd"]) == [0.31, 0.35, 0.29]
    hazards = app.dataframe[1].value
    assert hazards.loc[hazards.offer == spot.id, "price_usd_per_h"].iloc[0] == 0.29  # the newest recorded price


def seed_bubbles(store) -> None:
    """A 4-stage main job "llama" with known windows, and fill stats of stage 3."""
    from broker.domain.bubbles import BubbleProfile, FillStats, WindowStats
    from broker.store.profiles import save_fill_stats, save_profile

    measured = datetime(2026, 11, 22, tzinfo=UTC)
    for stage, (fill_drain, fwd_bwd) in enumerate([(0.0, 0.9), (0.3, 0.6), (0.6, 0.3), (0.9, 0.0)]):
        windows = [
            WindowStats(kind=k, offset_s=o, median_s=d, p10_s=d * 0.9, free_bytes=(8 + stage) * 10**9, count=10)
            for k, o, d in (("fill-drain", 2.1 - fill_drain, fill_drain), ("fwd-bwd", 0.5, fwd_bwd))
            if d
        ]
        save_profile(
            store,
            BubbleProfile(
                main_job="llama", stage=stage, device="cpu", iteration_s=2.1, windows=windows, measured_at=measured
            ),
        )
    save_fill_stats(
        store,
        FillStats(
            main_job="llama", stage=3, bubble_s=90.0, fill_s=54.0, iteration_s=2.142, jobs=2, updated_at=measured
        ),
    )


def test_bubbles_page_shows_each_stage_of_a_main_job_with_its_windows(app, redis_url, store, seeded):
    seed_bubbles(store)
    done = seeded["jobs"][0]  # and a job that ran in stage 3's bubbles
    bubble = done.runs[-1].offer.model_copy(update={"tier": Tier.bubble, "zone": "llama.stage3"})
    assert store.add_job(
        done.model_copy(update={"id": "filler", "runs": [done.runs[-1].model_copy(update={"offer": bubble})]})
    )
    app.run()
    app.sidebar.radio[0].set_value("Bubbles").run()
    assert not app.exception
    table = app.dataframe[0].value
    assert list(table["stage"]) == [0, 1, 2, 3]
    assert list(table["bubble fraction"]) == pytest.approx([0.9 / 2.1] * 4)  # (p-1)/(m+p-1) with t_f + t_b = 0.3 s
    assert list(table["free GB"]) == pytest.approx([8, 9, 10, 11])
    assert table["bubble time filled"].iloc[3] == pytest.approx(54 / 90) and pd.isna(
        table["bubble time filled"].iloc[0]
    )
    assert table["main-job slowdown %"].iloc[3] == pytest.approx(100 * (2.142 / 2.1 - 1))
    assert list(table["fill jobs served"]) == [0, 0, 0, 1]


def backtest_dir(tmp_path: Path) -> Path:
    """A small `broker backtest --out DIR` (3 jobs, four policies), as the page reads it."""
    from typer.testing import CliRunner

    from broker.app.cli.main import app as cli

    out = tmp_path / "bt"
    run = CliRunner().invoke(
        cli,
        [
            "backtest",
            "--jobs",
            "3",
            "--tick-minutes",
            "30",
            "--policies",
            "on-demand,costslo+bubbles,hedge+bubbles,omniscient",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert run.exit_code == 0, run.output
    return out


def test_backtest_page_shows_a_backtest_directory_as_written(app, redis_url, tmp_path, monkeypatch):
    out = backtest_dir(tmp_path)
    table = pd.read_csv(out / "policies.csv").set_index("policy")
    monkeypatch.setenv("BROKER_BACKTEST_DIR", str(out))
    app.run()
    app.sidebar.radio[0].set_value("Backtest").run()
    assert not app.exception
    metrics = {m.label: m.value for m in app.metric}
    best = table.loc["hedge+bubbles"]  # the default policy heads the page, not the first that is not a baseline
    assert dollars(metrics["Cost (hedge+bubbles)"]) == pytest.approx(best["cost_usd"], abs=0.01)
    assert metrics["Savings vs all on-demand"] == f"{best['savings_pct']:.1f}%"
    assert metrics["Deadline misses"] == str(int(best["deadline_misses"]))
    assert metrics["Cost / joint bound"] == f"{best['cost_vs_joint_omniscient']:.2f}x"  # the bound of the same run
    assert list(app.dataframe[0].value["policy"]) == [
        "on-demand",
        "costslo+bubbles",
        "hedge+bubbles",
        "omniscient",
        "joint omniscient",
        "joint schedule",
    ]
    app.text_input[0].set_value(str(tmp_path / "nothing")).run()
    assert any("has no policies.csv" in i.value for i in app.info)


@pytest.mark.parametrize("page", ["Overview", "Jobs", "Bubbles", "Backtest"])
def test_empty_pages_say_what_to_do(app, redis_url, page):
    app.run()
    app.sidebar.radio[0].set_value(page).run()
    assert not app.exception
    assert any(("broker submit" in i.value) or ("no " in i.value) for i in app.info)


@pytest.fixture
def own_caches():
    """An app keeps its store for the process, as a live dashboard does: this test's own, and none left after it."""
    import streamlit as st

    st.cache_resource.clear()
    yield st.cache_resource.clear
    st.cache_resource.clear()


def test_a_store_that_cannot_be_read_is_one_message_on_each_page_not_a_traceback(monkeypatch, tmp_path, own_caches):
    """The live pages refresh as fragments, whose errors Streamlit showed as tracebacks: Redis not there at all,
    and Redis gone after the page first read it."""
    from conftest import free_port, start_redis, stop_redis

    proc, port = start_redis(tmp_path)
    monkeypatch.setenv("BROKER_REDIS_URL", f"redis://127.0.0.1:{port}/0")
    monkeypatch.setenv("BROKER_PREFIX", "broker:")
    app = AppTest.from_file(str(APP), default_timeout=60)
    try:
        app.run()
        assert not app.exception and not app.error  # an empty store: "no jobs yet"
    finally:
        stop_redis(proc, port)
    for page in ("Overview", "Jobs"):  # the same store, gone
        app.sidebar.radio[0].set_value(page).run()
        assert not app.exception and "cannot read the store: lost the connection to Redis" in app.error[0].value
    monkeypatch.setenv("BROKER_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    for page in ("Overview", "Jobs", "Prices and risk", "Bubbles"):  # never there: the first read fails
        own_caches()  # not the store of the app above
        fresh = AppTest.from_file(str(APP), default_timeout=60)
        fresh.run()
        fresh.sidebar.radio[0].set_value(page).run()
        assert not fresh.exception and "cannot read the store: redis: cannot reach" in fresh.error[0].value, page
