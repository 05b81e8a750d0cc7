"""Settings, read once from `BROKER_*` environment variables at start-up and passed down."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from broker.domain.errors import BrokerError
from broker.planning import FILL_ORDERS

PREFIX = re.compile(r"^[A-Za-z0-9:._-]*$")  # BROKER_PREFIX's characters (the Terraform modules' key_prefix too)
MIN_SECRET_CHARS = 16  # BROKER_AGENT_SECRET's least length (`openssl rand -hex 32` gives 64)


@dataclass(frozen=True)
class Settings:
    redis_url: str | None  # BROKER_REDIS_URL; None means the embedded private redis-server
    home: Path  # BROKER_HOME: the embedded server's data and state
    prices_dir: Path | None  # BROKER_PRICES_DIR: snapshot CSVs; None means the packaged copy
    policy: str | None  # BROKER_POLICY: the planner used for quotes (None: the servers', store/policy.py)
    checkpoints: str  # BROKER_CHECKPOINTS: fsspec URL of the checkpoint store
    prefix: str = "broker:"  # BROKER_PREFIX: key prefix in Redis
    shards: int | None = None  # BROKER_SHARDS: jobs and agents split over this many shards (None: as the store is)
    round_budget_usd: float | None = None  # BROKER_ROUND_BUDGET_USD: expected spend one planning round may commit
    agent_secret: str | None = field(
        default=None, repr=False
    )  # BROKER_AGENT_SECRET: agents need a token signed with it
    redis_outage_s: float = 120.0  # BROKER_REDIS_OUTAGE_S: how long the server and agents ride out a Redis restart
    fill_order: str | None = (
        None  # BROKER_FILL_ORDER: sjf, makespan or deadline for bubble executors; unset: the plan's
    )

    def policy_options(self) -> dict:
        """Keyword arguments for the active policy."""
        return {} if self.round_budget_usd is None else {"budget_usd": self.round_budget_usd}

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        """Settings from the environment, with the documented defaults."""
        home = env.get("BROKER_HOME") or Path(env.get("XDG_DATA_HOME") or Path.home() / ".local/share") / "broker"
        prices = env.get("BROKER_PRICES_DIR")
        return cls(
            redis_url=env.get("BROKER_REDIS_URL") or None,
            home=Path(home),
            prices_dir=Path(prices) if prices else None,
            policy=env.get("BROKER_POLICY") or None,
            checkpoints=env.get("BROKER_CHECKPOINTS") or str(Path(home) / "checkpoints"),
            prefix=_prefix(env),
            shards=_shards(env),
            round_budget_usd=_positive(env, "BROKER_ROUND_BUDGET_USD"),
            agent_secret=_agent_secret(env),
            redis_outage_s=_positive(env, "BROKER_REDIS_OUTAGE_S", "seconds", 120) or 120.0,
            fill_order=_fill_order(env),
        )


def _prefix(env: Mapping[str, str]) -> str:
    """The key prefix: glob characters would widen the agents' ACL key patterns (store/acl.py) and braces would
    take the shards' hash tags (store/shards.py), so only plain characters."""
    prefix = env.get("BROKER_PREFIX", "broker:")
    if not PREFIX.match(prefix):
        raise BrokerError(
            f"BROKER_PREFIX: {prefix!r} has characters keys cannot carry; use letters, digits, ':', '.', '_' or '-'"
        )
    return prefix


def _shards(env: Mapping[str, str]) -> int | None:
    """BROKER_SHARDS; None when unset: the store's own layout is followed (store/layout.py)."""
    text = env.get("BROKER_SHARDS")
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise BrokerError(f"BROKER_SHARDS: {text!r} is not a shard count; set a whole number like 4, or unset it")
    return int(text)


def _agent_secret(env: Mapping[str, str]) -> str | None:
    """The key that signs agents' registration tokens (HMAC-SHA256): one a few guesses find admits any agent."""
    secret = env.get("BROKER_AGENT_SECRET") or None
    if secret is not None and len(secret) < MIN_SECRET_CHARS:
        raise BrokerError(
            f"BROKER_AGENT_SECRET: {len(secret)} characters is too short to sign agents' tokens; set "
            f"{MIN_SECRET_CHARS} or more random ones (`openssl rand -hex 32`), or unset it"
        )
    return secret


def _fill_order(env: Mapping[str, str]) -> str | None:
    order = env.get("BROKER_FILL_ORDER") or None
    if order is not None and order not in FILL_ORDERS:
        raise BrokerError(
            f"BROKER_FILL_ORDER: {order!r} is not a fill policy; set one of {', '.join(FILL_ORDERS)} or unset it"
        )
    return order


def _positive(env: Mapping[str, str], name: str, unit: str = "USD", example: float = 500) -> float | None:
    text = env.get(name)
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value > 0 and math.isfinite(value)):  # inf overflowed in the store's retries: an internal error
        raise BrokerError(
            f"{name}: {text!r} is not a positive number of {unit}; set it like {name}={example} or unset it"
        )
    return value
