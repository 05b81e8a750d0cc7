"""The newest jobs a store read or wrote, parsed, by their stored text: most reads of a job find it here."""

from __future__ import annotations

import threading
from collections import OrderedDict

from broker.domain.model import Job

PARSED_JOBS = 4096  # jobs kept parsed


class ParsedJobs:
    """The newest jobs by their stored text. A server reads a job several times in its life (its pending page, the
    dispatch's and each fold's transaction), and wrote most of those texts itself, so it parses a job about once.
    Sharing one parsed Job is safe because no Job changes in place (frozen; a change is a model_copy, and a run
    changes only as a copy: core/reports.py). A lock: threads may share a store (a bubble agent's do)."""

    def __init__(self, size: int = PARSED_JOBS):
        self.size, self.jobs, self.lock = size, OrderedDict(), threading.Lock()

    def get(self, raw: str) -> Job:
        with self.lock:
            job = self.jobs.get(raw)
        return self.put(raw, job or Job.model_validate_json(raw))

    def put(self, raw: str, job: Job) -> Job:
        with self.lock:
            self.jobs[raw] = job
            self.jobs.move_to_end(raw)  # newest last: the oldest goes first
            if len(self.jobs) > self.size:
                self.jobs.popitem(last=False)
        return job
