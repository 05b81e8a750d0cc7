"""Ended jobs' figures (app/ledger.py), kept beside the jobs by the readers that computed them, so the next process
need not read and parse every job again (about 125 us a job against about 10 us a record).

Keys (beside the store's own, same prefix):

    {p}figures   HASH   job id -> the job's figures as JSON (opaque here: models/accounting.py writes and reads them)

An ended job's figures never change, so a record is true for as long as its job is stored; a reader checks a
record against the jobs index (its submission time) before it trusts it, so a record left from a namespace cleared
and filled again is never taken for the new job under its id. A demo's copies that the next demo replaces take
their records with them (Store.publish_jobs).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis

if TYPE_CHECKING:
    from broker.store.jobs import Store

log = logging.getLogger(__name__)
KEY = "figures"
BATCH = 5_000  # fields per HMGET or HSET: about a MB a reply


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
