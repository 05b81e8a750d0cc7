"""Moving a waiting job to another shard: for a job whose shard has no agent that fits it while another shard has.

A job lives in the shard its id hashes to until it moves. The shard it leaves keeps a route to the one it went to
(`{p}route`: job -> shard index), and ShardedStore.of_job follows the routes from the job's home shard. A move spans
two shards, so two cluster slots, and no one transaction can hold it. It goes in steps, each one transaction, with
its intent durable first (`{p}moving` in the source: job -> target), so a mover that dies midway is finished by the
next leader of the source, and no server ever sees the job waiting in two shards:
1. take the job out of the source's queue and note the move (the source's planning lease and the job watched);
2. write a copy in the target, unindexed: no server and no list sees it yet (and the copy as handed over,
   `{p}handed`: job -> its text);
3. in the source, if the job still waits as copied: delete it and write the route; else the move is off (the job
   goes back to the source's queue if it still waits there) and the copy is deleted;
4. index the copy in the target (its queue, its job list, its totals as handed over in 2, an event), then clear
   the note. Between 3 and 4 the job is in neither shard's totals (store/totals.py).
"""

from __future__ import annotations

from datetime import datetime

import redis

from broker.domain.model import Job
from broker.store import figures, overdue, totals
from broker.store.jobs import Store

MOVING, ROUTE, HANDED = "moving", "route", "handed"


def move_job(shards: list[Store], job_id: str, source: int, target: int, leader: str, now: datetime) -> bool:
    """Move a waiting job from shard `source`, whose planning lease `leader` holds, to shard `target`; False when it
    no longer waits there or the lease is lost (nothing moved)."""
    src = shards[source]
    with src.redis.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(src.key("job", job_id), src.key("leader"))
            raw = pipe.get(src.key("job", job_id))
            if pipe.get(src.key("leader")) != leader or raw is None or not Job.model_validate_json(raw).pending:
                return False
            pipe.multi()
            pipe.zrem(src.key("pending"), job_id)
            pipe.hset(src.key(MOVING), job_id, target)
            pipe.execute()
        except redis.WatchError:  # the job changed (a cancel, a dispatch): it stays
            return False
    return finish_move(shards, job_id, source, target, leader, now)


def unfinished_moves(src: Store) -> dict[str, int]:
    """The moves out of this shard that a mover noted and did not finish: job -> target shard."""
    return {job_id: int(target) for job_id, target in src.redis.hgetall(src.key(MOVING)).items()}


def finish_move(shards: list[Store], job_id: str, source: int, target: int, leader: str, now: datetime) -> bool:
    """Steps 2 to 4 of a noted move, from wherever it stopped; True once the job waits in the target."""
    src, dst = shards[source], shards[target]
    raw = src.redis.get(src.key("job", job_id))
    if raw is not None:  # not yet handed over: the target's copy (if any) is unindexed, so it is rewritten
        job = Job.model_validate_json(raw)
        if not job.pending:
            return _call_off(src, dst, job_id)
        with dst.redis.pipeline(transaction=True) as pipe:
            pipe.set(dst.key("job", job_id), raw)
            pipe.hset(dst.key(HANDED), job_id, raw)  # what it lands as in the totals, whatever changes it meanwhile
            pipe.hdel(dst.key(ROUTE), job_id)  # a route out of the target from an earlier move would loop
            pipe.execute()
        with src.redis.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(src.key("job", job_id), src.key("leader"))
                if pipe.get(src.key("leader")) != leader:
                    return False  # the shard's next leader finishes it
                if pipe.get(src.key("job", job_id)) != raw:
                    raise redis.WatchError
                pipe.multi()
                pipe.delete(src.key("job", job_id))
                totals.count(pipe, src.key(totals.KEY), job, None)
                figures.track(pipe, src.key(figures.KEY), job, None)
                pipe.zrem(src.key("jobs"), job_id)
                pipe.srem(src.key("active"), job_id)
                pipe.zrem(src.key(overdue.KEY), job_id)
                pipe.hset(src.key(ROUTE), job_id, target)
                pipe.execute()
            except redis.WatchError:  # changed since the copy: the move is off, the next pass looks again
                return _call_off(src, dst, job_id)
    _land(dst, job_id, source, now)
    src.redis.hdel(src.key(MOVING), job_id)
    return True


def forget_routes(shards: list[Store], job_ids: list[str]) -> None:
    """Delete the routes to jobs that retention forgot (store/retention.py): in every shard, since a job moved there
    and back left one where it had been too. Not in the forget's transaction (other slots): a server that dies
    between the two leaves a few bytes a moved job."""
    if len(shards) < 2 or not job_ids:
        return
    for shard in shards:
        shard.redis.hdel(shard.key(ROUTE), *job_ids)


def _call_off(src: Store, dst: Store, job_id: str) -> bool:
    """Undo a move not handed over: the job back in the source's queue if it still waits, the copy deleted."""
    with src.redis.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(src.key("job", job_id))
            raw = pipe.get(src.key("job", job_id))
            pipe.multi()
            if raw is not None:
                src._index(pipe, Job.model_validate_json(raw))
            pipe.hdel(src.key(MOVING), job_id)
            pipe.execute()
        except redis.WatchError:
            return False  # changed again: the note stays, the next pass calls it off
    dst.redis.delete(dst.key("job", job_id))
    dst.redis.hdel(dst.key(HANDED), job_id)
    return False


def _land(dst: Store, job_id: str, source: int, now: datetime) -> None:
    """Step 4: the copy joins the target's job list and, if it waits, its queue, with an event (once)."""
    with dst.redis.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(dst.key("job", job_id))
                raw = pipe.get(dst.key("job", job_id))
                if raw is None:  # a note of a move whose job is gone from both shards: nothing to land
                    return
                job = Job.model_validate_json(raw)
                landed = pipe.zscore(dst.key("jobs"), job_id) is not None
                handed = pipe.hget(dst.key(HANDED), job_id)
                pipe.multi()
                pipe.zadd(dst.key("jobs"), {job_id: job.submitted_at.timestamp()})
                dst._index(pipe, job)
                figures.track(pipe, dst.key(figures.KEY), None, job)  # as it is now: changes since were tracked
                pipe.hdel(dst.key(HANDED), job_id)
                if not landed:  # a change since the hand-over (a cancel through the route) counted from it
                    totals.count(pipe, dst.key(totals.KEY), None, Job.model_validate_json(handed) if handed else job)
                    dst.event(pipe, job_id, job.state, now, f"moved from shard {source}: no agent there fits it")
                pipe.execute()
                return
            except redis.WatchError:  # a client changed it (it is routed here already): read it again
                continue
