"""Price history in Redis: per offer, only the changes, in time order.

Keys (beside the store's own, same prefix):

    {p}price:{offer id}   ZSET    "{epoch}|{usd}" scored by epoch seconds: one member per price change
    {p}priced             SET     offer ids with a history
    {p}refreshed          HASH    source (aws, gcp, azure, a file) -> ISO time of its last successful refresh
    {p}evictions          HASH    "cloud|region|instance type" -> the cloud's eviction-rate band
                                  (Azure: "0-5" ... "20+")

A point is appended only when it differs from the price in effect at its time (series.ChangeSeries),
so a refresh that repeats the same prices writes nothing and two refreshes racing cannot both
append the same change.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd

from broker.store.jobs import Store
from broker.store.series import ChangeSeries


class PriceHistory:
    """Append-only-on-change price points per offer, and when each source last refreshed."""

    def __init__(self, store: Store):
        self.redis, self._key = store.redis, store.key
        self.prices = ChangeSeries(store, "price", "priced")

    def record(self, points: pd.DataFrame) -> int:
        """Append the points (offer, usd, at) that change an offer's price; returns how many were appended."""
        ordered = points.sort_values("at", kind="stable")
        epochs = (pd.Timestamp(at).timestamp() for at in ordered["at"])
        return self.prices.append(zip(ordered["offer"], epochs, ordered["usd"]))

    def series(self, offer: str) -> pd.DataFrame:
        """Every recorded change of one offer's price, oldest first."""
        rows = [(datetime.fromtimestamp(epoch, UTC), usd) for epoch, usd in self.prices.points(offer)]
        return pd.DataFrame(rows, columns=["at", "usd"])

    def offers(self) -> list[str]:
        return self.prices.members()

    def latest(self) -> dict[str, tuple[float, datetime]]:
        """Each priced offer's newest price and when it was seen."""
        return {o: (usd, datetime.fromtimestamp(epoch, UTC)) for o, (epoch, usd) in self.prices.latest().items()}

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
