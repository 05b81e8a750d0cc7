"""Agents started for one job (`broker run`): they take that job while it waits, and no other. Planned like any
agent, the local agent a user started for their job went to another queued job, and theirs waited behind it."""

from __future__ import annotations

from datetime import datetime

from broker.core.budget import stop_over_budget
from broker.domain.model import AgentInfo, Job
from broker.models.fit import fits
from broker.planning.option_table import PlanItem
from broker.store.jobs import Store


def reserved_pairs(
    store: Store, idle: list[AgentInfo], now: datetime, consumer: str
) -> tuple[list[tuple[Job, AgentInfo]], list[AgentInfo]]:
    """(job, agent) for each waiting job an idle agent was started for and fits as the planner sees the job (a job
    the guard pinned to on-demand waits for an on-demand one; a capped job that spent its budget ends instead, as
    the planner's would), and the idle agents any job may take."""
    reserved = [a for a in idle if a.for_job is not None]
    if not reserved:
        return [], idle
    waiting = {j.id: j for j in store.jobs_by_id(sorted({a.for_job for a in reserved})) if j.pending}
    spent = set(stop_over_budget(store, list(waiting.values()), now, 0.0, consumer))
    seen = {i: PlanItem.from_job(job).spec for i, job in waiting.items() if i not in spent}  # the guard's pin too
    pairs: dict[str, tuple[Job, AgentInfo]] = {}
    for agent in sorted(reserved, key=lambda a: a.offer.price_usd_per_h):  # the cheapest of a job's that fits
        if agent.for_job in seen and agent.for_job not in pairs and fits(seen[agent.for_job], agent.offer):
            pairs[agent.for_job] = (waiting[agent.for_job], agent)
    return list(pairs.values()), [a for a in idle if a.for_job is None]


def tell_ended(store: Store, agents: list[tuple[AgentInfo, str | None]]) -> None:
    """Tell each live idle agent started for a job that has ended that it did: a job cancelled before it was given
    the agent left it no view to leave by, and with its `broker run` killed (SIGKILL) it waited for good."""
    idle = [a for a, lease in agents if a.for_job and a.job is None and lease not in (None, "leaving")]
    ended = {j.id for j in store.jobs_by_id(sorted({a.for_job for a in idle})) if j.state.terminal}
    for agent in idle:
        if agent.for_job in ended:
            store.tell_never_given_ended(agent.id, agent.for_job)
