"""What our own agents saw of spot markets: per (cloud, region, instance type), the hours run on spot and the runs a
preemption ended (Job.market_runs), kept as counters beside the jobs.

Keys (beside the store's own, same prefix):

    {p}spot-evidence   HASH   "{cloud}|{region}|{instance type}|hours" and "...|preemptions"; "counted": set once
                              every job stored before the counters existed has been counted (recount.py)

Every live catalog prices with this evidence (each `broker submit`, the server once a minute, the dashboard), and it
read every job the store ever ran: 20,000 jobs added 3 s to a submit. A run is counted in the transaction that
stores it ended (Store._write, Store.add_job), so once, whatever reports repeat.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.domain.model import Job
from broker.store.recount import COUNTED, recount

if TYPE_CHECKING:
    from broker.store.jobs import Store

KEY = "spot-evidence"
Market = tuple[str, str, str]  # (cloud, region, instance type), as the hazard model keys its evidence


def count(pipe, key: str, before: Job | None, job: Job) -> None:
    """Queue the counters of the job's market runs that ended in this change (none were before it)."""
    counted = {r.fence for r in before.market_runs()} if before is not None else set()
    for run in job.market_runs():
        if run.fence in counted:
            continue
        market = "|".join((run.offer.cloud, run.offer.region, run.offer.instance_type))
        pipe.hincrbyfloat(key, f"{market}|hours", run.hours(run.ended_at))
        if run.end_reason == "preempted":
            pipe.hincrby(key, f"{market}|preemptions", 1)


def seen(store: Store) -> dict[Market, tuple[float, float]]:
    """Per market, (preemptions, hours) our agents saw in this store (one shard): the counters, after counting the
    jobs stored before they existed, once."""
    raw = store.redis.hgetall(store.key(KEY))
    if COUNTED not in raw and recount(store, KEY, count):
        raw = store.redis.hgetall(store.key(KEY))
    found: dict[tuple[str, ...], list[float]] = {}
    for field, value in raw.items():
        if field != COUNTED:
            *market, what = field.split("|")
            found.setdefault(tuple(market), [0.0, 0.0])[what == "hours"] += float(value)
    return {market: (preemptions, hours) for market, (preemptions, hours) in found.items()}
