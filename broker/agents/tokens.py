"""Agent registration tokens: an expiry and an HMAC-SHA256 of (agent id, expiry) under the broker's secret.

The broker (`broker agents token`) issues one per agent; the agent registers with it; the server
gives work only to agents whose token verifies, and drops and logs the others. Without a secret
configured (the embedded single-machine default) no token is asked for.

A pool's instances do not know their names before they boot, so `broker agents provision` issues one
token per pool, signed for "pool:<pool>": it admits agents named "<pool>.<host>" only.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime


def _signature(secret: str, agent_id: str, expires: int) -> str:
    return hmac.new(secret.encode(), f"{agent_id}|{expires}".encode(), hashlib.sha256).hexdigest()


def issue(secret: str, agent_id: str, expires_at: datetime) -> str:
    """A token for `agent_id`, valid until `expires_at`."""
    expires = int(expires_at.timestamp())
    return f"{expires}.{_signature(secret, agent_id, expires)}"


def issue_pool(secret: str, pool: str, expires_at: datetime) -> str:
    """A token for every agent of `pool` (named "<pool>.<host>"), valid until `expires_at`."""
    return f"pool:{pool}:{issue(secret, f'pool:{pool}', expires_at)}"


def refusal(secret: str, agent_id: str, token: str | None, now: datetime) -> str | None:
    """Why the token does not admit the agent now, or None when it does."""
    if not token:
        return "no registration token"
    if token.startswith("pool:"):
        _, pool, token = token.split(":", 2) if token.count(":") >= 2 else ("", "", "")
        if not pool or not agent_id.startswith(f"{pool}."):
            return f"registration token is for the agents of pool {pool!r}, named {pool}.<host>"
        agent_id = f"pool:{pool}"
    expires, _, signature = token.partition(".")
    if not expires.isdigit() or len(signature) != 64:
        return "malformed registration token"
    if not hmac.compare_digest(signature, _signature(secret, agent_id, int(expires))):
        return "registration token does not match this agent id"
    if int(expires) < now.timestamp():
        return f"registration token expired at {datetime.fromtimestamp(int(expires), UTC):%Y-%m-%d %H:%M} UTC"
    return None


def expires_at(token: str | None) -> datetime | None:
    """When a token stops admitting registrations (None: no token, or not one of this form)."""
    expires = (token or "").rsplit(":", 1)[-1].partition(".")[0]
    return datetime.fromtimestamp(int(expires), UTC) if expires.isdigit() else None
