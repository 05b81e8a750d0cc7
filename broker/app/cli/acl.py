"""`broker acl`: Redis ACL users for a shared Redis (broker/acl.py): one for the broker, one per agent.
Run with BROKER_REDIS_URL naming an admin user; each command prints the new user's URL once."""

from __future__ import annotations

import typer

from broker.app.cli.common import user_errors
from broker.app.settings import Settings
from broker.domain.errors import BrokerError
from broker.store import acl
from broker.store.shards import ShardedStore

acl_app = typer.Typer(no_args_is_help=True, help="Redis ACL users: the broker's and one per agent.")


def _admin_url() -> str:
    settings = Settings.from_env()
    if not settings.redis_url:
        raise BrokerError("BROKER_REDIS_URL: not set; ACL users are for a shared Redis: set it to an admin user's URL")
    return settings.redis_url


@acl_app.command("agent")
@user_errors
def agent_user(
    agent_id: str = typer.Option(..., "--id", help="The agent's id (as given to `broker agent --id`)."),
    password: str | None = typer.Option(
        None, envvar="BROKER_ACL_PASSWORD", help="Its password (default: a random one)."
    ),
) -> None:
    """Create (or replace) the agent's user: its own stream, lease and job views, write-only agent-events."""
    settings = Settings.from_env()
    prefix = ShardedStore(_admin_url(), settings.prefix, settings.shards).of_agent(agent_id).prefix  # as it opens it
    typer.echo(acl.agent_user(_admin_url(), prefix, agent_id, password))


@acl_app.command("broker")
@user_errors
def broker_user(
    name: str = typer.Option("broker", help="The user's name."),
    password: str | None = typer.Option(
        None, envvar="BROKER_ACL_PASSWORD", help="Its password (default: a random one)."
    ),
) -> None:
    """Create (or replace) the broker's user: data commands on the broker's keys, no ACL or admin commands."""
    typer.echo(acl.broker_user(_admin_url(), Settings.from_env().prefix, name, password))
