"""The policy the servers plan with (`broker server --policy`, BROKER_POLICY), recorded by each as it starts
(`{prefix}policy`), so a quote made elsewhere (a laptop's `broker submit` with BROKER_POLICY unset) simulates the rule
that will run the job: a server run with `--policy cost-to-go` beside CLIs at the default had every job quoted by
hedge's futures and run by another rule.
"""

from __future__ import annotations

import redis

KEY = "policy"


def record_policy(store, name: str) -> str | None:
    """Record the policy this server plans with; returns the one recorded before (None: none)."""
    return store.redis.set(store.key(KEY), name, get=True)


def recorded_policy(store) -> str | None:
    """The policy the servers plan with, None where none recorded one (or this Redis user may not read it: an
    agent's)."""
    try:
        return store.redis.get(store.key(KEY))
    except redis.exceptions.NoPermissionError:
        return None
