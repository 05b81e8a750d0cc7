"""Policies by name. A policy is one class registered with `@register("name")`; callers ask `get(name)`.

Policies are pure: (job specs, offers, now) in, decisions out; no Redis, no clock, no cloud.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil

from broker.domain.errors import BrokerError

_REGISTRY: dict[str, type] = {}
_LOADED = False

DEFAULT_POLICY = "hedge"
FILL_ORDERS = ("sjf", "makespan", "deadline")  # fill.py's scores, named here for settings that load no numpy


def register(name: str):
    """Class decorator: make the policy available under `name`."""

    def add(cls: type) -> type:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return add


def names() -> list[str]:
    """The registered policy names."""
    _load_builtin()
    return sorted(_REGISTRY)


def describe() -> list[dict]:
    """Each registered policy's name and the first line of its docstring."""
    _load_builtin()
    return [{"name": n, "summary": (_REGISTRY[n].__doc__ or "").strip().splitlines()[0]} for n in sorted(_REGISTRY)]


def get(name: str = DEFAULT_POLICY, **options):
    """A new instance of the policy registered as `name`, with its options (e.g. budget_usd for costslo)."""
    _load_builtin()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise BrokerError(f"policy: unknown policy {name!r}; {hint}choose one of {', '.join(sorted(_REGISTRY))}")
    try:
        return _REGISTRY[name](**options)
    except TypeError:
        raise BrokerError(
            f"policy: {name} takes no {', '.join(options)}; use costslo or unset BROKER_ROUND_BUDGET_USD"
        ) from None


def _load_builtin() -> None:
    """Import every module of this package once: each policy registers itself, so a new policy is one new file."""
    global _LOADED
    if not _LOADED:
        for module in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{module.name}")
        _LOADED = True
