"""Every job's figures (accounting.JobFigures) for the readers that show all of them: the dashboard's overview and
the server's metrics.

A store keeps every job it ever ran: 20,000 jobs took 2.5 s to read and parse, at each refresh and each scrape. An
ended job's figures no longer change, so the ledger keeps them and reads only the jobs still under way and the new
ones.
"""

from __future__ import annotations

import threading
from datetime import datetime

from broker.models.accounting import JobFigures, figures
from broker.store.jobs import Store


class Ledger:
    def __init__(self, store: Store):
        self.store = store
        self._final: dict[str, JobFigures] = {}
        self._lock = threading.Lock()  # readers may come at once (the exporter and Streamlit serve in threads)

    def figures(self, now: datetime) -> list[JobFigures]:
        """Each job's figures as of `now`: the ended ones' as kept, the others read now. Each shard's jobs index is
        read once, with submission times: a kept id stored again with another time is another job (a namespace
        cleared and filled again), read like a new one; a kept id gone from the index is dropped."""
        with self._lock:
            kept, read = {}, []
            for shard in self.store.shards:
                index = shard.job_index()
                for job_id, at in index.items():  # in the index's order, as read: the same sums each call
                    if job_id in self._final and at == self._final[job_id].submitted_at.timestamp():
                        kept[job_id] = self._final[job_id]
                unread = [job_id for job_id in index if job_id not in kept]
                read += [figures(job, now) for job in shard.jobs_by_id(unread)]
            self._final = kept | {f.id: f for f in read if f.final}
            return [*self._final.values(), *(f for f in read if not f.final)]
