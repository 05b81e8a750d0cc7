"""Registration tokens the broker renewed for admitted agent processes (agents/tokens.py), beside the store's own
keys (same prefix). Only the agent's own ACL user reads its key (store/acl.py).

{p}renewed:{agent}  STRING  the token, expiring when it does
{p}pool-token:{pool}  STRING  a pool's token renewed with its agents' (the pool's user reads it): its new instances
                      boot with the token `broker agents provision` wrote into their boot data, which may have ended
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


def put_pool_token(store: Store, pool: str, token: str, until: datetime) -> None:
    store.redis.set(store.key("pool-token", pool), token, exat=int(until.timestamp()))


def pool_tokens(shards: list[Store], pool: str) -> list[str | None]:
    """The pool's renewed token in each shard (each shard's server renews it with the pool's agents there)."""
    return [shard.redis.get(shard.key("pool-token", pool)) for shard in shards]


def drop_refused(
    store: Store, agent_id: str, token: str | None, stale_pool: str | None, shards: list[Store] | None = None
) -> None:
    """Forget the renewed tokens an agent refused with `token` might have read (signed with a secret since replaced,
    say), so its next start registers with the one it is given: its own, and its pool's where that is `token` and
    admits no agent of the pool (not one refused for its name: the pool's others are admitted with it), in every
    shard of `shards` (default `store`): a pool's agent reads them all and takes the longest."""
    store.redis.delete(store.key("renewed", agent_id))
    if stale_pool is not None and token is not None:
        for shard in shards or [store]:
            shard.redis.eval(_DELETE_IF, 1, shard.key("pool-token", stale_pool), token)


_DELETE_IF = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
