"""Moving a waiting job to another shard: for a job whose shard has no agent that fits it while another shard has.

A job lives in the shard its id hashes to until it moves. The shard it leaves keeps a route to the one it went to
(`{p}route`: job -> "shard:epoch"), and ShardedStore.of_job follows the routes from the job's home shard. A move spans
two shards, so two cluster slots, and no one transaction can hold it. It goes in steps, each one transaction, with
its intent durable first (`{p}moving` in the source: job -> "target:epoch"), so a mover that dies midway is finished
by the next leader of the source, and no server ever sees the job waiting in two shards:
1. take the job out of the source's queue and note the move (the source's planning lease and the job watched);
2. write a copy in the target, unindexed: no server and no list sees it yet (and the copy as handed over,
   `{p}handed`: job -> "epoch text");
3. in the source, if the job still waits as copied: delete it and write the route; else the move is off (the job
   goes back to the source's queue if it still waits there) and the copy is deleted;
4. index the copy in the target (its queue, its job list, its totals as handed over in 2, an event), then clear
   the note. Between 3 and 4 the job is in neither shard's totals (store/totals.py).

Each move has an epoch, a number that rises over the store's life (`{p}move-epochs` in shard 0), so the steps of one
move are told from another's: a route is followed only to a later move (a shard the job comes back to keeps the route
of its earlier stay, and the job is found there), and a step in the target acts only on its own move's copy. A mover
that dies, or is deposed and goes on later, can then neither break a job's routes nor undo a newer move, and a copy
it writes late, for a move that is over, it deletes again. (A route written before epochs reads as epoch 0: routes
of that time are followed as they were.)
"""

from __future__ import annotations

from datetime import datetime

import redis

from broker.domain.model import Job
from broker.store import figures, overdue, totals
from broker.store.jobs import Store

MOVING, ROUTE, HANDED, EPOCHS = "moving", "route", "handed", "move-epochs"


def mark(shard: int, epoch: int) -> str:
    return f"{shard}:{epoch}"


def parse_mark(text: str) -> tuple[int, int]:
    """(shard, epoch) of a note or a route."""
    shard, _, epoch = text.partition(":")
    return int(shard), int(epoch or 0)


def move_job(shards: list[Store], job_id: str, source: int, target: int, leader: str, now: datetime) -> bool:
    """Move a waiting job from shard `source`, whose planning lease `leader` holds, to shard `target`; False when it
    no longer waits there or the lease is lost (nothing moved)."""
    src = shards[source]
    with src.redis.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(src.key("job", job_id), src.key("leader"))
            queued = pipe.zscore(src.key("pending"), job_id) is not None  # not a move noted already
            if pipe.get(src.key("leader")) != leader or not pipe.exists(src.key("job", job_id)) or not queued:
                return False
            epoch = shards[0].redis.incr(shards[0].key(EPOCHS))  # another slot: beside the transaction, not in it
            pipe.multi()
            pipe.zrem(src.key("pending"), job_id)
            pipe.hset(src.key(MOVING), job_id, mark(target, epoch))
            pipe.execute()
        except redis.WatchError:  # the job changed (a cancel, a dispatch): it stays
            return False
    return finish_move(shards, job_id, source, (target, epoch), leader, now)


def unfinished_moves(src: Store) -> dict[str, tuple[int, int]]:
    """The moves out of this shard that a mover noted and did not finish: job -> (target shard, epoch)."""
    return {job_id: parse_mark(text) for job_id, text in src.redis.hgetall(src.key(MOVING)).items()}


def finish_move(
    shards: list[Store], job_id: str, source: int, move: tuple[int, int], leader: str, now: datetime
) -> bool:
    """Steps 2 to 4 of a noted move (`move`: its target and epoch), from wherever it stopped; True once the job waits
    in the target."""
    src, dst = shards[source], shards[move[0]]
    raw = src.redis.get(src.key("job", job_id))
    if raw is not None:  # not yet handed over: the target's copy (if any) is unindexed, so it is rewritten
        job = Job.model_validate_json(raw)
        if not job.pending or not _hand_over(dst, job_id, move[1], raw):
            return _call_off(src, dst, job_id, move, leader)
        with src.redis.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(src.key("job", job_id), src.key("leader"))
                if pipe.get(src.key("leader")) != leader or pipe.get(src.key("job", job_id)) != raw:
                    raise redis.WatchError  # the lease lost, or the job changed since the copy
                pipe.multi()
                pipe.delete(src.key("job", job_id))
                totals.count(pipe, src.key(totals.KEY), job, None)
                figures.track(pipe, src.key(figures.KEY), job, None)
                pipe.zrem(src.key("jobs"), job_id)
                pipe.zrem(src.key("pending"), job_id)  # a change since the note (an amend) queued it again
                pipe.srem(src.key("active"), job_id)
                pipe.zrem(src.key(overdue.KEY), job_id)
                pipe.hset(src.key(ROUTE), job_id, mark(*move))
                pipe.execute()
            except redis.WatchError:  # the move is off, or the shard's leader finishes it (_call_off)
                return _call_off(src, dst, job_id, move, leader)
    _land(dst, job_id, source, move[1], now)
    _clear_note(src, job_id, move)
    return True


