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
import os
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

# an admitted agent process is given a token of its own this long before its token ends, lasting RENEWED_FOR: its
# restarts (a crash, a Redis outage, a reboot) register with it (`broker agent --token-file`), not with a pool's
# token that ended while it ran
RENEW_WITHIN = timedelta(days=1)
RENEWED_FOR = timedelta(days=7)


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


def due(token: str | None, now: datetime) -> bool:
    """Whether an admitted process holding `token` is to be given a new one: it ends within RENEW_WITHIN, or has."""
    ends = expires_at(token)
    return ends is not None and ends - now < RENEW_WITHIN


def renewed(secret: str, agent_id: str, held: str | None, now: datetime) -> str:
    """The token an admitted process of `agent_id`, which registered with `held`, registers with from now on, for
    RENEWED_FOR: its pool's where it was one of a pool's (new instances of the pool read it too: core/renewal.py), its
    own id's otherwise."""
    pool = pool_of(held)
    return issue_pool(secret, pool, now + RENEWED_FOR) if pool else issue(secret, agent_id, now + RENEWED_FOR)


def pool_of(token: str | None) -> str | None:
    """The pool a pool's token admits the agents of, None for any other."""
    parts = (token or "").split(":", 2)
    return parts[1] or None if len(parts) == 3 and parts[0] == "pool" else None


def stale_pool(secret: str, token: str | None, now: datetime) -> str | None:
    """The pool of a pool's token that admits none of its agents now (ended, or signed with another secret)."""
    pool = pool_of(token)
    return pool if pool and refusal(secret, f"{pool}.any", token, now) else None


def longest(*tokens: str | None) -> str | None:
    """Of the tokens given, the one that admits longest (its form checked where it is verified)."""
    held = [t for t in tokens if t]
    return max(held, key=lambda t: expires_at(t) or datetime.min.replace(tzinfo=UTC), default=None)


def read_file(path: Path) -> str | None:
    """The token kept in `path` (`broker agent --token-file`), None while there is none."""
    try:
        return path.read_text(errors="replace").strip() or None  # not a token: refused, and the file removed
    except FileNotFoundError:
        return None


def write_file(path: Path, token: str) -> None:
    """Keep `token` in `path`, readable by its owner alone; a crash mid-write leaves the previous one whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # created 0600
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
