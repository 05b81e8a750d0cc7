"""Price history in Redis: per offer, only the changes, in time order.

Keys (beside the store's own, same prefix):

    {p}price:{offer id}   ZSET    "{epoch}|{usd}" scored by epoch seconds: one member per price change
    {p}priced             SET     offer ids with a history
    {p}refreshed          HASH    source (aws, gcp, azure, a file) -> ISO time of its last successful refresh
    {p}evictions          HASH    "cloud|region|instance type" -> the cloud's eviction-rate band
                                  (Azure: "0-5" ... "20+")

A point is appended only when it differs from the price in effect at its time, checked and
written in one Lua call, so a refresh that repeats the same prices writes nothing and two
refreshes racing cannot both append the same change.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd

from broker.store.jobs import Store

_APPEND_IF_CHANGED = """
local last = redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[1], '-inf', 'LIMIT', 0, 1)
if last[1] then
  local usd = string.match(last[1], '|(.*)$')
  if tonumber(usd) == tonumber(ARGV[2]) then return 0 end
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[1] .. '|' .. ARGV[2])
redis.call('SADD', KEYS[2], ARGV[3])
return 1
"""


class PriceHistory:
    """Append-only-on-change price points per offer, and when each source last refreshed."""

    def __init__(self, store: Store):
        self.redis, self._key = store.redis, store.key
        self._append = self.redis.register_script(_APPEND_IF_CHANGED)

    def record(self, points: pd.DataFrame) -> int:
        """Append the points (offer, usd, at) that change an offer's price; returns how many were appended."""
        ordered = points.sort_values("at", kind="stable")
        with self.redis.pipeline(transaction=False) as pipe:
            for offer, usd, at in zip(ordered["offer"], ordered["usd"], ordered["at"]):
                self._append(
                    keys=[self._key("price", offer), self._key("priced")],
                    args=[_epoch(at), repr(float(usd)), offer],
                    client=pipe,
                )
            appended = sum(pipe.execute())
        return appended

    def series(self, offer: str) -> pd.DataFrame:
        """Every recorded change of one offer's price, oldest first."""
        members = self.redis.zrange(self._key("price", offer), 0, -1)
        rows = [(datetime.fromtimestamp(float(m.split("|")[0]), UTC), float(m.split("|")[1])) for m in members]
        return pd.DataFrame(rows, columns=["at", "usd"])

    def offers(self) -> list[str]:
        return sorted(self.redis.smembers(self._key("priced")))

    def latest(self) -> dict[str, tuple[float, datetime]]:
        """Each priced offer's newest price and when it was seen."""
        ids = self.offers()
        with self.redis.pipeline(transaction=False) as pipe:
            for offer in ids:
                pipe.zrange(self._key("price", offer), -1, -1)
            newest = pipe.execute()
        out = {}
        for offer, members in zip(ids, newest):
            if members:
                epoch, usd = members[0].split("|")
                out[offer] = (float(usd), datetime.fromtimestamp(float(epoch), UTC))
        return out

    def record_bands(self, bands: dict[tuple[str, str, str], str]) -> None:
        """Store the newest eviction-rate band per (cloud, region, instance type)."""
        if bands:
            self.redis.hset(self._key("evictions"), mapping={"|".join(k): v for k, v in bands.items()})

    def bands(self) -> dict[tuple[str, str, str], str]:
        return {tuple(k.split("|")): v for k, v in self.redis.hgetall(self._key("evictions")).items()}

    def mark_refreshed(self, source: str, at: datetime) -> None:
        self.redis.hset(self._key("refreshed"), source, at.isoformat())

    def refreshed(self) -> dict[str, datetime]:
        return {k: datetime.fromisoformat(v) for k, v in self.redis.hgetall(self._key("refreshed")).items()}


def _epoch(at) -> str:
    return f"{pd.Timestamp(at).timestamp():.3f}"
