"""Errors a user can cause: one type, a one-line message naming the field and the fix."""


class BrokerError(Exception):
    """A user-facing error; the CLI prints its message and exits with code 2."""


class SpecError(BrokerError):
    """A job spec (or an override of it) is invalid."""


class InfeasibleError(BrokerError):
    """No offer meets the job's deadline and budget. `later`: where a later deadline is a fix, the option within the
    budget that finishes first (the broker says by when its futures finish at the asked odds)."""

    def __init__(self, message: str, later=None):
        super().__init__(message)
        self.later = later


class NotFoundError(BrokerError):
    """A job id that the store does not know."""


class StoreUnavailableError(BrokerError):
    """Redis cannot be reached or started."""


class SourceUnavailable(BrokerError):
    """A live price source cannot be used here (no credentials, no network); the snapshot stays."""
