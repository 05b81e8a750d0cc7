"""A job's cost and finish on sampled futures of spot capacity, run by the rule its policy follows.

The analytic money model (models/risk.py) assumes spot can always be launched and preemptions
are a constant-rate Poisson process; the traces say neither. Here the job is played out tick by
tick on each of many sampled availability futures (one bool array per zone: futures x ticks), the
way the broker would run it:
- waiting: launch in the first (cheapest) zone with capacity, paying the restart time d first;
  Uniform Progress (`rule="uniform"`) also goes on-demand when idle and behind ep(t);
- on spot: progress at 1 / work_h per hour, less the checkpoint writes (delta every Young interval
  tau); when the zone loses capacity the run is preempted and the work since its last checkpoint is lost;
- the safety net of Can't Be Late (time left < on-demand work left + 2d): the guard checkpoints the
  job and moves it to on-demand, where it stays to the end (the server never moves it back);
- `rule="spot-only"` has no guard (SkyPilot's managed spot): it waits for spot however late it gets.
All futures advance together (numpy over the futures axis): 1,000 futures of a few hundred ticks
take tens of milliseconds. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

RULES = ("greedy", "uniform", "spot-only")
WAIT, SPOT, DONE = 0, 1, 2


@dataclass(frozen=True)
class Setting:
    """One job on spot zones with an on-demand fallback, in hours and USD per hour."""

    work_h: float  # exclusive hours on the spot offers
    od_work_h: float  # exclusive hours on the on-demand fallback
    spot_prices: tuple[float, ...]  # per zone, in the order the zones' futures are given (cheapest first)
    od_price: float
    restart_h: float  # d: a new instance and the restore (paid at every start)
    checkpoint_h: float  # delta: one checkpoint write
    interval_h: float | None  # tau: hours of progress between checkpoints (None: no checkpoints)
    window_h: float  # hours to the deadline (inf: none)
    rule: str = "greedy"


@dataclass(frozen=True)
class Outcomes:
    """Per future: what the job cost, when it finished (hours from now; inf if not by the horizon), and
    the hours it ran on spot and on-demand."""

    cost_usd: np.ndarray
    finish_h: np.ndarray
    spot_h: np.ndarray
    od_h: np.ndarray


def simulate(setting: Setting, available: np.ndarray, tick_h: float) -> Outcomes:
    """Play the job out on `available` (zones x futures x ticks, bool); the horizon is the ticks given."""
    s = setting
    if s.rule not in RULES:
        raise ValueError(f"rule: {s.rule!r}; one of {', '.join(RULES)}")
    zones, n, ticks = available.shape
    prices = np.asarray(s.spot_prices, dtype=float)
    state = np.full(n, WAIT)
    zone = np.zeros(n, dtype=int)
    done = np.zeros(n)  # share of the work done (0-1), checkpointed or not
    saved = np.zeros(n)  # share of the work in the newest checkpoint
    dead = np.zeros(n)  # hours of restart still to pay before progress
    cost, spot_h, od_h = np.zeros(n), np.zeros(n), np.zeros(n)
    finish = np.full(n, math.inf)
    writes = 1 + (s.checkpoint_h / s.interval_h if s.interval_h else 0.0)  # wall hours per hour of progress
    guard = s.rule != "spot-only" and math.isfinite(s.window_h)
    for t in range(ticks):
        now = t * tick_h
        up = available[:, :, t]  # zones x futures
        lost = (state == SPOT) & ~up[zone, np.arange(n)]
        done = np.where(lost, saved, done)  # preempted: back to the last checkpoint
        state = np.where(lost, WAIT, state)
        if guard:
            left_od = (1 - done) * s.od_work_h
            time_left = s.window_h - now
            to_od = (state != DONE) & (time_left < left_od + 2 * s.restart_h)
            if s.rule == "uniform":
                behind = done < min(1.0, now / s.window_h) if s.window_h > 0 else True
                to_od |= (state == WAIT) & ~up.any(axis=0) & behind
            # on-demand to the end: a running job is checkpointed first, a waiting one resumes from its checkpoint
            kept = np.where(state == SPOT, done, saved)
            hours = s.restart_h + (1 - kept) * s.od_work_h
            finish = np.where(to_od, now + hours, finish)
            cost = np.where(to_od, cost + s.od_price * hours, cost)
            od_h = np.where(to_od, hours, od_h)
            state = np.where(to_od, DONE, state)
        launch = (state == WAIT) & up.any(axis=0)
        zone = np.where(launch, np.argmax(up, axis=0), zone)
        dead = np.where(launch, s.restart_h, dead)
        state = np.where(launch, SPOT, state)
        running = state == SPOT
        if not running.any():
            continue
        paid = np.minimum(dead, tick_h)
        progress_h = (tick_h - paid) / writes  # hours of exclusive progress this tick
        need_h = (1 - done) * s.work_h
        finishing = running & (progress_h >= need_h)
        used = np.where(finishing, paid + need_h * writes, tick_h)
        price = prices[zone]
        cost = np.where(running, cost + price * used, cost)
        spot_h = np.where(running, spot_h + used, spot_h)
        finish = np.where(finishing, now + used, finish)
        new_done = np.where(running, np.minimum(1.0, done + progress_h / s.work_h), done)
        if s.interval_h:
            step = s.interval_h / s.work_h  # share of the work between checkpoints
            saved = np.where(running, np.maximum(saved, np.floor(new_done / step + 1e-9) * step), saved)
        done = new_done
        dead = np.where(running, dead - paid, dead)
        state = np.where(finishing, DONE, state)
        if (state == DONE).all():
            break
    return Outcomes(cost, finish, spot_h, od_h)
