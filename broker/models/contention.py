"""The broker's own jobs as competition for its capacity: where a new job can start when others hold slots.

A forecast that plays one job alone in the market puts it in the cheapest zone with spot whenever there
is any; in a busy fleet that zone is full. Here each zone has a number of slots (the agents the broker
can dispatch to there) while its spot is up, none while down; a job running in a zone holds a slot there
(`pinned`), and the jobs waiting ahead of the new one in the queue (priority, then deadline), each for the hours
it has left on spot, hold the cheapest slots with capacity first (the broker fills the cheapest first;
core/fleet.Fleet.held tells the two apart). The new job can start in a zone at a tick only if a slot is left
there after them. It does not evict a running job: a run survives wherever spot stays up (the caller keeps that
separate, models/futures.simulate's `available` against `launchable`). Pure numpy.
"""

from __future__ import annotations

import numpy as np


def launchable(
    available: np.ndarray,
    slots: np.ndarray,
    others_ticks: np.ndarray,
    arriving: np.ndarray | None = None,
    pinned: np.ndarray | None = None,
) -> np.ndarray:
    """Where a slot is free for a new job (zones x futures x ticks, bool), given where spot is up (`available`,
    zones cheapest first), each zone's slots while up, how many ticks each other job still holds one, the
    slots held per future and tick by jobs still to arrive (`arriving`, futures x ticks; none when not given), and
    the slots held in one zone each by jobs running there (`pinned`, zones x ticks; none when not given)."""
    zones, _futures, ticks = available.shape
    capacity = available * np.asarray(slots, dtype=float)[:, None, None]
    if pinned is not None:
        capacity = np.clip(capacity - np.asarray(pinned, dtype=float)[:, None, :], 0, None)
    held = (np.asarray(others_ticks)[None, :] > np.arange(ticks)[:, None]).sum(axis=1)  # other jobs per tick
    held = held[None, :] if arriving is None else held[None, :] + arriving
    in_cheaper = np.cumsum(capacity, axis=0) - capacity
    free = np.clip(in_cheaper + capacity - held[None, :, :], 0, capacity)
    return free > 0


def arrivals(
    rng: np.random.Generator,
    futures: int,
    ticks: int,
    per_tick: float,
    hold_ticks: np.ndarray,
    due_ticks: np.ndarray | None = None,
    deadline_ticks: float = np.inf,
) -> np.ndarray:
    """Slots held per future and tick, ahead of a job due in `deadline_ticks`, by jobs that arrive from now on:
    Poisson arrivals at `per_tick` a tick, each like one of the recent jobs (drawn together: `hold_ticks` it held a
    slot, `due_ticks` from its submission to its deadline). One due after this job's deadline waits behind it (the
    queue goes by deadline), so only those due before it count."""
    if per_tick <= 0 or len(hold_ticks) == 0:
        return np.zeros((futures, ticks))
    counts = rng.poisson(per_tick, (futures, ticks))
    future, start = np.nonzero(counts)
    future, start = np.repeat(future, counts[future, start]), np.repeat(start, counts[future, start])
    like = rng.integers(0, len(hold_ticks), len(start))
    due = np.full(len(hold_ticks), -np.inf) if due_ticks is None else np.asarray(due_ticks, dtype=float)
    ahead = start + due[like] < deadline_ticks
    future, start, like = future[ahead], start[ahead], like[ahead]
    end = np.minimum(start + np.asarray(hold_ticks)[like], ticks)
    change = np.zeros((futures, ticks + 1))
    np.add.at(change, (future, start), 1)
    np.add.at(change, (future, end), -1)
    return np.cumsum(change, axis=1)[:, :ticks]
