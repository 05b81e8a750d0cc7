"""Bubble profiles: what a running pipeline's stages measured of their idle windows, kept in Redis.

A profile summarises several iterations of one stage: the iteration period (median), and per
window kind its median and 10th-percentile length and the least free memory seen, so the
planner prices a window by what it is nearly always at least. A profile is replaced when the
main job's iteration time drifts more than 10% from it. PipeFill's doubling probe measures
how much of a window a fill job may really use: wait at the bubble instruction, start at
100 ms, double each iteration until the main job's iteration time rises.

Keys (same prefix as the store): {p}bubbles:{main job}:{stage}      STRING  the BubbleProfile as JSON
                                 {p}bubble-fill:{main job}:{stage}  STRING  its FillStats as JSON
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
from pydantic import BaseModel

from broker.models.schedule import bubble_windows
from broker.store.jobs import Store

DRIFT = 0.10
FORECAST = "forecast"  # the device of a profile from the model, before any measurement


class WindowStats(BaseModel):
    kind: str
    offset_s: float = 0.0  # median start within the iteration
    median_s: float
    p10_s: float
    free_bytes: int  # the least free memory seen at this window's start
    count: int


class BubbleProfile(BaseModel):
    """One stage of a main training job: its iteration period and idle windows."""

    main_job: str
    stage: int
    device: str  # e.g. "cuda:0 H100" or "cpu"
    iteration_s: float
    windows: list[WindowStats]
    measured_at: datetime

    def bubble_fraction(self) -> float:
        """Share of the iteration this stage is idle in its recorded windows (medians)."""
        return sum(w.median_s for w in self.windows) / self.iteration_s

    def usable_s(self, min_window_s: float = 0.0) -> float:
        """Idle seconds per iteration in windows that are nearly always (p10) at least min_window_s long."""
        return sum(w.p10_s for w in self.windows if w.p10_s >= min_window_s)

    def drifted(self, iteration_s: float) -> bool:
        """Whether the main job's iteration time moved more than 10% since this profile."""
        return abs(iteration_s - self.iteration_s) > DRIFT * self.iteration_s


def profile(
    main_job: str, stage: int, device: str, windows: list, iterations: list, measured_at: datetime, warmup: int = 1
) -> BubbleProfile:
    """A profile from an engine's records: windows (kind, start, end, free bytes) and iterations (start, end).
    The first `warmup` iterations are left out (allocator and communicator set-up)."""
    kept = iterations[warmup:] or iterations
    first = kept[0][0]
    stats = []
    for kind in sorted({w[0] for w in windows}):
        mine = [w for w in windows if w[0] == kind and w[1] >= first] or [w for w in windows if w[0] == kind]
        lengths = np.array([end - start for _, start, end, _ in mine])
        offsets = [start - max((b for b, _ in iterations if b <= start), default=start) for _, start, _, _ in mine]
        stats.append(
            WindowStats(
                kind=kind,
                offset_s=float(np.median(offsets)),
                median_s=float(np.median(lengths)),
                p10_s=float(np.percentile(lengths, 10)),
                free_bytes=int(min(w[3] for w in mine)),
                count=len(mine),
            )
        )
    period = float(np.median([end - start for start, end in kept]))
    return BubbleProfile(
        main_job=main_job, stage=stage, device=device, iteration_s=period, windows=stats, measured_at=measured_at
    )


def forecast(
    main_job: str,
    schedule: str,
    p: int,
    m: int,
    t_f: list[float],
    t_b: list[float],
    free_bytes: list[int],
    device: str,
    at: datetime,
    v: int = 1,
    exchange_s: float = 0.0,
) -> list[BubbleProfile]:
    """Each stage's profile from the analytic schedule model, before anything is measured: every window
    as long as the model says (median = p10); a measured profile replaces it when it is saved."""
    period, stages = bubble_windows(schedule, p, m, t_f, t_b, v, exchange_s=exchange_s)
    return [
        BubbleProfile(
            main_job=main_job,
            stage=stage,
            device=device,
            iteration_s=period,
            measured_at=at,
            windows=[
                WindowStats(
                    kind=w.kind,
                    offset_s=w.offset_s,
                    median_s=w.duration_s,
                    p10_s=w.duration_s,
                    free_bytes=free_bytes[stage],
                    count=0,
                )
                for w in windows
            ],
        )
        for stage, windows in enumerate(stages)
    ]


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


class FillStats(BaseModel):
    """What a stage's fill executor made of its bubbles while it served fill jobs (for the dashboard)."""

    main_job: str
    stage: int
    bubble_s: float = 0.0  # idle time of the windows that came while it held a fill job (profile medians)
    fill_s: float = 0.0  # time its fill steps ran
    iteration_s: float | None = None  # the main job's median iteration time meanwhile
    jobs: int = 0  # fill jobs served
    updated_at: datetime

    def fill_share(self) -> float | None:
        return self.fill_s / self.bubble_s if self.bubble_s > 0 else None

    def slowdown(self, profile: BubbleProfile) -> float | None:
        """The main job's iteration time with fill over its time in the profile (measured without), less 1."""
        return None if self.iteration_s is None else self.iteration_s / profile.iteration_s - 1


def save_fill_stats(store: Store, stats: FillStats) -> None:
    store.redis.set(store.key("bubble-fill", stats.main_job, str(stats.stage)), stats.model_dump_json())


def load_fill_stats(store: Store) -> dict[tuple[str, int], FillStats]:
    keys = sorted(store.redis.scan_iter(store.key("bubble-fill", "*")))
    found = [FillStats.model_validate_json(v) for v in store.redis.mget(keys) if v] if keys else []
    return {(f.main_job, f.stage): f for f in found}
