"""Every job's figures (domain/figures.py) but those with a run under way, kept beside the jobs, so the readers that
show every job (app/ledger.py) need not read and parse them (a job is 7-20 KB and about 125 us to parse; a record
about 200 bytes and 10 us): a store keeps every job it ever ran, and may hold a queue of thousands.

Keys (beside the store's own, same prefix):

    {p}figures   HASH   job id -> the job's figures as JSON (JobFigures.to_json)

Only a run under way changes a job's figures as time passes, so a job without one has its record written in the
transaction that changes it (Store._write, Store.add_job, a demo's copies in Store.publish_jobs, a move between
shards in moves.py), and a job with one has none (read live). So a record, where there is one, is the job's figures
now; a job without one is read (a run under way, or a store from before the records: its ended jobs' records are
then kept by the reader that computed them, `keep`). A reader checks a record against the jobs index (its
submission time) before it trusts it, so a record left from a namespace cleared and filled again is never taken for
the new job under its id.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis

from broker.domain.figures import JobFigures, figures
from broker.domain.model import Job, JobState

if TYPE_CHECKING:
    from broker.store.jobs import Store

log = logging.getLogger(__name__)
KEY = "figures"
BATCH = 5_000  # fields per HMGET or HSET: about a MB a reply


def record(job: Job | None) -> str | None:
    """The record of a job without a run under way; None for a job with one (read live) or none (deleted)."""
    if job is None or job.current_run is not None:
        return None
    return figures(job, job.updated_at).to_json()  # every run ended: the time is not used


def track(pipe, key: str, before: Job | None, after: Job | None) -> None:
    """Queue the record of a job stored as `after` (None: deleted) that was `before` (None: new), when it changes."""
    new = record(after)
    if new is None:  # a run under way, or deleted: none kept
        if before is not None and before.current_run is None:
            pipe.hdel(key, before.id)
    elif before is None or before.current_run is not None or new != record(before):  # unchanged: no write
        pipe.hset(key, after.id, new)


def read(store: Store, ids: list[str]) -> dict[str, str]:
    """The records kept for these job ids (ids without one are left out)."""
    found: dict[str, str] = {}
    for i in range(0, len(ids), BATCH):
        batch = ids[i : i + BATCH]
        found |= {job_id: text for job_id, text in zip(batch, store.redis.hmget(store.key(KEY), batch)) if text}
    return found


def keep(store: Store, records: dict[str, str]) -> None:
    """Keep these records (job id -> JSON), in batches. A user or a replica that may not write keeps nothing: the
    records spare reads, the jobs stay the truth."""
    items = list(records.items())
    try:
        for i in range(0, len(items), BATCH):
            store.redis.hset(store.key(KEY), mapping=dict(items[i : i + BATCH]))
    except redis.ResponseError as err:  # NOPERM, READONLY
        log.warning("store=%s figures not kept (%s)", store.url, err)


def newest_in_states(store: Store, states: set[JobState], limit: int) -> tuple[list[Job], int] | None:
    """The newest `limit` jobs (0: all) in `states`, oldest first, and how many there are, reading only those jobs
    and the ones with a run under way: each shard's records say the other jobs' states (the index, the records and
    the running jobs read in one transaction: a job has a record or a run under way, never both). None when a job
    has neither (a store from before the records): read the jobs."""
    ranked, found = [], {}  # found: the jobs read, those with a run under way first
    for shard in store.shards:
        with shard.redis.pipeline(transaction=True) as pipe:
            pipe.zrange(shard.key("jobs"), 0, -1, withscores=True).hgetall(shard.key(KEY)).smembers(shard.key("active"))
            index, kept, running = pipe.execute()
        index, seen = dict(index), set()
        for job_id, text in kept.items():
            kept_figures = JobFigures.from_json(job_id, text)
            if index.get(job_id) != kept_figures.submitted_at.timestamp():
                continue  # another job's, left over
            seen.add(job_id)
            if kept_figures.state in states:
                ranked.append((index[job_id], job_id, shard))
        for job in shard.jobs_by_id(sorted(running)):
            seen.add(job.id)
            found[job.id] = job
            if job.state in states and job.id in index:
                ranked.append((index[job.id], job.id, shard))
        if not seen >= index.keys():
            return None
    ranked.sort(key=lambda r: r[:2])
    shown = ranked[-limit:] if limit else ranked
    for shard in store.shards:
        found |= {j.id: j for j in shard.jobs_by_id([i for _, i, s in shown if s is shard and i not in found])}
    return [found[i] for _, i, _ in shown if i in found and found[i].state in states], len(ranked)
