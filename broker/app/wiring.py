"""How broker's parts are put together, once: the store, the catalog as quotes and dispatch price it, the core,
and a backtest's market. The CLI, the dashboard, the server and the benches all come through here."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from broker import planning, sim
from broker.app.settings import Settings
from broker.bubbles.capacity import bubble_offer
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.domain.bubbles import BubbleProfile
from broker.domain.errors import BrokerError
from broker.pricing.catalog import PriceCatalog
from broker.pricing.hazard import HazardModel, observed
from broker.sim.market import Market, from_traces
from broker.sim.workloads import FREERIDE_MAIN_JOBS, ml_mix
from broker.store import embedded
from broker.store.jobs import Store
from broker.store.prices import PriceHistory

LOOPBACK = {"localhost", "127.0.0.1", "::1"}


def redis_url(settings: Settings, say=lambda line: None) -> str:
    if settings.redis_url:
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


def store_for(settings: Settings, daemon: bool = False, say=lambda line: None) -> Store:
    """The store; a daemon's (server, agent) rides out Redis restarts, a command's fails at once."""
    return Store(redis_url(settings, say), prefix=settings.prefix, outage_s=settings.redis_outage_s if daemon else 0.0)


def make_broker(with_store: bool = True, live: bool = False, daemon: bool = False, say=lambda line: None) -> Broker:
    """The core on the configured store. `live` prices with what the store knows (recorded prices, eviction
    bands, our agents' preemptions), which reads every job and price: only the commands that price ask for it."""
    settings = Settings.from_env()
    store = store_for(settings, daemon, say) if with_store else None
    catalog = live_catalog(store, settings) if store and live else PriceCatalog.from_snapshot(settings.prices_dir)
    return Broker(store, catalog, planning.get(settings.policy, **settings.policy_options()), SystemClock())


def live_catalog(store: Store, settings: Settings) -> PriceCatalog:
    """The catalog as quotes, dispatch and the dashboard price it: the snapshot, newer recorded prices, and a
    hazard from the traces, the clouds' eviction bands and our own agents' preemptions."""
    catalog = PriceCatalog.from_snapshot(settings.prices_dir)
    history = PriceHistory(store)
    hazard = HazardModel.packaged().with_bands(history.bands()).observe(observed(store.list_jobs()))
    return PriceCatalog(catalog.rows, hazard, catalog.source).with_history(history.latest())


PACKAGED_TRACES = Path(sim.__file__).parent / "data" / "traces"


def trace_start(directory: Path) -> datetime:
    """When the traces begin: the date in a `<cloud>-MM-DD-YYYY` directory name, else 2023-01-01."""
    for part in [directory.name, *(p.name for p in directory.iterdir() if p.is_dir())]:
        found = re.search(r"(\d{2})-(\d{2})-(\d{4})$", part)
        if found:
            month, day, year = (int(g) for g in found.groups())
            return datetime(year, month, day, tzinfo=UTC)
    return datetime(2023, 1, 1, tzinfo=UTC)


def measured_bubbles(path: Path, market) -> list:
    """Bubble offers from a file of measured profiles, on the traces' accelerator in the first on-demand region."""
    try:
        found = [BubbleProfile.model_validate(p) for p in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError) as err:
        raise BrokerError(
            f"profiles: {path} is not a JSON list of bubble profiles ({str(err).splitlines()[0]}); "
            "write one from `broker.bubbles.profiler.load_profiles`"
        ) from None
    home = market.on_demand[0]
    offers = (bubble_offer(p, home.cloud, home.region, home.accelerator) for p in found)
    return [o for o in offers if o is not None]


def backtest_market(
    traces: Path,
    prices_dir: Path | None = None,
    tick_s: float = 600.0,
    spot_instances: int = 4,
    profiles: Path | None = None,
) -> Market:
    """The market a backtest runs in: spot offers from the traces, on-demand from the catalog, and bubbles from
    measured profiles or, without them, two FreeRide-like main jobs."""
    catalog = PriceCatalog.from_snapshot(prices_dir)
    market = from_traces(traces, catalog, trace_start(traces), tick_s, spot_instances)
    return market.with_bubbles(
        measured_bubbles(profiles, market)
        if profiles
        else [o for main in FREERIDE_MAIN_JOBS for o in main.offers(market.start)]
    )


def backtest_workload(market: Market, seed: int, jobs: int, arrival_hours: float = 48.0) -> list:
    """The seeded ML mix, priced against the market's cheapest on-demand offer."""
    od_price = min(o.price_usd_per_h for o in market.on_demand)
    return ml_mix(seed, jobs, od_price, market.spot[0].offer.accelerator, arrival_hours)
