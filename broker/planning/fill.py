"""Fill-queue ordering (PipeFill's scheduler): when fill executor i frees up, run the queued fill job
with the highest score. proc_times[i] is the job's time to finish on executor i (from its fill plan).

- SJF: 1 / min(proc_times)
- makespan: 1 / max(proc_times[i], the longest time any executor is still busy)
- deadline-first: the job whose deadline leaves the least slack on executor i
`next_fill_job` scores plain numbers; `order_bubbles` applies it to a round's dispatch, so the server's idle
bubble executors take the fill jobs in the order the chosen policy gives (BROKER_FILL_ORDER).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from broker.domain.model import AgentInfo, Tier
from broker.domain.offer import Offer
from broker.models.fit import fits
from broker.models.risk import exclusive_hours
from broker.planning import FILL_ORDERS
from broker.planning.option_table import PlanItem


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


SCORES: dict[str, Score] = dict(zip(FILL_ORDERS, (sjf, makespan, deadline_first), strict=True))


def next_fill_job(queue: list[FillJob], executor: int, busy_s: list[float], order: str = "sjf") -> FillJob | None:
    """The queued job executor `executor` should run next (ties: queue order); None if none fits it."""
    score = SCORES[order]
    runnable = [j for j in queue if math.isfinite(j.proc_times_s[executor])]
    return max(runnable, key=lambda j: score(j, executor, busy_s), default=None)


def order_bubbles(
    pairs: list[tuple[PlanItem, AgentInfo]], waiting: list[PlanItem], now: datetime, order: str
) -> list[tuple[PlanItem, AgentInfo]]:
    """A round's (job, offer) pairs with the bubble executors' jobs chosen again, one executor at a time, by the
    fill policy `order`: among the fill jobs the plan gave a bubble and those `waiting` for capacity. Jobs the
    plan sent to spot or on-demand stay there; a fill job no executor's windows fit is left waiting."""
    bubbles = [agent for _, agent in pairs if agent.offer.tier == Tier.bubble]
    if not bubbles:
        return pairs
    kept = [(item, agent) for item, agent in pairs if agent.offer.tier != Tier.bubble]
    candidates = [item for item, agent in pairs if agent.offer.tier == Tier.bubble] + [
        i for i in waiting if i.spec.fill
    ]
    by_id = {item.id: item for item in candidates}
    queue = [_fill_job(item, [agent.offer for agent in bubbles], now) for item in by_id.values()]
    for executor, agent in enumerate(bubbles):
        job = next_fill_job(queue, executor, [0.0] * len(bubbles), order)
        if job is not None:
            queue.remove(job)
            kept.append((by_id[job.id], agent))
    return kept


def _fill_job(item: PlanItem, executors: list[Offer], now: datetime) -> FillJob:
    """The job as the fill policies see it: seconds to finish on each executor, seconds to its deadline."""
    times = tuple(
        exclusive_hours(item.spec, offer) * item.remaining * 3600 if fits(item.spec, offer) else math.inf
        for offer in executors
    )
    deadline = (item.spec.deadline - now).total_seconds() if item.spec.deadline else None
    return FillJob(item.id, times, deadline)
