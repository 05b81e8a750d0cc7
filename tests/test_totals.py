"""The totals kept beside the jobs (store/totals.py): what the server's metrics show of a store with a long history
and a long queue without reading them, equal at every step to the sums over every stored job without a run under
way."""

from datetime import UTC, datetime, timedelta

import pytest
import redis
from seeded_jobs import seed_jobs

from broker.domain.model import JobState, Run
from broker.store import evidence, totals
from broker.store.jobs import Store


def summed(store):
    """The totals as every stored job without a run under way gives them: the truth the counters must keep."""
    settled = [job for job in store.list_jobs() if job.current_run is None]
    counts = {state: sum(job.state == state for job in settled) for state in JobState}
    return counts, sum(job.cost_usd for job in settled), sum(job.on_demand_usd(job.updated_at) for job in settled)


def kept(store):
    counted, _ = store.totals_and_running()
    return counted.jobs, pytest.approx(counted.spend_usd), pytest.approx(counted.on_demand_usd)


def test_totals_follow_every_change_and_a_scrape_reads_only_the_jobs_with_a_run_under_way(
    redis_url, catalog, monkeypatch
):
    live, demo = Store(redis_url), Store(redis_url, prefix="demo:")
    seed_jobs(live, catalog)  # three ended jobs with runs, one cancelled, one waiting
    for job in seed_jobs(demo, catalog)["jobs"]:
        demo.redis.delete(demo.key("job", job.id))
        demo.add_job(job.model_copy(update={"id": f"demo-{job.id}"}))
    read, real = [], Store.jobs_by_id
    monkeypatch.setattr(Store, "jobs_by_id", lambda self, ids: read.extend(ids) or real(self, ids))
    first = kept(live)
    assert read == [] and first == summed(live) and (first[0][JobState.done], first[0][JobState.queued]) == (2, 1)
    now = datetime.now(UTC)
    run = Run(fence=1, agent="a1", offer=live.get_job("migrated").runs[0].offer, dispatched_at=now)
    live.update_job("waiting", lambda j: j.model_copy(update={"state": JobState.running, "runs": [run], "fence": 1}))
    counted, running = live.totals_and_running()  # a run under way: read as it is, out of the counters
    assert [j.id for j in running] == ["waiting"] and kept(live) == summed(live) and kept(live)[0][JobState.queued] == 0
    ended = run.model_copy(update={"ended_at": now + timedelta(hours=1), "cost_usd": 0.7, "end_reason": "cancelled"})
    live.update_job("waiting", lambda j: j.model_copy(update={"state": JobState.cancelled, "runs": [ended]}))
    read.clear()
    after = kept(live)
    assert read == [] and after == summed(live) and after[0][JobState.cancelled] == 2
    assert after[1] == pytest.approx(first[1].expected + 0.7)  # with what its run cost
    everything = ["demo-migrated", "demo-late", "demo-crashed", "demo-stopped", "demo-waiting"]
    assert live.publish_jobs(demo, everything, tag="demo") == 4  # the one waiting is not copied
    assert kept(live) == summed(live) and kept(live)[0][JobState.done] == 4
    assert live.publish_jobs(demo, ["demo-late"], tag="demo") == 1  # the other copies go, with their part
    assert kept(live) == summed(live) and kept(live)[0][JobState.done] == 3
    assert kept(live)[0][JobState.failed] == 1


def test_a_store_from_before_the_totals_is_counted_once_and_a_job_ending_meanwhile_once(
    redis_url, catalog, monkeypatch
):
    store = Store(redis_url)
    seed_jobs(store, catalog)
    store.redis.delete(store.key(totals.KEY))  # written before the counters existed
    lists, real = [], Store.list_jobs

    def meanwhile(self, *args, **kwargs):  # a job ends (and is counted) after the count has read the jobs
        jobs = real(self, *args, **kwargs)
        if not lists:
            store.set_state("waiting", JobState.failed, datetime.now(UTC))
        lists.append(len(jobs))
        return jobs

    monkeypatch.setattr(Store, "list_jobs", meanwhile)
    counted = kept(store)
    assert lists == [5, 5]  # the count started again
    monkeypatch.setattr(Store, "list_jobs", real)
    assert counted == summed(store) and counted[0][JobState.failed] == 2
    assert kept(store) == counted and lists == [5, 5]  # counted once
    assert kept(Store(redis_url, prefix="empty:"))[0] == dict.fromkeys(JobState, 0)  # nothing to count, nothing kept
    assert Store(redis_url, prefix="empty:").redis.keys("empty:*") == []


def test_a_store_that_starts_empty_never_counts_its_jobs_again(redis_url, catalog, monkeypatch):
    lists, real = [], Store.list_jobs
    monkeypatch.setattr(Store, "list_jobs", lambda self, *a, **k: lists.append(self.prefix) or real(self, *a, **k))
    store = Store(redis_url, prefix="new:")
    for _ in range(2):  # and again once the store is cleared
        store.clear_namespace()
        seed_jobs(store, catalog)  # the first job started the counters as counted: no job came before it
        assert kept(store)[0][JobState.done] == 2 and evidence.seen(store) != {} and lists == []
    monkeypatch.setattr(Store, "list_jobs", real)
    assert kept(store) == summed(store)


def test_two_first_jobs_of_an_empty_store_at_once_are_both_counted(redis_url, catalog, monkeypatch):
    ours, theirs = Store(redis_url), Store(redis_url)  # two processes
    done, crashed = (j for j in seed_jobs(Store(redis_url, prefix="src:"), catalog)["jobs"][1:3])
    real, landed = redis.client.Pipeline.watch, []

    def watch(self, *names):  # their first job lands after ours found the store empty
        if names == (ours.key("jobs"),) and not landed:
            landed.append("theirs")  # before: their add_job watches the same index
            landed.append(theirs.add_job(crashed))
        return real(self, *names)

    monkeypatch.setattr(redis.client.Pipeline, "watch", watch)
    assert ours.add_job(done) and landed == ["theirs", True] and theirs.job_count() == 2
    assert kept(ours) == summed(ours) and kept(ours)[0][JobState.failed] == 1
