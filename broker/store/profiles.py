"""Bubble profiles and fill statistics in Redis, beside the store's own keys (same prefix).

{p}bubbles:{main job}:{stage}      STRING  the BubbleProfile as JSON (replaced when the iteration time drifts)
{p}bubble-fill:{main job}:{stage}  STRING  its FillStats as JSON
"""

from __future__ import annotations

from broker.domain.bubbles import FORECAST, BubbleProfile, FillStats
from broker.store.jobs import Store


def save_profile(store: Store, bubble: BubbleProfile) -> bool:
    """Store the profile unless the stored one still holds (a measured one within 10% of this iteration time;
    a forecast is always replaced by a measurement); True if written."""
    key = store.key("bubbles", bubble.main_job, str(bubble.stage))
    current = store.redis.get(key)
    held = BubbleProfile.model_validate_json(current) if current is not None else None
    if (
        held is not None
        and not held.drifted(bubble.iteration_s)
        and (held.device != FORECAST or bubble.device == FORECAST)
    ):
        return False
    store.redis.set(key, bubble.model_dump_json())
    return True


def load_profiles(store: Store) -> list[BubbleProfile]:
    """Every stored profile, by main job and stage."""
    keys = sorted(store.redis.scan_iter(store.key("bubbles", "*")))
    return [BubbleProfile.model_validate_json(v) for v in store.redis.mget(keys) if v] if keys else []


def save_fill_stats(store: Store, stats: FillStats) -> None:
    store.redis.set(store.key("bubble-fill", stats.main_job, str(stats.stage)), stats.model_dump_json())


def load_fill_stats(store: Store) -> dict[tuple[str, int], FillStats]:
    keys = sorted(store.redis.scan_iter(store.key("bubble-fill", "*")))
    found = [FillStats.model_validate_json(v) for v in store.redis.mget(keys) if v] if keys else []
    return {(f.main_job, f.stage): f for f in found}
