"""A replica's loop of rounds: back to back, riding out a Redis outage longer than the store's own patience."""

from __future__ import annotations

import logging
import time

import redis

log = logging.getLogger(__name__)


def serve_rounds(round_, name: str, until) -> None:
    """Run rounds back to back until `until()`, riding out a Redis outage longer than the store's own patience.
    No pause between rounds: an idle round waits in its read of reports, and a busy one has work waiting."""
    while not until():
        try:
            round_()
        except redis.ConnectionError as err:  # Redis gone for longer than the store rides out: retry
            log.warning("server=%s redis unreachable (%s); retrying in 1 s", name, err)
            time.sleep(1.0)
