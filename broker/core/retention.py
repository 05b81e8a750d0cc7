"""Retention: a store keeps every job it ran unless told otherwise (an ended job holds about 15 KB of Redis memory:
1,000 jobs a minute fill 20 GB a day, bench/results/retention.md). With `broker server --keep-ended-days N` the
leader of each shard forgets, a page a minute, the jobs that ended more than N days ago (store/retention.py) and the
log streams of agents removed as long ago, and removes the jobs' checkpoints from the checkpoint store on a thread
of its own, so a slow bucket holds no round up.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from broker.agents.checkpoints import CheckpointStore
from broker.store.jobs import Store
from broker.store.retention import ended_before, forget, forget_logs

log = logging.getLogger(__name__)

FORGET_EVERY_S = 60.0  # a pass a minute, each shard a page: ended jobs age by days ...
PAGE = 500  # ... and a pass each round while a page comes full (a backlog: a busy broker ends jobs by the thousand)


class Retention:
    """Forgets the jobs that ended more than `keep` ago, a page of each led shard a pass."""

    def __init__(self, keep: timedelta, checkpoints: CheckpointStore, metrics=None):
        self.keep, self.checkpoints = keep, checkpoints
        self.metrics = metrics  # a broker.app.metrics.ServerMetrics, or None
        self._start: dict[str, int] = {}  # shard prefix -> where its next page starts (the jobs before stay)
        self._passed = -float("inf")
        self._full = False  # the last pass read a full page somewhere: more wait
        self._removals = ThreadPoolExecutor(1, thread_name_prefix="retention")

    def due(self) -> bool:
        if not self._full and time.monotonic() - self._passed < FORGET_EVERY_S:
            return False
        self._passed, self._full = time.monotonic(), False
        return True

    def forget_ended(self, store: Store, now: datetime, leader: str | None = None) -> list[str]:
        """Forget the page's jobs that ended before `now - keep` (while `leader` plans the shard); returns their ids.
        The next page starts after the jobs this one kept, and from the oldest again after the last page."""
        cutoff, start = now - self.keep, self._start.get(store.prefix, 0)
        page = ended_before(store, cutoff.timestamp(), start, PAGE)
        gone = forget(store, [job for job in page if job.state.terminal and job.updated_at < cutoff], leader)
        self._start[store.prefix] = start + len(page) - len(gone) if len(page) == PAGE else 0
        self._full |= len(page) == PAGE
        for job_id in gone:
            self._removals.submit(self._remove_checkpoints, job_id)
        if self.metrics and gone:
            self.metrics.forgotten.inc(len(gone))
        logs = forget_logs(store, cutoff.timestamp(), PAGE)
        if gone or logs:
            log.info(
                "store=%s forgot %d jobs and %d agents' logs from before %s", store.prefix, len(gone), len(logs), cutoff
            )
        return gone

    def _remove_checkpoints(self, job_id: str) -> None:
        try:
            self.checkpoints.remove_job(job_id)
        except Exception as err:  # noqa: BLE001 - a bucket's error (auth, network) costs storage, not the server
            log.warning("job=%s checkpoints not removed: %r", job_id, err)

    def wait(self) -> None:
        """Let the checkpoint removals under way finish (tests, a stopping server)."""
        self._removals.shutdown(wait=True)
        self._removals = ThreadPoolExecutor(1, thread_name_prefix="retention")
