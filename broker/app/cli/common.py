"""What every `broker` command shares: the consoles, the error wrapper, JSON output.

The parts themselves (store, catalog, core) are put together in broker/app/wiring.py."""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import signal
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import redis
import typer
from rich.console import Console

from broker.app.settings import Settings
from broker.domain.errors import BrokerError, StoreUnavailableError

if TYPE_CHECKING:  # the core pulls numpy, scipy and pandas: read commands (list, status) never load it
    from broker.core.broker import Broker
    from broker.store.jobs import Store

# Tables are wide: when output is not a terminal (pipes, CI logs) give rich room for them.
_WIDTH = shutil.get_terminal_size((200, 24)).columns
out = Console(width=_WIDTH)
err = Console(stderr=True, width=_WIDTH)
debug_flag = {"on": False}
_printed = {"json": False}  # whether this command wrote its JSON document already
_said: set[str] = set()  # the notes this command put on stderr already

JsonOpt = typer.Option(False, "--json", help="Machine-readable JSON instead of tables.")
MetricsAddressOpt = typer.Option(
    "127.0.0.1",
    "--metrics-address",
    envvar="BROKER_METRICS_ADDRESS",
    help="Where metrics listen: 127.0.0.1, this machine alone; 0.0.0.0 for a Prometheus elsewhere (no auth).",
)


def stop_signals_as_ctrl_c(command):
    """SIGTERM and SIGHUP (a `kill`, systemd, a closed terminal) end the command as Ctrl-C does, through its
    clean-up: the local agents it started stop with it (the default end left them running their jobs, orphaned),
    a server gives up its planning leases at once (the standbys waited out the lease), a backtest's scratch
    redis-server stops (it ran on, its parent gone). A stop that lands inside a library which makes the
    KeyboardInterrupt its own error (pydantic's serializer) still ends as a stop, not as an internal error."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        stopped = []

        def stop(signum, frame):
            stopped.append(signum)
            raise KeyboardInterrupt

        previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort, BrokerError):  # the command's own end after the stop (`broker run`'s)
            raise
        except Exception as error:
            if stopped:
                raise KeyboardInterrupt from error
            raise
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    return wrapper


def above_zero(value: float) -> float:
    """An option's callback where 0 or less means nothing (a speedup, a lease): typer's `min` keeps its bound."""
    if not value > 0:  # nan too
        raise typer.BadParameter(f"{value:g} is not above 0")
    if not math.isfinite(value):  # inf overflowed deep inside: an internal error, or a clock that never ticked
        raise typer.BadParameter(f"{value:g} is not a finite number")
    return value


def agent_id_checked(value: str | None) -> str | None:
    """An option's callback for an agent's id (domain/model.py's rule); an option not given stays None."""
    from broker.domain.model import agent_id_problem

    if value is not None and (problem := agent_id_problem(value)):
        raise typer.BadParameter(problem)
    return value


def user_errors(command):
    """Print a BrokerError's lines and exit 2; unexpected errors exit 1 (traceback with --debug).

    With --json stdout holds one JSON document whatever happened: the result, or (when the command failed
    before printing one) {"error": {"kind", "message", "lines", "exit_code"}}."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        as_json = bool(kwargs.get("as_json"))
        _printed["json"] = False
        _said.clear()
        try:
            return command(*args, **kwargs)
        except (BrokerError, redis.ConnectionError, redis.exceptions.NoPermissionError) as error:
            error = _said_to_user(error)
            lines = str(error).splitlines()
            for line in lines:
                err.print(f"[red]error:[/] {line}", markup=True, highlight=False, soft_wrap=True)
            json_error(as_json, type(error).__name__, lines, error.exit_code)
            raise typer.Exit(error.exit_code) from None
        except (typer.Exit, typer.Abort):
            raise
        except Exception as error:
            if debug_flag["on"]:
                raise
            line = f"{type(error).__name__}: {error} (rerun with --debug for the traceback)"
            err.print(f"[red]internal error:[/] {line}", highlight=False, soft_wrap=True)
            json_error(as_json, "InternalError", [line], 1)
            raise typer.Exit(1) from None

    return wrapper


def _said_to_user(error: Exception) -> Exception:
    """A Redis error the user can act on, as a BrokerError; a BrokerError as it is."""
    if isinstance(error, redis.ConnectionError):  # Redis went away mid-command (a restart, the network)
        return StoreUnavailableError(
            f"redis: lost the connection ({error}); what was stored stays: check that Redis runs "
            "(`broker list` reads it back)"
        )
    if isinstance(error, redis.exceptions.NoPermissionError):  # an agent's ACL user, say, given to a user's command
        user = urlsplit(os.environ.get("BROKER_REDIS_URL", "")).username or "default"  # read as Settings does
        why = str(error).rpartition("caused error: ")[2]  # a pipeline's names its command, values and all: not those
        return BrokerError(
            f"BROKER_REDIS_URL: its user {user!r} may not do this (Redis: {why}); an agent's user reaches its own keys "
            "only: an agent needs the user made for its id or pool (`broker acl agent`), other commands the broker's "
            "(`broker acl broker`) or an admin's"
        )
    return error


def json_error(as_json: bool, kind: str, lines: list[str], exit_code: int) -> None:
    """With --json, the error as the one JSON document on stdout, unless the command printed its own already."""
    if as_json and not _printed["json"]:
        print_json({"error": {"kind": kind, "message": "; ".join(lines), "lines": lines, "exit_code": exit_code}})


def print_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))
    _printed["json"] = True


def _say(line: str) -> None:
    """A note on stderr, once a command: one that opens the store twice (`broker run`'s agents, the demo's copy)
    says once which Redis it uses ("started", then "using" the same private redis-server is the same news)."""
    news = line.split(" ", 1)[-1]
    if news not in _said:
        _said.add(news)
        err.print(f"[dim]{line}[/]")


def redis_url(settings: Settings) -> str:
    """The Redis to use; says so when it starts (or finds) the private one."""
    from broker.app import wiring

    return wiring.redis_url(settings, _say)


def store_for(settings: Settings, daemon: bool = False) -> Store:
    from broker.app import wiring

    return wiring.store_for(settings, daemon, _say)


def make_store() -> Store:
    """The configured store alone: what read commands need, without the catalog and policies."""
    return store_for(Settings.from_env())


def make_broker(
    with_store: bool = True, live: bool = False, daemon: bool = False, claim: bool = False, policy: str | None = None
) -> Broker:
    from broker.app import wiring

    return wiring.make_broker(with_store, live, daemon, _say, claim, policy)
