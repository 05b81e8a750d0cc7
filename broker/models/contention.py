"""The broker's own jobs as competition for its capacity: where a new job can start when others hold slots.

A forecast that plays one job alone in the market puts it in the cheapest zone with spot whenever there
is any; in a busy fleet that zone is full. Here each zone has a number of slots (the agents the broker
can dispatch to there) while its spot is up, none while down, and the other active jobs, each for the
hours it has left, hold the cheapest slots with capacity first (they were there before the new job, and
the broker fills the cheapest first). The new job can start in a zone at a tick only if a slot is left
there after them. It does not evict a running job: a run survives wherever spot stays up (the caller
keeps that separate, models/futures.simulate's `available` against `launchable`). Pure numpy.
"""

from __future__ import annotations

import numpy as np


def launchable(available: np.ndarray, slots: np.ndarray, others_ticks: np.ndarray) -> np.ndarray:
    """Where a slot is free for a new job (zones x futures x ticks, bool), given where spot is up (`available`,
    zones cheapest first), each zone's slots while up, and how many ticks each other job still holds one."""
    zones, _futures, ticks = available.shape
    capacity = available * np.asarray(slots, dtype=float)[:, None, None]
    held = (np.asarray(others_ticks)[None, :] > np.arange(ticks)[:, None]).sum(axis=1)  # other jobs per tick
    in_cheaper = np.cumsum(capacity, axis=0) - capacity
    free = np.clip(in_cheaper + capacity - held[None, None, :], 0, capacity)
    return free > 0
