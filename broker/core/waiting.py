"""What a queued job waits for, in the order a user fixes it: a server, an agent, an agent that fits, then the
planner's own reason. `broker status` and `broker run` say it; it reads the store only (a read command stays quick).
"""

from __future__ import annotations

from broker.domain.model import Job, JobState
from broker.store.jobs import Store

AGENTS_SAID = 3  # a job no agent fits names what this many lack


def waiting_for(store: Store, job: Job, planning_here: bool = False) -> str | None:
    """Why the job is not running yet, or None when it is not queued. `store`: the broker's, all its shards.
    `planning_here`: the caller runs server rounds itself (`broker run`), so no lease held is no reason to wait."""
    if job.state != JobState.queued:
        return None
    shards = store.shards
    store = store.of_job(job.id)  # its shard's server plans it, on its shard's agents
    if store.planner() is None and not planning_here:
        return f"no broker server is running: start `broker server` (or `broker run {job.id}`)"
    agents = store.working_agents()
    if not agents and len(shards) == 1:
        return f"no agent is registered: start one (`broker agent`, `broker agents provision`, `broker run {job.id}`)"
    from broker.models.fit import fits, unfit  # numpy and scipy: only once there are agents to match

    fitting = [a for a in agents if fits(job.spec, a.offer)]
    if not fitting and len(shards) > 1:
        return _not_in_its_shard(shards, store, job, fits)
    if not fitting:
        said = [f"{a.id} ({a.offer.id}): {unfit(job.spec, a.offer)}" for a in agents[:AGENTS_SAID]]
        more = f"; {len(agents) - AGENTS_SAID} more" if len(agents) > AGENTS_SAID else ""
        return f"no registered agent fits it: {'; '.join(said)}{more}"
    given = next((a for a in agents if a.job == job.id), None)
    if given is not None:  # dispatched: queued until the agent reports that the job's process started
        return f"starting on {given.id}"
    fitting = [a for a in fitting if a.may_take(job.id)]
    if not fitting:
        return "the agents that fit it were started for other jobs (`broker run`), and take no other"
    if job.pinned_tier is not None and not any(a.offer.tier == job.pinned_tier for a in fitting):
        return (
            f"an agent on {job.pinned_tier.value}, where the deadline guard moved it: none that fits it is registered"
        )
    if all(a.job for a in fitting):
        return "every agent that fits it is busy"
    return job.reason or "the next planning round"


def _not_in_its_shard(shards: list[Store], own: Store, job: Job, fits) -> str:
    """A sharded broker's job runs only on its own shard's agents: say which shard lacks one, and whether others
    have agents that fit (then its shard's leader moves it to one of them: core/rehoming.py)."""
    from broker.core.rehoming import REHOME_EVERY_S

    index = shards.index(own)
    elsewhere = sum(
        1 for shard in shards if shard is not own for a in shard.working_agents() if fits(job.spec, a.offer)
    )
    where = f"its shard ({index} of {len(shards)}, BROKER_SHARDS) has no agent that fits it"
    if elsewhere:
        return f"{where}; {elsewhere} in other shards do: the server moves it to one within {REHOME_EVERY_S:.0f} s"
    return f"{where}, nor does any other: start one (`broker agent`, `broker agents provision`, `broker run {job.id}`)"
