"""Clocks: the real one, and a settable one for tests and the backtest (one core, two clocks)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone


class SystemClock:
    """Wall-clock time in UTC."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start: datetime):
        self._now = start if start.tzinfo else start.replace(tzinfo=timezone.utc)

    def now(self) -> datetime:
        return self._now

    def advance(self, **delta: float) -> datetime:
        """Move forward by a timedelta's keyword arguments (hours=1.5, ...)."""
        self._now += timedelta(**delta)
        return self._now
