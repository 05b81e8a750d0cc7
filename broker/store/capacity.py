"""The spot capacity our own fleet had, per zone over time: the market model's freshest evidence.

Keys (beside the store's own, same prefix):

    {p}capacity:{cloud}|{zone}|{instance type}   ZSET   "{epoch}|{agents}": one member per change (series.py)
    {p}capacity-zones                            SET    zones with a series

The server records, each time it checks leases, how many live spot agents stand for each zone (one going away on
a notice counts out). A zone counts from when an agent was first seen there, or from when a provisioner said it keeps
a pool there (`watch`: `broker agents provision --apply`, the backtest's fleet; `forget` when it is destroyed): before
that nothing is known; after, no agent means no capacity, since a pool's provisioner keeps asking for its instances
(an auto-scaling group at its desired size), so its agent count follows what the cloud gives. A pool that never got
an instance is evidence too: a zone down for days tends to stay down (pricing/availability.py).
"""

from __future__ import annotations

from datetime import datetime

from broker.domain.model import AgentInfo, Tier
from broker.domain.offer import Offer, tier_of
from broker.store.jobs import Store
from broker.store.series import ChangeSeries

Zone = tuple[str, str, str]  # (cloud, zone or region, instance type), as the market model keys zones


def zone_of(offer: Offer) -> Zone:
    return offer.cloud, offer.zone or offer.region, offer.instance_type


def _member(zone: Zone) -> str:
    """A zone as its series' member."""
    return "|".join(zone)


class CapacityHistory:
    """Live spot agents per zone, recorded where the count changes."""

    def __init__(self, store: Store):
        self.series = ChangeSeries(store, "capacity", "capacity-zones")

    def record(self, at: datetime, agents: list[AgentInfo]) -> int:
        """The count of these live agents per spot zone now, for every zone seen before too (zero when none is
        left); returns how many zones changed."""
        counts: dict[str, int] = {}
        for agent in agents:
            if agent.offer.tier == Tier.spot:
                member = _member(zone_of(agent.offer))
                counts[member] = counts.get(member, 0) + 1
        zones = sorted(set(self.series.members()) | counts.keys())
        return self.series.append((zone, at.timestamp(), counts.get(zone, 0)) for zone in zones)

    def watch(self, offers: list[Offer]) -> None:
        """The spot zones of `offers` where a provisioner keeps a pool from now on: recorded from the server's next
        check, with no agent there meaning no capacity."""
        self.series.watch(_member(zone_of(o)) for o in offers if o.tier == Tier.spot)

    def forget(self, offer_ids: list[str]) -> None:
        """The spot zones of these offers (ids) where a pool was destroyed: recorded no more, and what was recorded
        of them drops out of the evidence, since no agent there no longer says no capacity (a zone counts again from an
        agent's first sight there, or a new pool)."""
        spot = [i.split("/") for i in offer_ids if tier_of(i) == Tier.spot]  # domain.offer.offer_id's parts
        self.series.forget(_member(tuple(parts[:3])) for parts in spot)

    def seen(self, since: datetime) -> dict[Zone, list[tuple[float, float]]]:
        """Per zone, (epoch, agents) from `since` on, led by the count in effect then, oldest first."""
        return {tuple(m.split("|")): self.series.points(m, since.timestamp()) for m in self.series.members()}


def fleet_seen(shards: list[Store], since: datetime) -> dict[Zone, list[tuple[float, float]]]:
    """`seen` over a sharded store: each shard's server records its own agents, so a zone's count at any time
    is the sum of the counts the shards had in effect then (a shard not seen in a zone yet counts 0)."""
    per_shard = [CapacityHistory(shard).seen(since) for shard in shards]
    if len(per_shard) == 1:
        return per_shard[0]
    merged: dict[Zone, list[tuple[float, float]]] = {}
    for zone in set().union(*per_shard):
        changes = sorted((epoch, i, n) for i, seen in enumerate(per_shard) for epoch, n in seen.get(zone, []))
        counts, points = [0.0] * len(per_shard), []
        for epoch, i, n in changes:
            counts[i] = n
            if points and points[-1][0] == epoch:
                points.pop()
            points.append((epoch, sum(counts)))
        merged[zone] = points
    return merged
