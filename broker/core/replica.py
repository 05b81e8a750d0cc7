"""`broker server` over a sharded store: each replica plans the shards that rendezvous hashing gives it among
the live replicas, so planning spreads over replicas and a dead replica's shards pass to the others.

Every replica writes a heartbeat (`{p}replicas` in shard 0: replica -> epoch ms of its last check) and reads who
is alive (a heartbeat younger than the lease). A shard goes to the live replica with the highest crc32 of
"replica/shard": all agree without talking, and a replica joining or leaving moves only its share. A replica
gives up the lease of a shard no longer its own, and the shard's new owner takes it; each shard keeps its own
planning lease and fencing token (Store.lead), so two replicas that briefly disagree still never both write.
Every REHOME_EVERY_S the leader of a shard moves its waiting jobs that no agent of it fits to a shard with one
(core/rehoming.py), and with a retention it forgets the jobs that ended long ago (core/retention.py).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable

from broker.core.rehoming import REHOME_EVERY_S, rehome
from broker.core.retention import Retention
from broker.core.rounds import serve_rounds
from broker.core.server import BrokerServer
from broker.store.jobs import Store
from broker.store.moves import forget_routes
from broker.store.shards import ShardedStore

log = logging.getLogger(__name__)

HEARTBEATS = "replicas"


def owner(replicas: list[str], shard: int) -> str:
    """The replica that plans the shard: highest rendezvous score among the live ones."""
    return max(replicas, key=lambda name: (zlib.crc32(f"{name}/{shard}".encode()), name))


class Replica:
    """One server process: a BrokerServer per shard, run for the shards it owns."""

    def __init__(
        self,
        store: ShardedStore,
        make: Callable[[Store], BrokerServer],
        name: str,
        lease_s: float = 5.0,
        retention: Retention | None = None,
    ):
        self.store, self.name, self.lease_ms = store, name, int(lease_s * 1000)
        self.retention = retention  # forgets ended jobs in the shards it leads (`--keep-ended-days`)
        self.servers = [make(shard) for shard in store.shards]
        self.owned: list[int] = []
        self._checked = -float("inf")
        self._rehomed = -float("inf")

    def own(self) -> list[int]:
        """Beat the heart and work out the shards this replica plans (at most every quarter lease)."""
        if time.monotonic() - self._checked < self.lease_ms / 4000:
            return self.owned
        self._checked = time.monotonic()
        now_ms, key = int(time.time() * 1000), self.store.key(HEARTBEATS)
        with self.store.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(key, {self.name: now_ms})
            pipe.zremrangebyscore(key, "-inf", now_ms - self.lease_ms)
            pipe.zrange(key, 0, -1)
            live = pipe.execute()[-1]
        owned = [i for i in range(len(self.servers)) if owner(live, i) == self.name]
        if owned != self.owned:
            log.info("replica=%s plans shards %s of %d (%d live)", self.name, owned, len(self.servers), len(live))
        for index in set(self.owned) - set(owned):
            self.servers[index].resign()
        self.owned = owned
        return owned

    def round(self, block_ms: int = 100) -> None:
        """A round of each owned shard's server; the wait for reports is shared out between them."""
        owned = self.own()
        if not owned:
            time.sleep(block_ms / 1000)
            return
        for index in owned:
            self.servers[index].round(max(1, block_ms // len(owned)))
        if len(self.servers) > 1 and time.monotonic() - self._rehomed >= REHOME_EVERY_S:
            self._rehomed = time.monotonic()
            led = {i: self.servers[i].consumer for i in owned if self.servers[i].token is not None}  # fenced too
            if led:
                rehome(self.store, led, self.servers[owned[0]].clock.now())
        if self.retention and self.retention.due():
            for server in (self.servers[i] for i in owned if self.servers[i].token is not None):
                gone = self.retention.forget_ended(server.store, server.clock.now(), server.consumer)
                forget_routes(self.store.shards, gone)  # a moved job's route from its home shard

    def serve(self, until=lambda: False) -> None:
        serve_rounds(self.round, self.name, until)

    def stop(self) -> None:
        """Leave: give up every shard and the heartbeat, so the others take over at once, not after a lease. Every
        shard's lease, not only those `owned` says: a stop may land before a lease or an ownership is noted."""
        for server in self.servers:
            server.resign()
        self.store.redis.zrem(self.store.key(HEARTBEATS), self.name)
        self.owned = []
