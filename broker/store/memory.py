"""What Redis says of its memory (INFO memory, which needs no CONFIG right): how full it is, and whether it would
evict keys when full. The store must never lose a key to eviction: an evicted job is a job lost, an evicted lease an
agent taken for lost and its job moved. Only `noeviction` (Redis's default) keeps them: writes then fail, loudly.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.cluster import RedisCluster

FULL_SHARE = 0.8  # used over maxmemory from which a note says to forget old jobs


@dataclass(frozen=True)
class Memory:
    used_bytes: int
    max_bytes: int  # 0: no limit
    policy: str

    @classmethod
    def of(cls, client) -> list[Memory]:
        """Each node's (one for a single server; a cluster client's INFO answers per node)."""
        if isinstance(client, RedisCluster):  # else it asks one node
            info = client.info("memory", target_nodes=RedisCluster.ALL_NODES)
        else:
            info = client.info("memory")
        nodes = info.values() if info and all(isinstance(v, dict) for v in info.values()) else [info]
        return [
            cls(int(n.get("used_memory", 0)), int(n.get("maxmemory", 0)), str(n.get("maxmemory_policy", "?")))
            for n in nodes
        ]

    def evicts(self) -> bool:
        return self.policy not in ("noeviction", "?")

    def full_share(self) -> float | None:
        return self.used_bytes / self.max_bytes if self.max_bytes else None


def eviction_problem(nodes: list[Memory]) -> str | None:
    """One line when a node may evict the store's keys, with the fix; None when none may."""
    evicting = sorted({n.policy for n in nodes if n.evicts()})
    if not evicting:
        return None
    return (
        f"redis: maxmemory-policy is {', '.join(evicting)}: when full, Redis deletes keys (jobs lost, leases gone and "
        "agents taken for lost); set it to noeviction (CONFIG SET maxmemory-policy noeviction, or the host's "
        "parameter group)"
    )


def usage(nodes: list[Memory]) -> str:
    """How much memory the store's Redis holds, and of what limit."""
    used = sum(n.used_bytes for n in nodes)
    limits = [n.max_bytes for n in nodes]
    limit = f" of {_mb(sum(limits))} ({used / sum(limits):.0%})" if all(limits) else " (no maxmemory)"
    return f"{_mb(used)} used{limit}"


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MB"
