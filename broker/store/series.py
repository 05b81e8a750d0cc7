"""A number per member over time, stored only where it changes: prices per offer (prices.py), the spot capacity
our fleet had per zone (capacity.py).

Keys (beside the store's own, same prefix):

    {p}{kind}:{member}   ZSET   "{epoch}|{value}" scored by epoch seconds: one member per change
    {p}{index}           SET    members with a series

A point is appended only when it differs from the value in effect at its time, checked and written in one Lua
call, so writing the same values again writes nothing and two writers racing cannot both append one change.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from broker.store.jobs import Store

_APPEND_IF_CHANGED = """
local last = redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[1], '-inf', 'LIMIT', 0, 1)
if last[1] then
  local value = string.match(last[1], '|(.*)$')
  if tonumber(value) == tonumber(ARGV[2]) then return 0 end
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[1] .. '|' .. ARGV[2])
redis.call('SADD', KEYS[2], ARGV[3])
return 1
"""


class ChangeSeries:
    """Append-only-on-change points (epoch seconds, value) per member, under one kind of key."""

    def __init__(self, store: Store, kind: str, index: str):
        self.redis, self._key = store.redis, store.key
        self.kind, self.index = kind, index

    def append(self, points: Iterable[tuple[str, float, float]]) -> int:
        """Append the points (member, epoch, value), in time order, that change a member's value; returns how many."""
        with self.redis.pipeline(transaction=False) as pipe:
            for member, epoch, value in points:  # EVAL by hand: a cluster pipeline refuses registered scripts
                keys = [self._key(self.kind, member), self._key(self.index)]
                pipe.execute_command("EVAL", _APPEND_IF_CHANGED, 2, *keys, f"{epoch:.3f}", repr(float(value)), member)
            return sum(pipe.execute())

    def watch(self, members: Iterable[str]) -> None:
        """Members to record from now on, before they have a value (the next writer's append starts their series)."""
        members = list(members)
        if members:
            self.redis.sadd(self._key(self.index), *members)

    def forget(self, members: Iterable[str]) -> None:
        """Members to record no more, with what was recorded of them."""
        members = list(members)
        with self.redis.pipeline(transaction=False) as pipe:
            for member in members:
                pipe.delete(self._key(self.kind, member))
                pipe.srem(self._key(self.index), member)
            pipe.execute()

    def members(self) -> list[str]:
        return sorted(self.redis.smembers(self._key(self.index)))

    def points(self, member: str, since: float = -math.inf) -> list[tuple[float, float]]:
        """The member's changes from `since` on, led by the value in effect at `since`, oldest first."""
        key = self._key(self.kind, member)
        lead = self.redis.zrevrangebyscore(key, since, "-inf", start=0, num=1) if math.isfinite(since) else []
        return [_point(m) for m in [*lead, *self.redis.zrangebyscore(key, f"({since}", "+inf")]]

    def latest(self) -> dict[str, tuple[float, float]]:
        """Each member's newest (epoch, value)."""
        members = self.members()
        with self.redis.pipeline(transaction=False) as pipe:
            for member in members:
                pipe.zrange(self._key(self.kind, member), -1, -1)
            newest = pipe.execute()
        return {member: _point(found[0]) for member, found in zip(members, newest) if found}


def _point(member: str) -> tuple[float, float]:
    epoch, value = member.split("|")
    return float(epoch), float(value)
