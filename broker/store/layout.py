"""The store's layout: how many shards its keys are split into (store/shards.py), recorded by the servers
(`{prefix}layout`), so every client splits it the same way. A client whose BROKER_SHARDS is unset follows the store;
one whose BROKER_SHARDS says otherwise is refused, naming the count. Before, a laptop's CLI (BROKER_SHARDS unset: 1)
beside servers with 4 wrote jobs under keys no server reads, and they waited for good. A server may record another
count only while the store holds no job and no agent (a demo's server ran first, say). A single Redis used before any
count was recorded (by `broker run` alone) holds one shard's untagged keys: no one opens it split otherwise. Opening
a store as a client writes nothing: a refused command leaves no key behind.
"""

from __future__ import annotations

import redis
from redis.cluster import RedisCluster

from broker.domain.errors import BrokerError

KEY = "layout"


def shard_prefix(prefix: str, index: int, tagged: bool) -> str:
    return f"{prefix}{{{index}}}:" if tagged else prefix


def layout_key(shard: str) -> str:
    """The layout's key of the store a shard's prefix belongs to (its prefix without the shard's hash tag)."""
    return f"{shard[: shard.rindex('{')] if shard.endswith('}:') else shard}{KEY}"


def tagged(client, count: int) -> bool:
    """Whether the shards' keys carry hash tags: several shards, or any on a cluster."""
    return count > 1 or isinstance(client, RedisCluster)


def shard_count(client, prefix: str, given: int | None, claim: bool = False) -> int:
    """The number of shards to open the store with: the recorded one, else `given` (BROKER_SHARDS) or 1. A server
    (`claim`) records its count: another than the recorded one only on an empty store."""
    key = f"{prefix}{KEY}"
    try:
        recorded = client.get(key)
    except redis.exceptions.NoPermissionError:  # an agent's ACL user made before it could read it: BROKER_SHARDS
        return given or 1
    count = given or (int(recorded) if recorded is not None else 1)
    if recorded is not None and count != int(recorded) and not (claim and _empty(client, prefix, int(recorded))):
        recorded = int(recorded)
        raise BrokerError(
            f"BROKER_SHARDS: {given} here, but the store under BROKER_PREFIX {prefix!r} is split into {recorded} "
            f"shard{'s' * (recorded != 1)}; set BROKER_SHARDS={recorded} (or unset it: it follows the store)"
        )
    if recorded is None and count > 1 and not tagged(client, 1) and _holds_one_shard(client, prefix):
        raise BrokerError(  # a store used before any server recorded a count: its untagged keys are one shard's
            f"BROKER_SHARDS: {count} here, but the store under BROKER_PREFIX {prefix!r} holds the jobs or agents of "
            "one shard; unset BROKER_SHARDS (1), or start this split under another BROKER_PREFIX"
        )
    if claim:
        client.set(key, count)
    return count


def _holds_one_shard(client, prefix: str) -> bool:
    """Whether a single Redis's untagged keys (one shard's) hold jobs or agents; False where the user may not count
    them (an agent's ACL user: its BROKER_SHARDS stands)."""
    try:
        return not _empty(client, prefix, 1)
    except redis.exceptions.NoPermissionError:
        return False


def _empty(client, prefix: str, count: int) -> bool:
    """Whether the store holds no job and no agent in any of its `count` shards."""
    prefixes = [shard_prefix(prefix, i, tagged(client, count)) for i in range(count)]
    with client.pipeline(transaction=False) as pipe:
        for p in prefixes:
            pipe.zcard(f"{p}jobs").scard(f"{p}agents")
        return not any(pipe.execute())
