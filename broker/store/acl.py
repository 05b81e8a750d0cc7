"""Redis ACL users for a shared Redis: one for the broker, one per agent or pool, each allowed what its process does.

An agent's user reaches its own assignment stream, lease and registration record, reads its own views of
the jobs it was given ({p}own:{agent}:*) and why the broker refused it, if it did ({p}refused:{agent}), adds
itself to the agent set and appends to the agent-events stream and its own log stream; it cannot read the event
stream, any job, or another agent's keys. The last three rights are Redis 7 selectors, so `SADD` and `XADD` work
on those keys and nothing else does (no SET over the streams). A pool's user holds those rights for every agent named
`<pool>.<name>`, in every shard (an agent's shard follows from its name, which a pool's members learn only when they
start), the pool's renewed token (its new instances' registration, core/renewal.py), and the bubble profiles of a
training job of the pool's name: a training job's stages are the pool of its name (domain/bubbles.stage_agent_id),
and they publish their profiles. On a Redis Cluster each node keeps its own users, so a user is made on every node,
and an agent may ask where keys live (CLUSTER SLOTS, COMMAND), as redis-py's cluster client does.
"""

from __future__ import annotations

import re
import secrets

import redis
from redis.cluster import RedisCluster

from broker.domain.errors import BrokerError
from broker.domain.model import agent_id_problem
from broker.store.connection import with_credentials
from broker.store.layout import layout_key
from broker.store.shards import connect, shard_of

NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")  # no glob or ':' characters: they would widen the key patterns
CONNECT = ["+ping", "+hello", "+auth", "+select", "+client|setname", "+multi", "+exec", "+discard"]
CLUSTER = ["+cluster|info", "+cluster|slots", "+command"]  # a cluster client learns where keys live
AGENT_COMMANDS = ["+get", "+set", "+xreadgroup", "+xack", "+xgroup|create"]


def agent_rules(prefixes: list[str], agent: str) -> list[str]:
    """ACL SETUSER rules (after the password) for the agent `agent`, or for a pool's (`<pool>.*`), in each shard."""
    keys, selectors = [], []
    for p in prefixes:
        keys += [f"~{p}assign:{agent}", f"~{p}lease:{agent}", f"~{p}agent:{agent}"]
        keys += [f"%R~{p}own:{agent}:*", f"%R~{p}refused:{agent}", f"%R~{p}renewed:{agent}", f"%R~{layout_key(p)}"]
        selectors += [f"(+xadd %W~{p}agent-events)", f"(+sadd %W~{p}agents)", f"(+xadd %W~{p}log:{agent})"]
    return ["resetkeys", "resetchannels", "-@all", *CONNECT, *CLUSTER, *AGENT_COMMANDS, *keys, *selectors]


def pool_rules(prefixes: list[str], pool: str) -> list[str]:
    """An agent's rules for every agent named `<pool>.<name>` in any shard, and the profiles of the training job
    `pool` (store/profiles.py: in the first shard; a stage reads its stored one before it replaces it)."""
    profiles = [f"~{prefixes[0]}bubbles:{pool}:*", f"%W~{prefixes[0]}bubble-fill:{pool}:*"]
    renewed = [f"%R~{p}pool-token:{pool}" for p in prefixes]  # its new instances' token (core/renewal.py)
    return [*agent_rules(prefixes, f"{pool}.*"), *profiles, *renewed]


def rules_of(user: str, prefixes: list[str]) -> list[str] | None:
    """This version's rules for a user made by `broker acl agent` (`agent-<id>`, `pool-<name>`), None for another."""
    kind, _, name = user.partition("-")
    if not name or agent_id_problem(name):
        return None
    if kind == "agent":
        return agent_rules([prefixes[shard_of(name, len(prefixes))]], name)
    return pool_rules(prefixes, name) if kind == "pool" else None


def broker_rules(prefix: str) -> list[str]:
    """The broker's user: every data command on its own keys; no ACL, no flush, no shutdown."""
    return [
        "resetkeys",
        "resetchannels",
        "&*",
        "+@all",
        "-@dangerous",
        "+config|get",
        "+config|set",
        "+info",
        f"~{prefix}*",
    ]


def _plain(name: str, field: str) -> str:
    if not NAME.match(name):
        raise BrokerError(f"{field}: {name!r} is not a plain name; use letters, digits, '.', '_' or '-' (at most 64)")
    return name


