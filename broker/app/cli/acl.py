"""`broker acl`: Redis ACL users for a shared Redis (broker/acl.py): one for the broker, one per agent or pool.
Run with BROKER_REDIS_URL naming an admin user; each command prints the new user's URL once."""

from __future__ import annotations

import typer

from broker.app import wiring
from broker.app.cli.common import user_errors
from broker.app.settings import Settings
from broker.domain.errors import BrokerError
from broker.store import acl
from broker.store.shards import ShardedStore

acl_app = typer.Typer(no_args_is_help=True, help="Redis ACL users: the broker's and one per agent or pool.")


def _admin_url() -> str:
    settings = Settings.from_env()
    if not settings.redis_url:
        raise BrokerError("BROKER_REDIS_URL: not set; ACL users are for a shared Redis: set it to an admin user's URL")
    return wiring.redis_url(settings)  # one redis-py reads, with a password where it is not this machine's


@acl_app.command("agent")
@user_errors
def agent_user(
    agent_id: str | None = typer.Option(None, "--id", help="The agent's id (as given to `broker agent --id`)."),
    pool: str | None = typer.Option(
        None,
        help="Or a pool: one user for every agent named POOL.<name>, such as a training job's pipeline stages "
        "(POOL is the main job), which may also publish that job's bubble profiles.",
    ),
    password: str | None = typer.Option(
        None, envvar="BROKER_ACL_PASSWORD", help="Its password (default: a random one)."
    ),
) -> None:
    """Create (or replace) an agent's user, or a pool's: its own streams, lease and job views, write-only
    agent-events."""
    if (agent_id is None) == (pool is None):
        raise BrokerError("--id/--pool: give one: --id AGENT for one agent, --pool NAME for the agents named NAME.*")
    settings = Settings.from_env()
    store = ShardedStore(_admin_url(), settings.prefix, settings.shards)  # an agent's keys as it opens the store
    if pool is not None:
        typer.echo(acl.pool_user(_admin_url(), [shard.prefix for shard in store.shards], pool, password))
    else:
        typer.echo(acl.agent_user(_admin_url(), store.of_agent(agent_id).prefix, agent_id, password))


@acl_app.command("upgrade")
@user_errors
def upgrade_users() -> None:
    """Give every agent's and pool's user (made by `broker acl agent`) this version's rights, passwords kept: run
    it after upgrading broker, so that its agents may read what the new version keeps for them."""
    settings = Settings.from_env()
    store = ShardedStore(_admin_url(), settings.prefix, settings.shards)
    upgraded = acl.upgrade_users(_admin_url(), [shard.prefix for shard in store.shards])
    typer.echo(f"upgraded ACL users: {', '.join(upgraded)}" if upgraded else "no agent or pool users here")


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


@acl_app.command("remove")
@user_errors
def remove_user(
    agent_id: str | None = typer.Option(None, "--id", help="An agent's user (`broker acl agent --id`)."),
    pool: str | None = typer.Option(None, help="Or a pool's (`broker acl agent --pool`), once its instances are gone."),
    name: str | None = typer.Option(None, help="Or a user by name (`broker acl broker --name`)."),
) -> None:
    """Delete a user made here: Redis closes its connections, and its password admits nobody after."""
    if sum(given is not None for given in (agent_id, pool, name)) != 1:
        raise BrokerError("--id/--pool/--name: give one: the agent, the pool or the user name whose user goes")
    user = acl.user_name(agent_id, pool, name)
    if not acl.delete_user(_admin_url(), user):
        raise BrokerError(f"user: no ACL user {user!r} here; `redis-cli ACL USERS` lists them")
    typer.echo(f"removed ACL user {user}")
