"""The ledger (app/ledger.py): every job's figures for the overview and the metrics; an ended job's are kept, the
others read at each call, on a real Redis."""

from datetime import UTC, datetime, timedelta

import redis

from broker.app.ledger import Ledger
from broker.domain.figures import figures, hours_late
from broker.domain.model import JobState, Run
from broker.store import figures as records
from broker.store.jobs import Store


def test_the_ledger_reads_only_jobs_with_a_run_under_way_and_notices_another_job_under_a_kept_id(
    seeded, store, monkeypatch
):
    """Every job without a run under way has its figures kept beside it by the store, in the transaction that
    changes it: the ledger reads those records, and reads a job only while a run of it is under way."""
    ledger, now = Ledger(store), datetime.now(UTC)
    first = {f.id: f for f in ledger.figures(now)}
    assert first == {job.id: figures(job, now) for job in seeded["jobs"]}
    read, real = [], Store.jobs_by_id
    monkeypatch.setattr(Store, "jobs_by_id", lambda self, ids: read.extend(ids) or real(self, ids))
    assert {f.id: f for f in ledger.figures(now)} == first and read == []  # the one waiting too: from its record
    run = Run(fence=1, agent="a1", offer=seeded["jobs"][0].runs[0].offer, dispatched_at=now, started_at=now)
    store.update_job("waiting", lambda j: j.model_copy(update={"state": JobState.running, "runs": [run], "fence": 1}))
    later = now + timedelta(hours=1)
    running = {f.id: f for f in ledger.figures(later)}["waiting"]  # read as it is: its spend grows with the time
    assert read == ["waiting"] and running == figures(store.get_job("waiting"), later) and running.spend_usd > 0
    ended = run.model_copy(update={"ended_at": later, "cost_usd": 0.7, "end_reason": "cancelled"})
    store.update_job("waiting", lambda j: j.model_copy(update={"state": JobState.cancelled, "runs": [ended]}))
    read.clear()
    shown = {f.id: f for f in ledger.figures(later + timedelta(hours=1))}
    assert read == [] and shown["waiting"].final and shown["waiting"].spend_usd == 0.7
    late = next(job for job in seeded["jobs"] if job.id == "late")
    store.clear_namespace()  # filled again: another job under a kept id is read, the ones gone are dropped
    again = late.model_copy(update={"submitted_at": now, "state": JobState.queued, "runs": [], "fence": 0})
    assert store.add_job(again)
    assert [(f.id, f.state, f.spend_usd) for f in ledger.figures(now)] == [("late", JobState.queued, 0.0)]


def test_a_failed_jobs_kept_figures_count_it_late_once_its_deadline_passes(seeded):
    """A failed job never finished: it misses its deadline when that passes, after its figures were kept."""
    now = datetime.now(UTC)
    crashed = next(job for job in seeded["jobs"] if job.id == "crashed")
    kept = figures(crashed, now)
    later = crashed.spec.deadline + timedelta(hours=2)
    assert kept.final and kept.hours_late(now) == 0
    assert kept.hours_late(later) == hours_late(crashed, later) > 1.99


def test_a_store_from_before_the_records_has_its_ended_jobs_figures_kept_by_the_first_reader(
    seeded, store, monkeypatch
):
    """A store written before the store kept records: the first reader keeps the ended jobs' figures (never a
    waiting job's: the server may change it meanwhile); a ledger of another process (a fresh CLI, the dashboard
    after a restart) reads those records and only the jobs without one, to the same figures."""
    now = datetime.now(UTC)
    store.redis.delete(store.key(records.KEY))
    first = Ledger(store).figures(now)
    assert set(records.read(store, [f.id for f in first])) == {f.id for f in first if f.final} != set()
    read, real = [], Store.jobs_by_id
    monkeypatch.setattr(Store, "jobs_by_id", lambda self, ids: read.extend(ids) or real(self, ids))
    again = Ledger(store).figures(now)
    assert again == first and read == ["waiting"]  # in the index's order, tags and runs as read from the jobs
    assert {f.id: f.tags for f in again} == {job.id: tuple(job.tags) for job in seeded["jobs"]}


def test_a_record_left_from_a_cleared_namespace_is_not_taken_for_the_new_job_under_its_id(seeded, store):
    """A reader that kept `late`'s figures while the namespace was cleared and filled again left them beside a new
    job of that id: the new job's submission time tells them apart, and the job is read."""
    now = datetime.now(UTC)
    old = {f.id: f for f in Ledger(store).figures(now)}["late"]
    store.clear_namespace()
    late = next(job for job in seeded["jobs"] if job.id == "late")
    assert store.add_job(
        late.model_copy(update={"submitted_at": now, "state": JobState.queued, "runs": [], "fence": 0})
    )
    records.keep(store, {"late": old.to_json()})
    assert [(f.id, f.state, f.spend_usd) for f in Ledger(store).figures(now)] == [("late", JobState.queued, 0.0)]


def test_a_reader_that_may_not_write_still_gets_every_jobs_figures(seeded, store, redis_url, caplog):
    """A read-only Redis user (or a read-only replica) keeps no records: the ledger reads the jobs and says why."""
    now = datetime.now(UTC)
    admin = redis.Redis.from_url(redis_url)
    admin.delete(store.key(records.KEY))  # a store from before the records
    admin.acl_setuser("reader", enabled=True, nopass=True, keys=["*"], commands=["+@read", "+@connection"])
    try:
        reader = Store(redis_url.replace("redis://", "redis://reader:x@"))
        shown = Ledger(reader).figures(now)
        assert {f.id: f for f in shown} == {job.id: figures(job, now) for job in seeded["jobs"]}
        assert (
            not admin.exists(store.key(records.KEY)) and "figures not kept (this user has no permissions" in caplog.text
        )
    finally:
        admin.acl_deluser("reader")
