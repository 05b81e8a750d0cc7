"""The ledger (app/ledger.py): every job's figures for the overview and the metrics; an ended job's are kept, the
others read at each call, on a real Redis."""

from datetime import UTC, datetime, timedelta

from broker.app.ledger import Ledger
from broker.domain.model import JobState
from broker.models import accounting
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
