"""`broker check`: what this machine's broker is set up to do, as `sky check` says which clouds it may use.

One finding a part (the store, a server, agents, prices, each cloud's credentials, the checkpoint store, the agents'
secret, terraform), each ok, a note (works, but less than it could) or a problem (a command will fail), with what
to do. It reads and asks nothing it need not: no price is fetched and no job changes.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

import redis

from broker.agents.contract import newest_token
from broker.agents.tokens import expires_at, pool_of
from broker.app.settings import Settings
from broker.domain.errors import BrokerError
from broker.store.memory import FULL_SHARE, Memory, eviction_problem, usage
from broker.store.policy import recorded_policy

OK, NOTE, PROBLEM = "ok", "note", "problem"
CLOUDS = ("aws", "gcp", "azure")
TOKEN_NOTICE = timedelta(days=1)  # how long before its registration token ends an agent's is named


@dataclass(frozen=True)
class Finding:
    part: str
    status: str  # ok, note or problem
    detail: str  # what was found, and for a note or a problem what to do

    def as_dict(self) -> dict:
        return asdict(self)


def checkup(settings: Settings) -> list[Finding]:
    """Every part's finding, the store's first: without it the server, agents and prices are not looked at."""
    from broker.app.wiring import store_for

    try:
        store = store_for(settings)
    except BrokerError as error:
        store, findings = None, [Finding("redis", PROBLEM, str(error))]
    else:
        findings = [_redis(store, settings), _server(store), _agents(store)]
        findings += [users] if settings.redis_url and (users := _acl_users(store, settings.redis_url)) else []
    findings.append(_prices(store))
    findings += [_credentials(cloud) for cloud in CLOUDS]
    return findings + [_checkpoints(settings), _secret(settings), _terraform()]


def _redis(store, settings: Settings) -> Finding:
    where = "BROKER_REDIS_URL" if settings.redis_url else f"embedded, data in {settings.home / 'redis'}"
    info = store.redis.info("server")
    version = info.get("redis_version", "?") if isinstance(info, dict) else "?"
    try:
        durable = store.redis.config_get("appendonly").get("appendonly") == "yes"
    except redis.ResponseError:  # managed Redis often forbids CONFIG: its durability is its own to say
        durable = None
    jobs, nodes = store.job_count(), Memory.of(store.redis)
    shards = len(store.shards)
    detail = f"{store.url}, redis {version} ({where}); {jobs} job{'s' * (jobs != 1)}"
    detail += f" in {shards} shards" if shards > 1 else ""
    detail += f"; {usage(nodes)}"
    if problem := eviction_problem(nodes):
        return Finding("redis", PROBLEM, f"{detail}; {problem}")
    notes = []
    if (full := max(n.full_share() or 0.0 for n in nodes)) >= FULL_SHARE:
        notes.append(
            f"{full:.0%} of a node's maxmemory is used, and writes fail when it is full: forget old jobs "
            "(`broker server --keep-ended-days N`) or give Redis more memory"
        )
    if durable is False:
        notes.append("appendonly is off: a restart loses what was not saved; turn it on")
    if notes:
        return Finding("redis", NOTE, "; ".join([detail, *notes]))
    return Finding("redis", OK, detail + ("" if durable else "; CONFIG not allowed: durability is the host's"))


def _server(store) -> Finding:
    planners = [shard.planner() for shard in store.shards]
    if not any(planners):
        return Finding(
            "server",
            NOTE,
            "no broker server is running: queued jobs wait; start `broker server` (`broker run` hosts one)",
        )
    policy = recorded_policy(store)  # what the commands with BROKER_POLICY unset quote with too
    by = f"planned by {', '.join(sorted({p for p in planners if p}))}" + (f" with {policy}" if policy else "")
    idle = [str(i) for i, planner in enumerate(planners) if not planner]
    if idle:  # a replica plans every shard whose lease it can take: these have none, and their jobs wait
        return Finding("server", NOTE, f"{by}; shard {', '.join(idle)} of {len(planners)} has no server: restart one")
    return Finding("server", OK, by)


def _agents(store) -> Finding:
    registered, working = len(store.agents_with_leases()), store.working_agents()
    refused = store.refusals()
    named = ", ".join(f"{agent} ({why})" for agent, why in list(refused.items())[:3])
    more = f" and {len(refused) - 3} more" if len(refused) > 3 else ""
    turned_away = (
        f"; refused in the last day: {named}{more}: give each a token (`broker agents token --id` or --pool)"
        if refused
        else ""
    )
    if not working:
        gone = f" ({registered} registered, their leases lapsed or leaving)" if registered else ""
        return Finding(
            "agents",
            NOTE,
            f"none working{gone}: start one (`broker agent`, `broker agents provision`, `broker run`){turned_away}",
        )
    busy = sum(1 for agent in working if agent.job)
    alone = sum(1 for agent in working if agent.for_job)
    started = f" ({alone} started for one job alone: `broker run`)" if alone else ""
    ending = _tokens_ending(store, working)
    status = NOTE if refused or ending else OK
    return Finding("agents", status, f"{len(working)} working{started}, {busy} running a job{turned_away}{ending}")


def _tokens_ending(store, working) -> str:
    """The working agents' tokens that end within TOKEN_NOTICE (or have) and that the server has not renewed (it
    renews them a day before they end, core/renewal.py): the agents run on, admitted, but a restart or a pool's new
    instance (a spot pool replaces its preempted ones) would be refused."""
    soon = datetime.now(UTC) + TOKEN_NOTICE
    ending = sorted(
        {
            (at, f"pool {pool}" if (pool := pool_of(a.token)) else a.id)
            for a in working
            if (at := expires_at(a.token)) is not None
            and at < soon
            and (expires_at(newest_token(store, a.id, a.token)) or soon) < soon  # read only for those ending
        }
    )
    if not ending:
        return ""
    named = ", ".join(f"{name}'s {at:%Y-%m-%d %H:%M} UTC" for at, name in ending[:3])
    return (
        f"; registration tokens ending, not renewed: {named}: agents running keep working, restarts and new ones "
        "will be refused: run `broker server` with BROKER_AGENT_SECRET (it renews them), or issue new tokens "
        "(`broker agents provision` again for a pool, `broker agents token`)"
    )


def _acl_users(store, url: str) -> Finding | None:
    """Whether the agents' and pools' ACL users hold this version's rights, where this URL's user may look (an
    admin's, after an upgrade); None where it may not, or there are none."""
    from broker.store.acl import current_users

    try:
        current = current_users(url, [shard.prefix for shard in store.shards])
    except BrokerError:  # not an admin's URL, or a Redis without ACL users
        return None
    old = [user for user, ok in current.items() if not ok]
    if old:
        named = ", ".join(old[:5]) + (f" and {len(old) - 5} more" if len(old) > 5 else "")
        return Finding(
            "acl users",
            NOTE,
            f"{named}: made by an older version, their agents may not read what this one keeps for them (renewed "
            "tokens): `broker acl upgrade` (passwords kept)",
        )
    return (
        Finding("acl users", OK, f"{len(current)} agent and pool users, with this version's rights")
        if current
        else None
    )


def _prices(store) -> Finding:
    from broker.app.render import relative
    from broker.store.prices import PriceHistory

    refreshed = PriceHistory(store).refreshed() if store is not None else {}
    if not refreshed:
        return Finding(
            "prices", NOTE, "the snapshot's only: `broker prices refresh` records live prices where credentials allow"
        )
    now = datetime.now(UTC)
    ages = ", ".join(f"{source} {relative(at, now)}" for source, at in sorted(refreshed.items()))
    return Finding("prices", OK, f"refreshed: {ages}")


def _credentials(cloud: str) -> Finding:
    """Whether the cloud's SDK finds credentials the way `broker prices refresh` and the agents' notices use them."""
    if cloud == "azure":
        if os.environ.get("AZURE_SUBSCRIPTION_ID"):
            return Finding(cloud, OK, "AZURE_SUBSCRIPTION_ID set: azure-identity's chain signs in at a refresh")
        return Finding(
            cloud,
            NOTE,
            "prices need no credentials; set AZURE_SUBSCRIPTION_ID (and sign in) for shapes and eviction bands",
        )
    from broker.domain.errors import SourceUnavailable

    try:
        if cloud == "aws":
            from broker.pricing.aws import AwsPrices

            AwsPrices([]).check()
        else:
            from broker.pricing.gcp import GcpPrices

            GcpPrices([]).check()
    except SourceUnavailable as error:
        return Finding(cloud, NOTE, str(error).removeprefix(f"{cloud}: "))  # the source's own line, as refresh says it
    return Finding(cloud, OK, "credentials found: `broker prices refresh` reads live prices")


def _checkpoints(settings: Settings) -> Finding:
    from broker.agents.checkpoints import CheckpointStore

    try:
        CheckpointStore(settings.checkpoints).ensure_root()
    except BrokerError as error:
        return Finding("checkpoints", PROBLEM, f"{error} (BROKER_CHECKPOINTS)")
    return Finding("checkpoints", OK, f"{settings.checkpoints} (BROKER_CHECKPOINTS)")


def _secret(settings: Settings) -> Finding:
    if settings.agent_secret:
        return Finding("agent secret", OK, "set: an agent registers with a token (`broker agents token`)")
    return Finding(
        "agent secret",
        NOTE,
        "BROKER_AGENT_SECRET not set: any agent that reaches Redis registers; set it (16+ characters) before agents "
        "run on other machines",
    )


def _terraform() -> Finding:
    from broker.agents.terraform import terraform_binary

    binary = terraform_binary()
    if binary is None:
        return Finding("terraform", NOTE, "not on PATH: `broker agents provision --apply` needs it (--plan does not)")
    return Finding("terraform", OK, binary)
