"""What reads every job's figures besides the dashboard: `broker cost-report`, the metrics scrape, `broker list`."""

import json
from datetime import UTC, datetime

import pytest

from broker.domain.model import JobState


def test_cost_report_splits_each_jobs_spend_by_tier_and_totals_it(seeded, redis_url, monkeypatch):
    from typer.testing import CliRunner

    from broker.app.cli.main import app as cli

    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    rows = {r["job"]: r for r in json.loads(CliRunner().invoke(cli, ["cost-report", "--json"]).stdout)}
    assert set(rows) == {j.id for j in seeded["jobs"]}
    migrated = {j.id: j for j in seeded["jobs"]}["migrated"]
    spot_run, od_run = migrated.runs
    assert rows["migrated"]["spot_usd"] == pytest.approx(spot_run.cost_usd)
    assert rows["migrated"]["on_demand_usd"] == pytest.approx(od_run.cost_usd)
    assert rows["migrated"]["spot_h"] == pytest.approx(2.0) and rows["migrated"]["on_demand_h"] == pytest.approx(1.0)
    assert sum(r["total_usd"] for r in rows.values()) == pytest.approx(seeded["spend"])
    assert sum(r["all_on_demand_usd"] for r in rows.values()) == pytest.approx(seeded["baseline"])
    assert rows["waiting"]["total_usd"] == 0 and rows["waiting"]["saved_pct"] is None
    shown = CliRunner().invoke(cli, ["cost-report"], terminal_width=80)
    total = next(line for line in shown.stdout.splitlines() if line.lstrip().startswith("total"))
    assert f" {seeded['spend']:,.2f} " in total and "…" not in shown.stdout
    done = [j for j in seeded["jobs"] if j.state == JobState.done]  # the quotes' record: their spend against them
    errors = sorted(abs(sum(r.cost_usd for r in j.runs) / j.quote.cost_usd - 1) for j in done)
    assert rows["late"]["quoted_usd"] == pytest.approx(done[1].quote.cost_usd)
    said = " ".join(shown.stdout.split())
    assert f"2 finished jobs cost {100 * sum(errors) / 2:.0f}% off the quote (median)" in said, said
    assert "1 of 2 deadlines met" in said  # "late" finished past it; "crashed" failed: no verdict on the odds
    late = " ".join(CliRunner().invoke(cli, ["status", "late"], terminal_width=120).stdout.split())
    off = sum(r.cost_usd for r in done[1].runs) / done[1].quote.cost_usd - 1  # as `broker status` says it of one job
    verdict = f"against its quote: cost ${sum(r.cost_usd for r in done[1].runs):,.2f}, {abs(off):.0%} "
    assert verdict + ("over" if off > 0 else "under") in late and "; deadline missed, quoted at" in late, late
    assert "against its quote" not in CliRunner().invoke(cli, ["status", "waiting"]).stdout  # not finished
    newest = CliRunner().invoke(cli, ["cost-report", "--limit", "2"], terminal_width=80).stdout  # every job's total
    total = next(line for line in newest.splitlines() if line.lstrip().startswith("total"))
    assert f"total of {len(rows)}" in total and f" {seeded['spend']:,.2f} " in total
    listed = [job.id for job in seeded["jobs"] if job.id in newest.split()]
    assert len(listed) == 2 and f"the newest 2 of {len(rows)} jobs" in " ".join(newest.split())


def test_a_metrics_scrape_shows_the_overviews_figures_and_reads_only_the_jobs_with_a_run_under_way(
    seeded, store, monkeypatch
):
    """The server's Prometheus collector shows the overview's figures; a store keeps every job it ever ran, so a
    scrape reads the other jobs' totals (store/totals.py) and only the jobs with a run under way."""
    from broker.app.metrics import StoreCollector
    from broker.store.jobs import Store

    collector = StoreCollector(store)

    def scraped():
        return {(s.name, s.labels.get("state")): s.value for f in collector.collect() for s in f.samples}

    first = scraped()
    assert first["broker_spend_usd", None] == pytest.approx(seeded["spend"])
    assert first["broker_savings_usd", None] == pytest.approx(seeded["baseline"] - seeded["spend"])
    assert (first["broker_jobs", "done"], first["broker_jobs", "failed"], first["broker_jobs", "queued"]) == (2, 1, 1)
    read, real = [], Store.jobs_by_id
    monkeypatch.setattr(Store, "jobs_by_id", lambda self, ids: read.extend(ids) or real(self, ids))
    assert scraped() == first and read == []  # no job has a run under way: none is read
    store.set_state("waiting", JobState.cancelled, datetime.now(UTC))
    then = scraped()
    assert (then["broker_jobs", "queued"], then["broker_jobs", "cancelled"], then["broker_jobs", "done"]) == (0, 2, 2)
    assert then["broker_spend_usd", None] == pytest.approx(seeded["spend"]) and read == []


def test_broker_list_of_jobs_not_yet_ended_reads_only_those(seeded, redis_url, store, monkeypatch):
    """A store keeps every job it ever ran: `--state` reads the jobs it shows and those with a run under way (the
    others' states are in their figures kept beside them, store/figures.py), not every job."""
    from typer.testing import CliRunner

    from broker.app.cli.main import app as cli
    from broker.store.jobs import Store

    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    waiting, done = seeded["jobs"][3], seeded["jobs"][0]
    under_way = done.runs[-1].model_copy(update={"fence": 1, "ended_at": None, "end_reason": None})
    later = {"id": "busy", "state": JobState.running, "runs": [under_way], "submitted_at": waiting.updated_at}
    assert store.add_job(waiting.model_copy(update=later))
    read, real = [], Store.jobs_by_id
    monkeypatch.setattr(Store, "jobs_by_id", lambda self, ids: read.extend(ids) or real(self, ids))

    def listed(*states):
        read.clear()
        rows = json.loads(CliRunner().invoke(cli, ["list", "--json", *(f"--state={s}" for s in states)]).stdout)
        return [row["id"] for row in rows]

    assert listed("queued") == ["waiting"] and sorted(read) == ["busy", "waiting"]
    assert listed("queued", "running") == ["waiting", "busy"]  # in submission order
    assert sorted(listed("done")) == ["late", "migrated"] and sorted(read) == ["busy", "late", "migrated"]