def forget_routes(shards: list[Store], job_ids: list[str]) -> None:
    """Delete the routes to jobs that retention forgot (store/retention.py): in every shard, since a job moved there
    and back left one where it had been too. Not in the forget's transaction (other slots): a server that dies
    between the two leaves a few bytes a moved job."""
    if len(shards) < 2 or not job_ids:
        return
    for shard in shards:
        shard.redis.hdel(shard.key(ROUTE), *job_ids)


def parse_handed(text: str | None) -> tuple[int, str] | None:
    """(epoch, job text) of a copy handed over (one written before epochs: epoch 0), or None."""
    if text is None:
        return None
    if text.startswith("{"):
        return 0, text
    epoch, _, raw = text.partition(" ")
    return int(epoch), raw


def _hand_over(dst: Store, job_id: str, epoch: int, raw: str) -> bool:
    """Step 2: the copy in the target, unless the target holds the job itself (landed there) or a later move's copy:
    then this move is over (False)."""
    with dst.redis.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(dst.key("job", job_id), dst.key(HANDED))
                held = parse_handed(pipe.hget(dst.key(HANDED), job_id))
                if held[0] > epoch if held else pipe.exists(dst.key("job", job_id)):
                    return False
                pipe.multi()
                pipe.set(dst.key("job", job_id), raw)
                pipe.hset(dst.key(HANDED), job_id, f"{epoch} {raw}")  # what it lands as in the totals
                pipe.execute()
                return True
            except redis.WatchError:  # another job handed over there meanwhile: look again
                continue


def _call_off(src: Store, dst: Store, job_id: str, move: tuple[int, int], leader: str) -> bool:
    """Undo a move not handed over, while it is the source's note and `leader` leads the source: the job back in the
    source's queue if it still waits, this move's copy deleted. A deposed mover leaves a move still noted to the
    shard's leader; one no longer noted was finished or called off, so a copy of it (written since by a mover that
    went on late) would never land: deleted."""
    with src.redis.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(src.key("job", job_id), src.key(MOVING), src.key("leader"))
            noted = pipe.hget(src.key(MOVING), job_id)
            if noted is not None and parse_mark(noted) == move:
                if pipe.get(src.key("leader")) != leader:
                    return False  # the shard's leader finishes it or calls it off
                raw = pipe.get(src.key("job", job_id))
                pipe.multi()
                if raw is not None:
                    src._index(pipe, Job.model_validate_json(raw))
                pipe.hdel(src.key(MOVING), job_id)
                pipe.execute()
        except redis.WatchError:
            return False  # changed again: the note stays, the next pass calls it off
    with dst.redis.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(dst.key(HANDED))
                held = parse_handed(pipe.hget(dst.key(HANDED), job_id))
                if held is None or held[0] != move[1]:
                    return False  # no copy of this move there
                pipe.multi()
                pipe.delete(dst.key("job", job_id))
                pipe.hdel(dst.key(HANDED), job_id)
                pipe.execute()
                return False
            except redis.WatchError:
                continue


def _land(dst: Store, job_id: str, source: int, epoch: int, now: datetime) -> None:
    """Step 4: this move's copy joins the target's job list and, if it waits, its queue, with an event (once)."""
    with dst.redis.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(dst.key("job", job_id), dst.key(HANDED), dst.key(ROUTE))
                raw = pipe.get(dst.key("job", job_id))
                held = parse_handed(pipe.hget(dst.key(HANDED), job_id))
                if raw is None or (held is not None and held[0] != epoch):
                    return  # gone from both shards (a note of a finished move), or another move's copy
                job = Job.model_validate_json(raw)
                landed = pipe.zscore(dst.key("jobs"), job_id) is not None
                route = pipe.hget(dst.key(ROUTE), job_id)
                pipe.multi()
                if route is not None and parse_mark(route)[1] < epoch:  # its earlier stay's: no longer followed
                    pipe.hdel(dst.key(ROUTE), job_id)
                pipe.zadd(dst.key("jobs"), {job_id: job.submitted_at.timestamp()})
                dst._index(pipe, job)
                figures.track(pipe, dst.key(figures.KEY), None, job)  # as it is now: changes since were tracked
                pipe.hdel(dst.key(HANDED), job_id)
                if not landed:  # a change since the hand-over (a cancel through the route) counted from it
                    totals.count(pipe, dst.key(totals.KEY), None, Job.model_validate_json(held[1]) if held else job)
                    dst.event(pipe, job_id, job.state, now, f"moved from shard {source}: no agent there fits it")
                pipe.execute()
                return
            except redis.WatchError:  # a client changed it (it is routed here already): read it again
                continue


def _clear_note(src: Store, job_id: str, move: tuple[int, int]) -> None:
    """Clear the source's note of a move that landed, if it is still this move's."""
    with src.redis.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(src.key(MOVING))
            noted = pipe.hget(src.key(MOVING), job_id)
            if noted is not None and parse_mark(noted) == move:
                pipe.multi()
                pipe.hdel(src.key(MOVING), job_id)
                pipe.execute()
        except redis.WatchError:  # another note changed: the next pass finds this move landed and clears it
            pass
