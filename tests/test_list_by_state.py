"""`broker list --state`: the newest jobs in some states, found from the figures kept beside the jobs
(store/figures.py) and the jobs with a run under way, not by reading every job a store ever ran, on a real Redis."""

from datetime import UTC, datetime

from broker.app.cli.jobs import newest_jobs
from broker.domain.model import JobState, Run
from broker.store import figures
from broker.store.jobs import Store


def listed(store, states, limit):
    """What the list shows, by reading every job: the truth the records must give."""
    jobs = [job for job in store.list_jobs() if job.state in states]
    return [job.id for job in (jobs[-limit:] if limit else jobs)], len(jobs)


def test_a_listing_by_state_reads_only_the_jobs_it_shows_and_those_with_a_run_under_way(seeded, store, monkeypatch):
    now = datetime.now(UTC)
    run = Run(fence=1, agent="a1", offer=seeded["jobs"][0].runs[0].offer, dispatched_at=now, started_at=now)
    store.update_job("waiting", lambda j: j.model_copy(update={"state": JobState.running, "runs": [run], "fence": 1}))
    figures.keep(store, {"gone": store.redis.hget(store.key(figures.KEY), "late")})  # a record left of another job
    read, real = [], Store.jobs_by_id
    monkeypatch.setattr(Store, "jobs_by_id", lambda self, ids: read.extend(ids) or real(self, ids))
    cases = [({JobState.done}, 1), ({JobState.running}, 50), ({JobState.failed, JobState.cancelled}, 0)]
    for states, limit in cases:
        read.clear()
        jobs, total = newest_jobs(store, states, limit)
        shown, reads = [job.id for job in jobs], sorted(read)
        assert (shown, total) == listed(store, states, limit) and shown, states
        assert reads == sorted({*shown, "waiting"}), states  # the ones shown, and the one running
    store.redis.delete(store.key(figures.KEY))  # a store from before the records: its jobs are read, to the same
    for states, limit in cases:
        read.clear()
        jobs, total = newest_jobs(store, states, limit)
        reads = list(read)
        assert ([job.id for job in jobs], total) == listed(store, states, limit)
        assert "late" in reads and "migrated" in reads or states == {JobState.running}  # all, or those not ended
