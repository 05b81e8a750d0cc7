"""A warm broker for a backtest: finished jobs of another workload, moved in time to end before this backtest starts
and renamed, stored before its first job. A backtest's broker otherwise starts with an empty store, as a live one
does only on its first day: its first quotes know no measured speed (core/fleet.Fleet: the prior's spread alone).
The history gives them its jobs' speeds; it was submitted too long before to count as recent arrivals, so the rate
of jobs to come warms up within the backtest as before. Its runs count as run off the clouds (Run.on_cloud False):
no evidence of this market (store/evidence.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from broker.domain.model import Job
from broker.sim.market import Market
from broker.sim.workloads import Arrival

PREFIX = "history-"  # their ids and names: none is taken for a job of the backtest, or for one run again
SEED_OFFSET = 1000  # a history's workload seed is the backtest's plus this: apart from every evaluated one


def on_demand_history(
    market: Market, arrivals: list[Arrival], redis_url: str, seed: int, before: datetime
) -> list[Job]:
    """`arrivals` run on on-demand over `market`, as a warm broker's history ending before `before`. On-demand reads
    nothing of the spot market, so the history holds no more of the traces than their prices: its jobs' speeds."""
    from broker.sim.backtest import run_policy

    return warm_history(run_policy("on-demand", redis_url, market, arrivals, seed).jobs, before)


def warm_history(jobs: list[Job], before: datetime) -> list[Job]:
    """The final jobs of `jobs`, every time in them moved by as much, so that the last to end ends a minute before
    `before` (a deadline may fall after it: a job that ended early)."""
    final = [job for job in jobs if job.final]
    if not final:
        return []
    ended = max(max([job.updated_at, *(run.ended_at for run in job.runs)]) for job in final)
    shift = before - timedelta(minutes=1) - ended
    dumps = [job.model_dump() for job in final]
    moved = []
    for dump in _shifted(dumps, shift):
        dump["id"], dump["spec"]["name"] = PREFIX + dump["id"], PREFIX + dump["spec"]["name"]
        for run in dump["runs"]:
            run["on_cloud"] = False
        moved.append(Job.model_validate(dump))
    return moved


def _shifted(value, shift: timedelta):
    if isinstance(value, datetime):
        return value + shift
    if isinstance(value, dict):
        return {k: _shifted(v, shift) for k, v in value.items()}
    return [_shifted(v, shift) for v in value] if isinstance(value, list) else value
