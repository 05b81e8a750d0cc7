"""Token renewal: the server gives each admitted agent process whose registration token is about to end a token
of its own, which the agent keeps (`broker agent --token-file`) and registers with when it restarts. Without it a
restart after a pool's token ended (a crash, a Redis outage, a reboot) was refused, and its instance sat idle,
billed, until someone provisioned the pool again. A pool's agents are given their pool's token (they could admit
any instance of the pool already), which is also kept where the pool's new instances read it as they start: a spot
pool replaces the instances it loses, and theirs would be the token written into the pool's boot data, ended.
"""

from __future__ import annotations

import logging
from datetime import datetime

from broker.agents import tokens
from broker.domain.model import AgentInfo
from broker.store.jobs import Store
from broker.store.renewals import put_pool_token, put_renewed, renewed_tokens

log = logging.getLogger(__name__)


def renew_tokens(store: Store, secret: str, agents: list[tuple[AgentInfo, str | None]], now: datetime) -> list[str]:
    """Renew the tokens due of the live admitted agents (with their leases, as the store lists them); returns
    their ids. Nothing is read from Redis while no agent's token is due."""
    due = [a for a, lease in agents if lease not in (None, "leaving") and tokens.due(a.token, now)]
    if not due:
        return []
    held = renewed_tokens(store, [a.id for a in due])
    # renewed again once it is due itself, or no longer verifies (BROKER_AGENT_SECRET replaced)
    due = [a for a in due if tokens.due(held[a.id], now) or tokens.refusal(secret, a.id, held[a.id], now)]
    admitted = store.admitted(due)
    renewed, until = [a for a in due if a.id in admitted], now + tokens.RENEWED_FOR
    pools: dict[str, str] = {}  # pool -> its token renewed in this pass (one for all its agents)
    for agent in renewed:
        pool = tokens.pool_of(agent.token)
        if pool is not None and pool not in pools:
            pools[pool] = tokens.renewed(secret, agent.id, agent.token, now)
            put_pool_token(store, pool, pools[pool], until)
        token = pools[pool] if pool else tokens.renewed(secret, agent.id, agent.token, now)
        put_renewed(store, agent.id, token, until)
        log.info("agent=%s registration token renewed for %s", agent.id, tokens.RENEWED_FOR)
    return [a.id for a in renewed]
