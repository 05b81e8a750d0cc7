"""Waiting jobs stranded in a shard move to one that can run them.

A job runs only on its own shard's agents, and a new job goes where the agents that fit it are. Agents come and go
(spot is taken back, a fleet scales down), so a shard can lose every agent a waiting job fits while other shards
still have some. Such a job would wait for an agent whose id happens to hash into its shard. Instead the leader of
its shard moves it, each pass, to the shard with the most agents that fit it per waiting job (the rule new jobs
follow). Only a job no agent of its own shard fits moves, to a shard that has one, so a job never moves back and
forth while the fleet stands still.
"""

from __future__ import annotations

import logging
from datetime import datetime

from broker.domain.model import AgentInfo
from broker.models.fit import fits
from broker.store.moves import finish_move, move_job, unfinished_moves
from broker.store.shards import ShardedStore

log = logging.getLogger(__name__)

PAGE = 200  # the most urgent waiting jobs a pass looks at
REHOME_EVERY_S = 10.0  # how often a shard's leader looks: agents join and leave over minutes


def stranded(store: ShardedStore, index: int, agents: list[list[AgentInfo]], waiting: list[int]):
    """The waiting jobs of shard `index` that no working agent of it fits, each with the shard it should go to
    (`agents`, `waiting`: each shard's working agents and waiting jobs, read once a pass)."""
    if not waiting[index] or not any(group for i, group in enumerate(agents) if i != index):
        return []
    moves = []
    for job in store.shards[index].pending_jobs(0, PAGE):
        if any(a.may_take(job.id) and fits(job.spec, a.offer) for a in agents[index]):
            continue
        fitting = [
            a
            for i, group in enumerate(agents)
            if i != index
            for a in group
            if a.for_job is None and fits(job.spec, a.offer)
        ]
        target = store.roomiest(fitting, waiting)
        if target is not None:
            moves.append((job.id, target))
            waiting[target] += 1  # the next stranded job weighs this one in
    return moves


def rehome(store: ShardedStore, leaders: dict[int, str], now: datetime) -> int:
    """One pass over the shards `leaders` names (index -> the replica leading it): finish the moves a mover left half
    done, then move the stranded jobs, the fleet and the queues read once; returns how many jobs moved."""
    shards = store.shards
    waiting = [shard.pending_count() for shard in shards]
    agents = None  # the fleet is read only when a led shard has a job waiting: an idle pass reads the queues alone
    moved = 0
    for index, leader in leaders.items():
        for job_id, move in unfinished_moves(shards[index]).items():
            finish_move(shards, job_id, index, move, leader, now)
        if not waiting[index]:
            continue
        if agents is None:
            agents = [shard.working_agents() for shard in shards]
        for job_id, target in stranded(store, index, agents, waiting):
            if move_job(shards, job_id, index, target, leader, now):
                log.info("job=%s moved from shard %d to %d: no agent of its shard fits it", job_id, index, target)
                moved += 1
    return moved
