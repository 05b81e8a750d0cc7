"""Errors a user can cause: one type, a one-line message naming the field and the fix."""


class BrokerError(Exception):
    """A user-facing error; the CLI prints its message and exits with its code (2)."""

    exit_code = 2


class SpecError(BrokerError):
    """A job spec (or an override of it) is invalid."""


class InfeasibleError(BrokerError):
    """No offer meets the job's deadline and budget. Where a later deadline is a fix, `later` is the option within the
    budget that finishes first; where a larger budget is, `dearer` is the cheapest option in time (the broker reads
    both fixes from their futures)."""

    def __init__(self, message: str, later=None, dearer=None):
        super().__init__(message)
        self.later, self.dearer = later, dearer


class NotFoundError(BrokerError):
    """A job id that the store does not know."""


class RefusedError(BrokerError):
    """The broker refused this agent (its registration token). Exit 3, so that a service manager does not start it
    again into the same refusal (the Terraform modules' units: RestartPreventExitStatus=3); a Redis outage stays 2."""

    exit_code = 3


class StoreUnavailableError(BrokerError):
    """Redis cannot be reached or started."""


class SourceUnavailable(BrokerError):
    """A live price source cannot be used here (no credentials, no network); the snapshot stays."""
