"""Every job's figures (domain/figures.py) for the readers that show all of them: the dashboard's overview and
`broker cost-report` (the server's metrics need only their sums: store/totals.py).

A store keeps every job it ever ran (20,000 jobs took 2.5 s to read and parse) and may hold a long queue (10,000
waiting: 2.4 s at each of the dashboard's refreshes). The store keeps the figures of every job without a run under way
beside it (store/figures.py), so the ledger reads those records and only the jobs with a run under way; an ended job's
figures no longer change, so it keeps them in this process too. A store from before the records has its ended jobs'
records kept by the first reader.
"""

from __future__ import annotations

import threading
from datetime import datetime

from broker.domain.figures import JobFigures, figures
from broker.store import figures as records
from broker.store.jobs import Store


class Ledger:
    def __init__(self, store: Store):
        self.store = store
        self._final: dict[str, JobFigures] = {}
        self._lock = threading.Lock()  # readers may come at once (the exporter and Streamlit serve in threads)

    def figures(self, now: datetime) -> list[JobFigures]:
        """Each job's figures as of `now`, shard by shard in the jobs index's order (the same sums each call): the
        ended ones' as kept, the others' records read now, and the jobs without one (a run under way) read now.
        Each shard's index is read once, with submission times: figures kept for an id stored with another time
        are another job's (a namespace cleared and filled again), and those of an id gone from the index are
        dropped."""
        with self._lock:
            shown, final = [], {}
            for shard in self.store.shards:
                index = shard.job_index()
                known = {i: self._final[i] for i in index if i in self._final}
                stored = records.read(shard, [i for i in index if i not in known])
                known |= {i: JobFigures.from_json(i, text) for i, text in stored.items()}
                known = {i: f for i, f in known.items() if f.submitted_at.timestamp() == index[i]}
                unread = [i for i in index if i not in known]
                read = {f.id: f for f in (figures(job, now) for job in shard.jobs_by_id(unread))}
                records.keep(shard, {i: f.to_json() for i, f in read.items() if f.final})
                for job_id in index:
                    found = known.get(job_id) or read.get(job_id)  # None: gone since the index was read
                    if found is not None:
                        shown.append(found)
                        if found.final:
                            final[job_id] = found
            self._final = final
            return shown
