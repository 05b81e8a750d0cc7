"""What a store's (one shard's) jobs add up to, all but those with a run under way: how many are in each state,
what they cost and what the same work would have cost on on-demand, kept as counters beside the jobs.

Keys (beside the store's own, same prefix):

    {p}totals   HASH   "jobs|{state}", "spend_usd", "on_demand_usd" over the jobs without a run under way;
                       "counted": set once every job stored before the counters existed has been counted (recount.py)

The server's metrics show every job's figures at each scrape, and a store keeps every job it ever ran (reading them
all cost 0.2 s of the server's CPU a scrape at 60,000 jobs) and may hold a long queue. Only a run under way changes
what a job costs as time passes, so the others are counted in the transaction that changes them (Store._write,
Store.add_job, a demo's copies in Store.publish_jobs, a job moving between shards in moves.py), once, and a scrape
reads the counters and the jobs with a run under way (Store.totals_and_running).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.domain.model import Job, JobState

KEY = "totals"


@dataclass(frozen=True, slots=True)
class Totals:
    jobs: dict[JobState, int]
    spend_usd: float
    on_demand_usd: float

    @classmethod
    def parse(cls, raw: dict[str, str]) -> Totals:
        """The counters as read (HGETALL)."""
        jobs = {state: int(raw.get(f"jobs|{state.value}", 0)) for state in JobState}
        return cls(jobs, float(raw.get("spend_usd", 0)), float(raw.get("on_demand_usd", 0)))


def _counted(job: Job | None) -> tuple[JobState, float, float] | None:
    """What a job adds to the counters: nothing while a run of it is under way (read as it is)."""
    if job is None or job.current_run is not None:
        return None
    return job.state, job.cost_usd, job.on_demand_usd(job.updated_at)  # every run ended: the time is not used


def count(pipe, key: str, before: Job | None, after: Job | None) -> None:
    """Queue the change to the counters of a job stored as `after` (None: deleted) that was `before` (None: new)."""
    old, new = _counted(before), _counted(after)
    if old == new:
        return
    for figures, sign in ((old, -1), (new, 1)):
        if figures is not None:
            state, spend, on_demand = figures
            pipe.hincrby(key, f"jobs|{state.value}", sign)
            if spend or on_demand:  # a job that never ran: a count alone
                pipe.hincrbyfloat(key, "spend_usd", sign * spend)
                pipe.hincrbyfloat(key, "on_demand_usd", sign * on_demand)
