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

from broker.domain.figures import figures
from broker.domain.model import Job

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
