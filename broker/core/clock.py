"""Clocks: the real one, and a settable one for tests and the backtest (one core, two clocks)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta


class SystemClock:
    """Wall-clock time in UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def at(self, epoch_s: float) -> datetime:
        """This clock's time for a wall-clock timestamp (when an agent saw something happen)."""
        return datetime.fromtimestamp(epoch_s, UTC)


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start: datetime):
        self._now = start if start.tzinfo else start.replace(tzinfo=UTC)

    def now(self) -> datetime:
        return self._now

    def at(self, epoch_s: float) -> datetime:
        return self._now

    def advance(self, **delta: float) -> datetime:
        """Move forward by a timedelta's keyword arguments (hours=1.5, ...)."""
        self._now += timedelta(**delta)
        return self._now


class SimulatedClock(ManualClock):
    """The backtest's clock: moved by the simulation, and events carry simulated epoch times."""

    def at(self, epoch_s: float) -> datetime:
        return datetime.fromtimestamp(epoch_s, UTC)


class ScaledClock:
    """Wall time running `speedup` times faster from now: the demo's compressed hours."""

    def __init__(self, speedup: float = 1.0, start: datetime | None = None):
        self.speedup = speedup
        self._start = start or datetime.now(UTC)
        self._origin, self._origin_epoch = time.monotonic(), time.time()

    def now(self) -> datetime:
        return self._start + timedelta(seconds=(time.monotonic() - self._origin) * self.speedup)

    def at(self, epoch_s: float) -> datetime:
        return self._start + timedelta(seconds=(epoch_s - self._origin_epoch) * self.speedup)
