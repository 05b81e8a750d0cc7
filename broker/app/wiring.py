"""How broker's parts are put together, once: the store, the catalog as quotes, dispatch and the dashboard price
it, and the core. The CLI, the dashboard and the server all come through here."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from redis.connection import parse_url

from broker.app.settings import Settings
from broker.domain.errors import BrokerError
from broker.store import embedded
from broker.store.jobs import Store
from broker.store.shards import ShardedStore

if TYPE_CHECKING:  # the core, catalogs and market model load numpy, scipy and pandas: only what prices imports them
    from broker.core.broker import Broker
    from broker.pricing.availability import MarketModel
    from broker.pricing.catalog import PriceCatalog

LOOPBACK = {"localhost", "127.0.0.1", "::1"}


def redis_url(settings: Settings, say=lambda line: None) -> str:
    if settings.redis_url:
        try:
            parse_url(settings.redis_url)  # as redis-py reads it: a bad one raised ValueError inside the first command
        except ValueError as error:  # the URL itself is not said: it may hold a password
            raise BrokerError(
                f"BROKER_REDIS_URL: not a Redis URL ({error}); give redis://[USER:PASSWORD@]HOST:PORT/DB (rediss:// "
                "for TLS, unix:///PATH for a socket)"
            ) from None
        parts = urlsplit(settings.redis_url)
        if parts.scheme in ("redis", "rediss") and parts.hostname not in LOOPBACK and not parts.password:
            raise BrokerError(
                f"BROKER_REDIS_URL: no password for the Redis on {parts.hostname}; outside this machine Redis must "
                "require auth: give your user's URL (redis://USER:PASSWORD@HOST:PORT/0, see `broker acl`)"
            )
        return settings.redis_url
    server = embedded.ensure(settings.home)
    verb = "started" if server.started else "using"
    say(f"{verb} private redis-server on 127.0.0.1:{server.port} (data in {server.data_dir})")
    return server.url


def store_for(settings: Settings, daemon: bool = False, say=lambda line: None, claim: bool = False) -> ShardedStore:
    """The store (its shards); a daemon's (server, agent) rides out Redis restarts, a command's fails at once. A
    server's (`claim`) records how many shards it splits the store into, for the clients (store/layout.py)."""
    outage_s = settings.redis_outage_s if daemon else 0.0
    return ShardedStore(redis_url(settings, say), settings.prefix, settings.shards, outage_s, claim)


def make_broker(
    with_store: bool = True,
    live: bool = False,
    daemon: bool = False,
    say=lambda line: None,
    claim: bool = False,
    policy: str | None = None,
) -> Broker:
    """The core on the configured store, planning with `policy` (default BROKER_POLICY's), which decides from the
    core's market model. `live` prices with what the store knows (recorded prices, eviction bands, our agents'
    preemptions), which reads every job and price: only the commands that price ask for it."""
    from broker import planning
    from broker.core.broker import Broker
    from broker.core.clock import SystemClock
    from broker.core.server import GUARD_EVERY_S
    from broker.pricing.catalog import PriceCatalog

    settings = Settings.from_env()
    store = store_for(settings, daemon, say, claim) if with_store else None
    catalog = live_catalog(store, settings) if store and live else PriceCatalog.from_snapshot(settings.prices_dir)
    # a server (`claim`) records its own policy: no note that it differs from the one recorded
    name = policy_for(store, policy or settings.policy, (lambda line: None) if claim else say)
    chosen = planning.get(name, **settings.policy_options())
    # the live guard looks every second, not once a market tick: the quotes' futures play it so
    return Broker(
        store, catalog, chosen, SystemClock(), market_model, explained=True, guard_pass_h=GUARD_EVERY_S / 3600
    )


