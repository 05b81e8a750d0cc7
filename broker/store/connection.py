"""How the broker's processes connect to Redis: patient retries through a restart, URLs fit for logs."""

from __future__ import annotations

import math
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import EqualJitterBackoff
from redis.retry import Retry

from broker.domain.errors import StoreUnavailableError


class GiveUp:
    """Whether to stop waiting for Redis now (the process is leaving), asked before each retry. Each connection
    retries with a deep copy of the client's retry; they all share this one object, so setting `when` reaches all."""

    def __init__(self):
        self.when: Callable[[], bool] = lambda: False

    def __deepcopy__(self, memo):
        return self


class PatientRetry(Retry):
    """Reconnect and resend on connection errors (LOADING while Redis replays its AOF is one); a refused
    password or ACL is no outage and fails at once, and so does any error once `give_up.when()` holds."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.give_up = GiveUp()

    def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):
        def retryable(error: Exception) -> bool:
            refused = isinstance(error, (redis.AuthenticationError, redis.exceptions.AuthorizationError))
            return not refused and not self.give_up.when() and (is_retryable is None or is_retryable(error))

        return super().call_with_retry(do, fail, retryable, with_failure_count)


def patient_retry(outage_s: float) -> Retry:
    """Retries for about `outage_s`: backoff from 50 ms doubling to 1 s, jittered so agents do not reconnect in step."""
    return PatientRetry(EqualJitterBackoff(cap=1.0, base=0.05), retries=math.ceil(outage_s / 0.75) + 6)


def give_up_waiting_when(client, leaving: Callable[[], bool]) -> None:
    """Have the client's patient retries give up once `leaving()` holds: a process that is going away (an agent
    stopped or noticed) must not wait out a Redis outage first. A client without them fails at once already."""
    retry = client.get_retry() if hasattr(client, "get_retry") else client.retry  # a cluster client keeps it so
    if isinstance(retry, PatientRetry):
        retry.give_up.when = leaving


def with_credentials(url: str, user: str, password: str) -> str:
    """The URL (host, port, db, TLS options kept) with this user and password."""
    parts = urlsplit(url)
    netloc = f"{user}:{password}@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def redact_url(url: str) -> str:
    """The URL with its password replaced by ***, fit for logs and error messages."""
    parts = urlsplit(url)
    return with_credentials(url, parts.username or "", "***") if parts.password else url


def unreachable(url: str, err: redis.ConnectionError) -> StoreUnavailableError:
    """The one-line error for a Redis that broker cannot use: not there, or refusing the URL's credentials (Redis's
    own words for a missing password name a HELLO command, which says nothing to a user)."""
    if isinstance(err, redis.AuthenticationError):
        given = "refuses the password in it" if urlsplit(url).password else "asks for a password"
        return StoreUnavailableError(
            f"redis: {redact_url(url)} {given} ({err}); put it in BROKER_REDIS_URL: redis://:PASSWORD@host:port "
            "(redis://USER:PASSWORD@host:port for an ACL user)"
        )
    return StoreUnavailableError(f"redis: cannot reach {redact_url(url)} ({err}); check BROKER_REDIS_URL")
