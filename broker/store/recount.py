"""Counters kept beside the jobs (evidence.py, totals.py) are counted in the transaction that changes a job; a store
written before a counter existed is counted from every stored job, once."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import redis

from broker.domain.model import Job

if TYPE_CHECKING:
    from broker.store.jobs import Store

COUNTED = "counted"  # a counter hash's field: every job stored before it existed has been counted


def recount(store: Store, name: str, count: Callable[[object, str, Job | None, Job], None]) -> bool:
    """Count every stored job into fresh counters under `name` with `count(pipe, key, before, job)`, marked counted;
    False for a store without jobs, left as it is (a refused submit stores nothing). A job that changes the counters
    meanwhile (watched) starts the count again, so it is neither lost nor counted twice."""
    key = store.key(name)
    while True:
        with store.redis.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)
                jobs = store.list_jobs()
                if not jobs:
                    return False
                pipe.multi()
                pipe.delete(key)
                for job in jobs:
                    count(pipe, key, None, job)
                pipe.hset(key, COUNTED, 1)
                pipe.execute()
                return True
            except redis.WatchError:
                continue
