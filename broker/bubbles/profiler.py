"""Bubble profiles from measurements (profile) or from the schedule model before any (forecast).

A profile summarises several iterations of one stage: the iteration period (median), and per
window kind its median and 10th-percentile length and the least free memory seen, so the
planner prices a window by what it is nearly always at least. broker/store/profiles.py keeps
them, replacing one when the main job's iteration time drifts more than 10% from it.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np

from broker.domain.bubbles import BubbleProfile, WindowStats
from broker.models.schedule import bubble_windows


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
