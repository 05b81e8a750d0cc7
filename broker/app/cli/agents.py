"""`broker agents list|provision|token|deprovision`: the agents the broker has, and agents on real clouds through
Terraform."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path
from urllib.parse import urlsplit

import typer

from broker.app.cli.common import (
    JsonOpt,
    above_zero,
    agent_id_checked,
    err,
    make_broker,
    make_store,
    out,
    print_json,
    user_errors,
)
from broker.app.settings import Settings
from broker.domain.errors import BrokerError
from broker.store.capacity import CapacityHistory

agents_app = typer.Typer(
    help="The agents the broker has (list, the default); provision agents for the current plan with Terraform "
    "(infra/terraform)."
)
POOLS_DIR = Path("infra/terraform/pools")


@agents_app.callback(invoke_without_command=True)
def agents(ctx: typer.Context, as_json: bool = JsonOpt) -> None:
    """`broker agents` alone lists them, as `broker prices` alone lists prices (`--json` too)."""
    if not ctx.invoked_subcommand:
        agents_list(as_json=as_json)


@agents_app.command("list")
@user_errors
def agents_list(as_json: bool = JsonOpt) -> None:
    """Every registered agent: its tier and offer, the job it runs, its age and whether its lease is alive."""
    from datetime import datetime

    from broker.app import render

    store = make_store()
    pairs = store.agents_with_leases()
    rows = render.agent_rows([a for a, _ in pairs], {a.id: lease for a, lease in pairs}, datetime.now(UTC))
    if as_json:
        print_json(rows)
    elif not rows:
        out.print("no agents: `broker demo` starts local ones; `broker agent --id ID --offer OFFER` starts one")
    else:
        out.print(render.agents_table(rows))


@agents_app.command("provision")
@user_errors
def agents_provision(
    site: Path = typer.Option(
        ..., help="YAML with per-cloud site values (ami_id, checkpoint_bucket, secret references, redis_url, ...)."
    ),
    plan: bool = typer.Option(
        True, "--plan/--apply", help="--plan writes the Terraform roots; --apply also runs terraform."
    ),
    pools_dir: Path = typer.Option(  # the default in words: at 80 columns its path was cut to "infra/terraform/poo…"
        POOLS_DIR,
        "--out",
        show_default=False,
        help=f"Where the pools' Terraform roots go: {POOLS_DIR.name}/ under {POOLS_DIR.parent} by default.",
    ),
    yes: bool = typer.Option(False, "--yes", help="With --apply: create the instances without asking first."),
    token_ttl_hours: float = typer.Option(
        168.0,
        min=0.1,
        max=8784.0,  # a year (inf overflowed: an internal error); the server renews a token a day before it ends
        help="Life of each pool's registration token (issued when BROKER_AGENT_SECRET is set).",
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Write <pool>.auto.tfvars.json for each pool of the current plan (pending jobs by chosen offer)."""
    from datetime import datetime, timedelta

    import yaml

    from broker.agents import terraform, tokens
    from broker.domain.specfile import yaml_problem

    try:
        site_values = yaml.safe_load(site.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        why = yaml_problem(error) if isinstance(error, yaml.YAMLError) else error
        raise BrokerError(
            f"site: cannot read {site} ({why}); give a YAML file with aws:, gcp:, azure: sections"
        ) from None
    sections = site_values.items() if isinstance(site_values, dict) else [("", site_values)]
    for cloud, values in sections:  # a section the pools never read, or not a mapping, is a mistake to say now
        if cloud not in ("", *terraform.MODULES) or not isinstance(values, dict):
            where = f"site.{cloud}" if cloud else "site"
            raise BrokerError(f"{where}: not a section of name: value under aws:, gcp: or azure: ({site}); fix it")
    broker = make_broker()
    pools = terraform.pools_from_jobs(broker.store.unfinished_jobs())  # the queue, not every job ever stored
    if not pools:
        if as_json:
            print_json([])
        else:
            out.print("no pending jobs: nothing to provision (submit jobs first)")
        return
    settings = Settings.from_env()
    secret = settings.agent_secret
    expires = datetime.now(UTC) + timedelta(hours=token_ttl_hours)
    if not secret and not as_json:
        err.print("[yellow]note:[/] BROKER_AGENT_SECRET is not set: the pools' agents register without a token")
    written = []
    for pool in pools:
        token = tokens.issue_pool(secret, pool.name, expires) if secret else None
        values = terraform.pool_values(
            pool, site_values, broker.catalog, token, settings.prefix, len(broker.store.shards)
        )
        root = terraform.write_pool(pool, values, pools_dir)
        user = urlsplit(values.get("redis_url") or "").username  # `{pool}` in the site's URL: a user per pool
        written.append(
            {"pool": pool.name, "offer": pool.offer.id, "count": pool.count, "dir": str(root), "redis_user": user}
        )
    for row in written:
        row["command"] = f"terraform -chdir={row['dir']} init && terraform -chdir={row['dir']} apply"
    if not plan and not yes:  # instances cost money: say what will be created, and ask (no answer: no)
        listing = ", ".join(f"{row['count']} x {row['offer']}" for row in written)
        typer.confirm(f"terraform apply creates {listing}; go ahead?", abort=True, err=True)
    for row in written:
        if not plan:
            terraform.apply_pool(Path(row["dir"]), row["pool"])
    if not plan:  # the pools keep asking for their instances: a zone of one without an agent has no capacity
        CapacityHistory(broker.store.shards[0]).watch([pool.offer for pool in pools])
    if as_json:
        print_json(written)
        return
    for row in written:  # commands to copy: a terminal wraps them softly, rich's hard wrap would break them
        out.print(f"[bold]{row['pool']}[/]: {row['count']} x {row['offer']}\n  {row['command']}", soft_wrap=True)
        if _own_user(row["redis_user"], row["pool"]):
            out.print(
                f"  its agents' Redis user: BROKER_ACL_PASSWORD=<the password in its secret> broker acl agent --pool "
                f"{row['pool']}",
                soft_wrap=True,
            )


@agents_app.command("token")
@user_errors
def agents_token(
    agent_id: str | None = typer.Option(None, "--id", callback=agent_id_checked, help="The agent the token is for."),
    pool: str | None = typer.Option(
        None,
        callback=agent_id_checked,
        help="Or a pool: the token admits every agent named POOL.<name>, such as a training job's pipeline stages "
        "(POOL: the main job's name, as given to attach()).",
    ),
    ttl_hours: float = typer.Option(24.0, callback=above_zero, help="Hours until the token expires."),
) -> None:
    """Print a registration token for one agent, or a pool of them (needs BROKER_AGENT_SECRET, the broker's secret)."""
    from datetime import datetime, timedelta

    from broker.agents.tokens import issue, issue_pool

    settings = Settings.from_env()
    if (agent_id is None) == (pool is None):
        raise BrokerError("--id/--pool: give one: --id AGENT for one agent, --pool NAME for the agents named NAME.*")
    if not settings.agent_secret:
        raise BrokerError("BROKER_AGENT_SECRET: not set; set the broker's secret (the server checks tokens against it)")
    expires = datetime.now(UTC) + timedelta(hours=ttl_hours)
    typer.echo(
        issue(settings.agent_secret, agent_id, expires)
        if pool is None
        else issue_pool(settings.agent_secret, pool, expires)
    )


@agents_app.command("deprovision")
@user_errors
def agents_deprovision(
    pool: str = typer.Argument(..., help="The pool's name (a directory under --out)."),
    pools_dir: Path = typer.Option(POOLS_DIR, "--out", help="Where the pools' Terraform roots are."),
) -> None:
    """Destroy a pool's instances with terraform destroy."""
    from broker.agents import terraform

    root = pools_dir / pool
    if not (root / "main.tf.json").exists():
        raise BrokerError(f"pool: no Terraform root at {root}; `ls {pools_dir}` shows the pools")
    terraform.destroy_pool(root, pool)
    offer_id = terraform.pool_value(root, pool, "offer_id")
    if offer_id:  # no pool asks there now: no agent there says nothing of the zone's capacity
        CapacityHistory(make_store().shards[0]).forget([offer_id])
    out.print(f"pool {pool} destroyed")
    if _own_user(urlsplit(terraform.pool_value(root, pool, "redis_url") or "").username, pool):
        out.print(f"its agents' Redis user stays until `broker acl remove --pool {pool}` (as an admin)")


def _own_user(user: str | None, pool: str) -> bool:
    """Whether a pool's agents connect as its own ACL user (`broker acl agent --pool`), named as acl.py names it."""
    from broker.store.acl import user_name

    return user == user_name(pool=pool)