def make_server(
    broker: Broker,
    consumer: str,
    policy=None,
    clock=None,
    metrics=None,
    leader_lease_s: float = 5.0,
    shard=None,
    prices=None,
):
    """A server on one shard of the broker's store (default the first): it plans with `policy` (default the
    broker's) while it holds the shard's planning lease and stands by while another replica does; idle agents are
    priced at the live catalog (`prices`, default read afresh when the server asks)."""
    from broker.agents.checkpoints import CheckpointStore
    from broker.core.clock import SystemClock
    from broker.core.server import BrokerServer

    settings = Settings.from_env()
    return BrokerServer(
        shard or broker.store.shards[0],
        policy or broker.policy,
        clock or SystemClock(),
        CheckpointStore(settings.checkpoints),
        consumer,
        metrics=metrics,
        agent_secret=settings.agent_secret,
        leader_lease_s=leader_lease_s,
        prices=prices or (lambda: live_catalog(broker.store, settings).offers),
        fill_order=settings.fill_order,
        shards=broker.store.shards,
    )


def policy_for(store: ShardedStore | None, named: str | None, say) -> str:
    """The policy to plan or quote with: the one named (`--policy`, BROKER_POLICY), else the servers' (store/policy.py),
    else the default. A quote by another rule than the servers' says so: its figures are another rule's."""
    from broker.planning import DEFAULT_POLICY, names
    from broker.store.policy import recorded_policy

    servers = recorded_policy(store) if store is not None else None
    servers = servers if servers in names() else None  # a newer server's policy this version lacks: the default
    if named and servers and named != servers:
        say(f"note: BROKER_POLICY={named} here, but the servers plan with {servers}: unset it to quote as they run")
    return named or servers or DEFAULT_POLICY


def make_replica(
    broker: Broker,
    consumer: str,
    policy=None,
    clock=None,
    metrics=None,
    leader_lease_s: float = 5.0,
    keep_ended: timedelta | None = None,
):
    """`broker server`: a server per shard, run for the shards this replica owns among the live ones
    (core/replica.py); with one shard, one replica plans and the others stand by. With `keep_ended` it forgets the
    jobs that ended longer ago than that (core/retention.py)."""
    from broker.agents.checkpoints import CheckpointStore
    from broker.core.replica import Replica
    from broker.core.retention import Retention
    from broker.core.server import PRICES_EVERY_S

    settings, priced = Settings.from_env(), {}

    def prices():  # one live catalog a PRICES_EVERY_S for all of this replica's shards, not one per shard
        if "at" not in priced or time.monotonic() - priced["at"] >= PRICES_EVERY_S:
            priced.update(offers=live_catalog(broker.store, settings).offers, at=time.monotonic())
        return priced["offers"]

    def make(shard: Store):
        return make_server(broker, consumer, policy, clock, metrics, leader_lease_s, shard, prices)

    if broker.hedges is not None:  # the hedge rule's zones and prices: the live ones it dispatches at, not a snapshot's
        broker.hedges.offers = prices

    retention = Retention(keep_ended, CheckpointStore(settings.checkpoints), metrics) if keep_ended else None
    return Replica(broker.store, make, consumer, leader_lease_s, retention)


def market_model() -> MarketModel:
    """The market model quotes are simulated on: learned from the packaged spot traces (AWS p3.2xlarge in nine
    zones); offers without a trace are modelled from the catalog's hazard."""
    from broker.pricing.availability import MarketModel
    from broker.pricing.traces import load_traces
    from broker.sim.market import PACKAGED_TRACES

    return MarketModel.fit(load_traces(PACKAGED_TRACES))


def live_catalog(store: Store, settings: Settings) -> PriceCatalog:
    """The catalog as quotes, dispatch and the dashboard price it: the snapshot, newer recorded prices, and a
    hazard from the traces, the clouds' eviction bands and our own agents' preemptions."""
    from broker.pricing.catalog import PriceCatalog
    from broker.pricing.hazard import Evidence, HazardModel
    from broker.store import evidence
    from broker.store.prices import PriceHistory

    catalog = PriceCatalog.from_snapshot(settings.prices_dir)
    history = PriceHistory(store)
    seen: dict = {}
    for shard in store.shards:  # our agents' evidence, counted as their runs ended (not every job read again)
        for market, (preemptions, hours) in evidence.seen(shard).items():
            seen[market] = seen.get(market, Evidence()) + Evidence(preemptions, hours)
    hazard = HazardModel.packaged().with_bands(history.bands()).observe(seen)
    return PriceCatalog(catalog.rows, hazard, catalog.source).with_history(history.latest())
