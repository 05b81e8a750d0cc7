"""What every `broker` command shares: the consoles, the error wrapper, the store and the core."""

from __future__ import annotations

import functools
import json
import shutil
from urllib.parse import urlsplit

import typer
from rich.console import Console

from broker import planning
from broker.app.settings import Settings
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.domain.errors import BrokerError
from broker.pricing.catalog import PriceCatalog
from broker.pricing.hazard import HazardModel, observed
from broker.store import embedded
from broker.store.jobs import Store
from broker.store.prices import PriceHistory

# Tables are wide: when output is not a terminal (pipes, CI logs) give rich room for them.
_WIDTH = shutil.get_terminal_size((200, 24)).columns
out = Console(width=_WIDTH)
err = Console(stderr=True, width=_WIDTH)
debug_flag = {"on": False}

JsonOpt = typer.Option(False, "--json", help="Machine-readable JSON instead of tables.")


def user_errors(command):
    """Print a BrokerError's lines and exit 2; unexpected errors exit 1 (traceback with --debug)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except BrokerError as error:
            for line in str(error).splitlines():
                err.print(f"[red]error:[/] {line}", markup=True, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except (typer.Exit, typer.Abort):
            raise
        except Exception as error:
            if debug_flag["on"]:
                raise
            err.print(f"[red]internal error:[/] {type(error).__name__}: {error} (rerun with --debug for the traceback)")
            raise typer.Exit(1) from None

    return wrapper


LOOPBACK = {"localhost", "127.0.0.1", "::1"}


def redis_url(settings: Settings) -> str:
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
    err.print(f"[dim]{verb} private redis-server on 127.0.0.1:{server.port} (data in {server.data_dir})[/]")
    return server.url


def store_for(settings: Settings, daemon: bool = False) -> Store:
    """The store; a daemon's (server, agent) rides out Redis restarts, a command's fails at once."""
    return Store(redis_url(settings), prefix=settings.prefix, outage_s=settings.redis_outage_s if daemon else 0.0)


def make_broker(with_store: bool = True, live: bool = False, daemon: bool = False) -> Broker:
    """The core on the configured store. `live` prices with what the store knows (recorded prices, eviction
    bands, our agents' preemptions), which reads every job and price: only the commands that price ask for it."""
    settings = Settings.from_env()
    store = store_for(settings, daemon) if with_store else None
    catalog = PriceCatalog.from_snapshot(settings.prices_dir)
    if store and live:
        history = PriceHistory(store)
        hazard = HazardModel.packaged().with_bands(history.bands()).observe(observed(store.list_jobs()))
        catalog = PriceCatalog(catalog.rows, hazard, catalog.source).with_history(history.latest())
    return Broker(store, catalog, planning.get(settings.policy, **settings.policy_options()), SystemClock())


def print_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))
