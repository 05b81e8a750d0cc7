"""A fix the user is told to type: money up to the cent, times up to the minute (the flags take no finer), each
rounded up so the value admits what it was worked out from (a budget of a cost rounded down refused it again)."""

from __future__ import annotations

import math
from datetime import UTC, datetime


def up_to_cent(usd: float) -> float:
    """The least whole-cent amount at or above `usd` (a whole cent stays: float noise does not add one)."""
    return math.ceil(usd * 100 - 1e-9) / 100


def up_to_minute(at: datetime) -> datetime:
    """The first whole minute at or after `at` (UTC)."""
    return datetime.fromtimestamp(60 * math.ceil(at.timestamp() / 60), UTC)
