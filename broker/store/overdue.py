"""Jobs not ended whose deadline has passed, counted without reading any job: an index beside the jobs, kept in the
transaction that changes a job (Store._index), so a metrics scrape asks Redis one ZCOUNT a shard however long the
queue. A job that ends is taken out; so a late job is counted while it runs and, once it ends, by the quotes' record.

{p}due          ZSET    each unfinished job with a deadline -> its deadline (epoch seconds)
{p}due-indexed  STRING  set once every job stored before the index existed is in it (or the store began with it)
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import redis

from broker.domain.model import Job

if TYPE_CHECKING:
    from broker.store.jobs import Store

KEY, INDEXED = "due", "due-indexed"


def index(pipe, key: str, job: Job) -> None:
    """Queue the job's entry: in the index while it has a deadline and has not ended, out of it otherwise."""
    if job.spec.deadline is not None and not job.state.terminal:
        pipe.zadd(key, {job.id: job.spec.deadline.timestamp()})
    else:
        pipe.zrem(key, job.id)


def overdue(store: Store, now: datetime) -> int:
    """How many of the shard's jobs have not ended and are past their deadline."""
    if not store.redis.exists(store.key(INDEXED)):
        _index_stored(store)
    return store.redis.zcount(store.key(KEY), "-inf", f"({now.timestamp()}")


def _index_stored(store: Store) -> None:
    """Put in the index the unfinished jobs of a store written before it existed, once. The queue, the runs under way
    and the index are watched: a job that ends or changes its deadline meanwhile starts it again."""
    watched = [store.key("pending"), store.key("active"), store.key(KEY)]
    while True:
        with store.redis.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(*watched)
                jobs = store.unfinished_jobs()
                pipe.multi()
                for job in jobs:
                    index(pipe, store.key(KEY), job)
                pipe.set(store.key(INDEXED), 1)
                pipe.execute()
                return
            except redis.WatchError:
                continue
