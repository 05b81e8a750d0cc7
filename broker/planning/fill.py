"""Fill-queue ordering (PipeFill's scheduler): when fill executor i frees up, run the queued fill job
with the highest score. proc_times[i] is the job's time to finish on executor i (from its fill plan).

- SJF: 1 / min(proc_times)
- makespan: 1 / max(proc_times[i], the longest time any executor is still busy)
- deadline-first: the job whose deadline leaves the least slack on executor i
Pure functions over plain numbers; the executor asks `next_fill_job` each time it frees up.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class FillJob:
    id: str
    proc_times_s: tuple[float, ...]  # time to finish on each executor (inf: does not fit its windows)
    deadline_s: float | None = None  # seconds from now


Score = Callable[[FillJob, int, list[float]], float]


def sjf(job: FillJob, executor: int, busy_s: list[float]) -> float:
    return 1 / min(job.proc_times_s)


def makespan(job: FillJob, executor: int, busy_s: list[float]) -> float:
    return 1 / max(job.proc_times_s[executor], max(busy_s, default=0.0))


def deadline_first(job: FillJob, executor: int, busy_s: list[float]) -> float:
    if job.deadline_s is None:
        return -math.inf
    return -(job.deadline_s - job.proc_times_s[executor])  # less slack scores higher


SCORES: dict[str, Score] = {"sjf": sjf, "makespan": makespan, "deadline": deadline_first}


def next_fill_job(queue: list[FillJob], executor: int, busy_s: list[float], order: str = "sjf") -> FillJob | None:
    """The queued job executor `executor` should run next (ties: queue order); None if none fits it."""
    score = SCORES[order]
    runnable = [j for j in queue if math.isfinite(j.proc_times_s[executor])]
    return max(runnable, key=lambda j: score(j, executor, busy_s), default=None)
