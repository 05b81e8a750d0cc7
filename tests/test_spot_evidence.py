"""Our agents' spot evidence (store/evidence.py): counted in the transaction that ends a run, once, and read without
reading the jobs, on a real Redis."""

from datetime import timedelta

import pytest
from dispatch_system import quick_spec

from broker.agents.notices import watcher
from broker.domain.model import JobState, Tier
from broker.store import evidence
from broker.store.jobs import Store


def _as_pairs(jobs):
    """Per market, (preemptions, hours) of every job's market runs, counted here from the jobs."""
    found = {}
    for run in (run for job in jobs for run in job.market_runs()):
        market = (run.offer.cloud, run.offer.region, run.offer.instance_type)
        preemptions, hours = found.get(market, (0, 0.0))
        found[market] = (preemptions + (run.end_reason == "preempted"), hours + run.hours(run.ended_at))
    return {market: pytest.approx(pair) for market, pair in found.items()}


def _imported(system, job, name, preempted, hours, state=JobState.done, **update):
    """A copy of `job` stored with two ended spot runs of its agent's offer (as an import or a test seeds one)."""
    run = job.runs[-1]
    runs = [
        run.model_copy(
            update={"fence": k, "ended_at": run.dispatched_at + timedelta(hours=hours), "end_reason": reason, **update}
        )
        for k, reason in enumerate(("preempted" if preempted else "finished", "finished"), 1)
    ]
    assert system.store.add_job(job.model_copy(update={"id": name, "runs": runs, "fence": 2, "state": state}))


def test_a_spot_run_is_counted_once_when_it_ends_and_the_counters_equal_every_jobs_evidence(system, monkeypatch):
    system.agent("spot-a", notices=watcher("aws=http://127.0.0.1:9"))  # on its cloud's instance: evidence
    jobs = [system.broker.submit(quick_spec()) for _ in range(2)]
    assert evidence.seen(system.store) == {}  # nothing yet: counted from here on as runs end
    system.drive(lambda: all(system.job(j.id).state == JobState.done for j in jobs))
    done = system.job(jobs[0].id)
    assert done.runs[-1].offer.tier == Tier.spot and done.market_runs()
    repeat = {"agent": "spot-a", "job": done.id, "fence": done.fence, "type": "exited", "data": {"reason": "preempted"}}
    assert system.server.apply([repeat]) is None  # a repeated report changes nothing and counts nothing
    _imported(system, done, "imported", preempted=True, hours=2.0, state=JobState.queued)  # runs again: written
    system.drive(lambda: system.job("imported").state == JobState.done)  # thrice more, its ended runs with it
    _imported(system, done, "local", preempted=True, hours=3.0, on_cloud=False)  # a local stand-in's: not evidence
    demo = done.model_copy(update={"tags": ["demo"]})
    _imported(system, demo, "demo-copy", preempted=True, hours=5.0)
    counted = evidence.seen(system.store)
    assert counted == _as_pairs(system.store.list_jobs())
    (market,) = counted
    assert counted[market][0] == 1 and 4.0 < counted[market][1] < 4.01  # the import's runs, the agent's three

    read = []
    monkeypatch.setattr(Store, "jobs_by_id", lambda self, ids: read.append(ids) or [])
    assert evidence.seen(system.store) == counted and read == []  # read without the jobs


def test_a_store_from_before_the_counters_is_tallied_once_and_a_run_ending_meanwhile_is_counted_once(
    system, monkeypatch
):
    system.agent("spot-a", notices=watcher("aws=http://127.0.0.1:9"))
    job = system.broker.submit(quick_spec())
    system.drive(lambda: system.job(job.id).state == JobState.done)
    _imported(system, system.job(job.id), "older", preempted=True, hours=2.0)
    system.store.redis.delete("broker:spot-evidence")  # a store written before the counters existed
    lists, real = [], Store.list_jobs

    def meanwhile(self, *args, **kwargs):  # a run ends (and is counted) after the tally has read the jobs
        jobs = real(self, *args, **kwargs)
        if not lists:
            _imported(system, system.job(job.id), "newer", preempted=False, hours=1.0)
        lists.append(len(jobs))
        return jobs

    monkeypatch.setattr(Store, "list_jobs", meanwhile)
    counted = evidence.seen(system.store)
    assert lists == [2, 3]  # the tally started again, with the newer job
    monkeypatch.setattr(Store, "list_jobs", real)
    assert counted == _as_pairs(system.store.list_jobs())
    assert evidence.seen(system.store) == counted and lists == [2, 3]  # tallied once