def _acl(admin_url: str, *command: str):
    """An ACL command as the admin, on every node of a cluster (each keeps its own users): {node: reply} there."""
    client = connect(admin_url)
    on_every_node = {"target_nodes": RedisCluster.ALL_NODES} if isinstance(client, RedisCluster) else {}
    try:
        return client.execute_command("ACL", *command, **on_every_node)
    except redis.exceptions.NoPermissionError:
        raise BrokerError(
            f"BROKER_REDIS_URL: its user may not run ACL {command[0]}; use an admin user's URL for this command"
        ) from None
    except redis.ResponseError as err:
        raise BrokerError(
            f"redis: ACL {command[0]} refused ({err}); Redis 7 or newer is needed for agent users"
        ) from None


def create_user(admin_url: str, user: str, rules: list[str], password: str | None = None) -> str:
    """Create or replace the ACL user; returns the Redis URL it connects with (the admin URL's host, db, TLS)."""
    password = password or secrets.token_urlsafe(24)
    _acl(admin_url, "SETUSER", user, "reset", "on", f">{password}", *rules)
    return with_credentials(admin_url, user, password)


def delete_user(admin_url: str, user: str) -> bool:
    """Delete the ACL user (Redis closes its connections): a retired agent's, a destroyed pool's; False if none."""
    deleted = _acl(admin_url, "DELUSER", user)
    return (sum(deleted.values()) if isinstance(deleted, dict) else deleted) > 0


def user_name(agent_id: str | None = None, pool: str | None = None, name: str | None = None) -> str:
    """The ACL user of an agent, of a pool, or named (the broker's)."""
    if agent_id is not None:
        if problem := agent_id_problem(agent_id):  # the rule `broker agent --id` keeps: a pool's ids pass both
            raise BrokerError(f"--id: {problem}")
        return f"agent-{agent_id}"
    if pool is not None:
        if problem := agent_id_problem(pool):  # a pool's name begins its agents' ids
            raise BrokerError(f"--pool: {problem.replace('an agent id', 'a pool name')}")
        return f"pool-{pool}"
    return _plain(name or "broker", "--name")


def agent_user(admin_url: str, prefix: str, agent_id: str, password: str | None = None) -> str:
    return create_user(admin_url, user_name(agent_id=agent_id), agent_rules([prefix], agent_id), password)


def pool_user(admin_url: str, prefixes: list[str], pool: str, password: str | None = None) -> str:
    return create_user(admin_url, user_name(pool=pool), pool_rules(prefixes, pool), password)


def broker_user(admin_url: str, prefix: str, name: str = "broker", password: str | None = None) -> str:
    return create_user(admin_url, user_name(name=name), broker_rules(prefix), password)


def _users(admin_url: str, prefixes: list[str]) -> dict[str, list[str]]:
    """The agents' and pools' users (`broker acl agent`'s) and this version's rules for each."""
    listed = _acl(admin_url, "USERS")
    on_nodes = listed.values() if isinstance(listed, dict) else [listed]  # a cluster's: per node
    names = sorted({n.decode() if isinstance(n, bytes) else n for users in on_nodes for n in users})
    return {user: rules for user in names if (rules := rules_of(user, prefixes)) is not None}


def current_users(admin_url: str, prefixes: list[str]) -> dict[str, bool]:
    """Each agent's and pool's user, and whether it may read what this version keeps for its agents (the keys an
    older version's users lacked: the shards' layout, its renewed token, a pool's token): ACL DRYRUN, on every
    node of a cluster."""
    current = {}
    for user in _users(admin_url, prefixes):
        kind, _, name = user.partition("-")
        own = prefixes[shard_of(name, len(prefixes))] if kind == "agent" else prefixes[0]
        keys = [layout_key(own), f"{own}renewed:{name if kind == 'agent' else name + '.probe'}"]
        keys += [f"{own}pool-token:{name}"] if kind == "pool" else []
        replies = [_acl(admin_url, "DRYRUN", user, "GET", key) for key in keys]
        replies = [r for reply in replies for r in (reply.values() if isinstance(reply, dict) else [reply])]
        current[user] = all(r in (b"OK", "OK", True) for r in replies)
    return current


def upgrade_users(admin_url: str, prefixes: list[str]) -> list[str]:
    """Give every agent's and pool's user this version's rules, keeping its password and whether it is on; returns
    their names. A user made by an older version lacks keys newer agents read (the shards' layout, renewed and pool
    tokens), and making it again changes the password its instances hold."""
    users = _users(admin_url, prefixes)
    for user, rules in users.items():
        _acl(admin_url, "SETUSER", user, "clearselectors", *rules)  # no reset: its passwords and on/off stay
    return list(users)
