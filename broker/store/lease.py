"""The planning lease of a shard: one server replica plans it at a time, and every dispatch carries the lease's
fencing token, incremented each time the lease changes hands (keys {p}leader and {p}leader-token, jobs.py's schema).
Store inherits it."""

from __future__ import annotations

# Keep the planning lease if we hold it, take it if nobody does; the fencing token, or nil for a standby.
LEAD = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('GET', KEYS[2]))
end
if holder then
  return nil
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return redis.call('INCR', KEYS[2])
"""

RESIGN = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class PlanningLease:
    """Take, keep and give up the planning lease; needs the Store's `redis` and `_key`."""

    def lead(self, holder: str, lease_ms: int) -> int | None:
        """Take or keep the planning lease: its fencing token while `holder` has it, None while another does."""
        token = self.redis.eval(LEAD, 2, self._key("leader"), self._key("leader-token"), holder, lease_ms)
        return None if token is None else int(token)

    def resign(self, holder: str) -> bool:
        """Give up the planning lease if `holder` has it (another replica is to plan here); True if it did."""
        return bool(self.redis.eval(RESIGN, 1, self._key("leader"), holder))

    def planner(self) -> str | None:
        """The replica that holds the planning lease now, or None when no server plans."""
        return self.redis.get(self._key("leader"))
