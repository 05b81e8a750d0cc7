"""Forgetting ended jobs (core/retention.py says which and when): a job's record, its place in the jobs index and its
figures go in one transaction, and the counters beside the jobs (totals.py) lose what it added, so every reader
(`broker list`, `cost-report`, the dashboard, the metrics) agrees the store no longer holds it. The market evidence
its runs gave (evidence.py) stays: it is about the clouds, not the job. The log stream of an agent removed before
the same cutoff goes too (up to LOG_MAXLEN batches each; a spot pool's instances come and go under new names), its
jobs' output with it.
"""

from __future__ import annotations

import redis

from broker.domain.model import Job
from broker.store import figures, totals
from broker.store.jobs import Store


def ended_before(store: Store, cutoff: float, start: int, count: int) -> list[Job]:
    """A page of the jobs submitted before `cutoff` (epoch seconds), oldest first, from the `start`th: the only ones
    that may have ended before it."""
    return store.jobs_by_id(store.redis.zrangebyscore(store.key("jobs"), "-inf", f"({cutoff}", start=start, num=count))


def forget(store: Store, jobs: list[Job], leader: str | None = None) -> list[str]:
    """Delete these ended jobs, each only as given (one changed since, or a lost planning lease with `leader`: nothing
    of the batch, for a later pass); returns the ids deleted. One cancelled with its run still under way (its agent's
    exit not yet folded) is left: it is still among the jobs with a run."""
    jobs = [job for job in jobs if job.state.terminal and job.current_run is None]
    if not jobs:
        return []
    watched = [store.key("job", job.id) for job in jobs] + ([store.key("leader")] if leader else [])
    with store.redis.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(*watched)
            if leader is not None and pipe.get(store.key("leader")) != leader:
                return []
            stored = {job.id: job for job in store.jobs_by_id([job.id for job in jobs])}  # read after the watch
            gone = [job for job in jobs if job.id in stored and stored[job.id].updated_at == job.updated_at]
            pipe.multi()
            for job in gone:
                pipe.delete(store.key("job", job.id))
                pipe.zrem(store.key("jobs"), job.id)
                totals.count(pipe, store.key(totals.KEY), job, None)
                figures.track(pipe, store.key(figures.KEY), job, None)
            pipe.execute()
        except redis.WatchError:
            return []
    return [job.id for job in gone]


def forget_logs(store: Store, cutoff: float, count: int) -> list[str]:
    """Delete the log streams of up to `count` agents removed before `cutoff` (epoch seconds) and not registered
    since; returns their ids. One registered again keeps its stream (it is listed again at its next removal)."""
    removed, agents = store.key("removed"), store.key("agents")
    with store.redis.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(agents)  # one registering meanwhile: nothing this pass
            ids = pipe.zrangebyscore(removed, "-inf", f"({cutoff}", start=0, num=count)
            if not ids:
                return []
            back = set(i for i, member in zip(ids, pipe.smismember(agents, ids)) if member)
            pipe.multi()
            for agent_id in ids:
                if agent_id not in back:
                    pipe.delete(store.key("log", agent_id))
            pipe.zrem(removed, *ids)
            pipe.execute()
        except redis.WatchError:
            return []
    return [i for i in ids if i not in back]
