"""The ledger (app/ledger.py): every job's figures for the overview and the metrics; an ended job's are kept, the
others read at each call, on a real Redis."""

from datetime import UTC, datetime, timedelta

import redis

from broker.app.ledger import Ledger
from broker.domain.model import JobState
from broker.models import accounting
from broker.store import figures as records
from broker.store.jobs import Store


def test_the_ledger_reads_only_jobs_not_yet_ended_and_notices_another_job_under_a_kept_id(seeded, store, monkeypatch):
    ledger, now = Ledger(store), datetime.now(UTC)
    first = {f.id: f for f in ledger.figures(now)}
    assert first == {job.id: accounting.figures(job, now) for job in seeded["jobs"]}
    read, real = [], Store.jobs_by_id
    monkeypatch.setattr(Store, "jobs_by_id", lambda self, ids: read.extend(ids) or real(self, ids))
    assert {f.id: f for f in ledger.figures(now)} == first and read == ["waiting"]
    store.set_state("waiting", JobState.cancelled, now)  # it ends between two calls: read once more, then kept
    assert {f.id: f.state for f in ledger.figures(now)}["waiting"] == JobState.cancelled
    read.clear()
    assert len(ledger.figures(now)) == len(first) and read == []
    late = next(job for job in seeded["jobs"] if job.id == "late")
    store.clear_namespace()  # filled again: another job under a kept id is read, the ones gone are dropped
    again = late.model_copy(update={"submitted_at": now, "state": JobState.queued, "runs": [], "fence": 0})
    assert store.add_job(again)
    assert [(f.id, f.state, f.spend_usd) for f in ledger.figures(now)] == [("late", JobState.queued, 0.0)]


def test_a_failed_jobs_kept_figures_count_it_late_once_its_deadline_passes(seeded):
    """A failed job never finished: it misses its deadline when that passes, after its figures were kept."""
    now = datetime.now(UTC)
    crashed = next(job for job in seeded["jobs"] if job.id == "crashed")
    kept = accounting.figures(crashed, now)
    later = crashed.spec.deadline + timedelta(hours=2)
    assert kept.final and kept.hours_late(now) == 0
    assert kept.hours_late(later) == accounting.hours_late(crashed, later) > 1.99


def test_a_new_process_reads_the_ended_jobs_figures_kept_beside_them_not_the_jobs(seeded, store, monkeypatch):
    """The first reader keeps the ended jobs' figures in the store; a ledger of another process (a fresh CLI, the
    dashboard after a restart) reads those records and only the jobs not yet ended, to the same figures."""
    now = datetime.now(UTC)
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
    admin.acl_setuser("reader", enabled=True, nopass=True, keys=["*"], commands=["+@read", "+@connection"])
    try:
        reader = Store(redis_url.replace("redis://", "redis://reader:x@"))
        shown = Ledger(reader).figures(now)
        assert {f.id: f for f in shown} == {job.id: accounting.figures(job, now) for job in seeded["jobs"]}
        assert (
            not admin.exists(store.key(records.KEY)) and "figures not kept (this user has no permissions" in caplog.text
        )
    finally:
        admin.acl_deluser("reader")
