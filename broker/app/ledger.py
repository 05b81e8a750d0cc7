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
        """Each job's figures as of `now`: the ended ones' as kept, the others read now."""
        with self._lock:
            index = self.store.job_index()
            self._final = {  # a job gone from the store (a demo's copies, replaced) or another under its id
                job_id: kept
                for job_id, kept in self._final.items()
                if index.get(job_id) == kept.submitted_at.timestamp()
            }
            read = [figures(job, now) for job in self.store.list_jobs(skip=self._final)]
            self._final.update((f.id, f) for f in read if f.final)
            return [*self._final.values(), *(f for f in read if not f.final)]
