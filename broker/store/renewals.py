"""Registration tokens the broker renewed for admitted agent processes (agents/tokens.py), beside the store's own
keys (same prefix). Only the agent's own ACL user reads its key (store/acl.py).

{p}renewed:{agent}  STRING  the token, expiring when it does
"""

from __future__ import annotations

from datetime import datetime

from broker.store.jobs import Store


def renewed_tokens(store: Store, agent_ids: list[str]) -> dict[str, str | None]:
    """The token renewed for each of these agents, None where there is none (one MGET)."""
    values = store.redis.mget([store.key("renewed", i) for i in agent_ids]) if agent_ids else []
    return dict(zip(agent_ids, values))


def put_renewed(store: Store, agent_id: str, token: str, until: datetime) -> None:
    store.redis.set(store.key("renewed", agent_id), token, exat=int(until.timestamp()))


def renewed_token(store: Store, agent_id: str) -> str | None:
    """The agent's renewed token, as the agent reads it."""
    return store.redis.get(store.key("renewed", agent_id))
