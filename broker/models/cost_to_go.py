"""The cheapest way to a deadline under the market model: each move's expected cost to go, solved backwards.

The market as the model sees it, one state a tick: spot up or down, and how long that spell has lasted (its
age; spells are heavy-tailed, so the age says how soon it ends). The job's state: ticks left to its deadline,
ticks of work left, and what it runs on (nothing, spot, on-demand). Each tick it waits, runs on spot (when up)
or runs on on-demand. A start pays the changeover (ticks without progress); a preemption loses the work since
the last checkpoint. A run on spot is preempted when the spell ends, and also within one, with the pool's `shrink`
a tick: a pool that shrinks without emptying takes back some of its busy instances (then spot is still up, and a
new start pays the changeover). Backward induction over the time left gives, in every state, the move of least expected
cost that still finishes by the deadline whatever the market does: a miss costs more than any schedule, so the
moves keep Can't Be Late's safety net by themselves. Where the deadline is lost whatever is done, the move is
on-demand (the soonest finish).

The chain is the same at every tick, so the moves depend on the time left, not on the clock: one table serves
every job with the same prices, changeover and checkpoint loss (`CostToGo.solve`, `CostToGo.move`).
Pure numpy: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IDLE, SPOT, OD = 0, 1, 2  # what a job runs on, and the moves
AGES = 16  # ages a spell is told apart by, in ticks; past the last, the tail's mean hazard
BIG = 1e9  # the cost of a missed deadline: more than any schedule
FLOOR = 1e-3  # the least chance a spell ends in a tick: no state of the market is sure to last
WAITING_USD = 1e-6  # what waiting must save to beat progress (a tie is no reason to wait)


@dataclass(frozen=True)
class SpellChain:
    """Spot availability as a semi-Markov chain: P(a spell ends after a tick at each age), down first, then up."""

    ends: np.ndarray  # (2, ages)

    @classmethod
    def from_spells(cls, up, down, ages: int = AGES) -> SpellChain:
        """From up and down spell lengths in ticks (the market model's, e.g. those Hedge.from_spells reads)."""
        return cls(np.stack([_ends(down, ages), _ends(up, ages)]))


def _ends(lengths, ages: int) -> np.ndarray:
    """Per age a < ages-1, #(L = a+1) / #(L > a); at the last age, one over the tail's mean residual length."""
    lengths = np.asarray(lengths, dtype=int)
    if len(lengths) == 0:
        return np.full(ages, 1 - FLOOR)  # never seen: gone at once
    age = np.arange(ages - 1)
    alive = (lengths[None, :] > age[:, None]).sum(axis=1)
    ending = (lengths[None, :] == age[:, None] + 1).sum(axis=1)
    out = np.r_[np.where(alive > 0, ending / np.maximum(alive, 1), 1.0), 1.0]
    tail = lengths[lengths > ages - 1] - (ages - 1)
    if len(tail):
        out[-1] = 1.0 / tail.mean()
    return np.clip(out, FLOOR, 1 - FLOOR)


@dataclass(frozen=True)
class CostToGo:
    """The least-cost move (IDLE, SPOT, OD) in every state: moves[ticks left - 1, work ticks, up, age, runs on]."""

    moves: np.ndarray  # int8
    cost: np.ndarray  # expected cost to go of the states with the most time left (the last one solved)
    od_speed: float = 1.0  # ticks of work (spot ticks) on-demand does a tick

    @classmethod
    def solve(
        cls,
        chain: SpellChain,
        ticks: int,
        spot_usd: float,
        od_usd: float,
        tick_h: float,
        restart_ticks: int,
        od_speed: float = 1.0,
        loss_ticks: float = 0.0,
        shrink: float = 0.0,
    ) -> CostToGo:
        """Moves for up to `ticks` ticks left. A tick costs its price for a whole tick; spot does a tick of work a
        tick, on-demand `od_speed` ticks of it; a start pays `restart_ticks` without progress, a preemption loses
        `loss_ticks` of work; a run on spot is lost within an up-spell with chance `shrink` a tick."""
        ends = chain.ends
        ages = ends.shape[1]
        work = np.arange(ticks + 1, dtype=float)
        older = np.minimum(np.arange(ages) + 1, ages - 1)
        cost = np.full((ticks + 1, 2, ages, 3), BIG)
        cost[0] = 0.0
        moves = np.empty((ticks, ticks + 1, 2, ages, 3), dtype=np.int8)
        for left in range(1, ticks + 1):
            nxt = cost.copy()
            nxt[:, 0, :, SPOT] = _at(cost[:, 0, :, IDLE], work + loss_ticks)  # preempted: idle, the loss to redo
            if shrink > 0:  # taken back while the pool stays up: idle, spot still there
                taken = _at(cost[:, 1, :, IDLE], work + loss_ticks)
                nxt[:, 1, :, SPOT] = (1 - shrink) * cost[:, 1, :, SPOT] + shrink * taken
            stay, turn = (1 - ends)[None, :, :, None], ends[None, :, :, None]
            expected = stay * nxt[:, :, older, :] + turn * nxt[:, ::-1, :1, :]  # (work, up, age, runs on)
            q = np.empty((3, ticks + 1, 2, ages, 3))
            q[IDLE] = expected[..., IDLE][..., None]
            for move, price, step in ((SPOT, spot_usd, 1.0), (OD, od_usd, od_speed)):
                go_on = _at(expected[..., move], work - step)
                start = _at(expected[..., move], work - step + restart_ticks * step)  # changeover ticks, not work
                q[move] = price * tick_h + np.stack([go_on if on == move else start for on in (IDLE, SPOT, OD)], -1)
            q[SPOT][:, 0] = BIG  # no spot while it is down
            best = (q + np.array([WAITING_USD, 0.0, 0.0])[:, None, None, None, None]).argmin(axis=0)
            cost = np.take_along_axis(q, best[None], 0)[0]
            best = np.where(cost >= BIG, OD, best)  # lost whatever is done: the soonest finish
            cost = np.minimum(cost, BIG)
            cost[0] = 0.0
            moves[left - 1] = best
        return cls(moves, cost, od_speed)

    def move(self, left, work, up, age, on) -> np.ndarray:
        """The move (IDLE, SPOT, OD) for ticks left, work ticks left (rounded up), spot up or not, the spell's age in
        ticks and what the job runs on (scalars or arrays). More time left than solved counts as the most solved
        (a shorter deadline: the safer move); more work than fits is lost (on-demand)."""
        ticks = self.moves.shape[0]
        left = np.clip(np.asarray(left), 1, ticks).astype(int)
        need = np.ceil(np.asarray(work, dtype=float) - 1e-9).astype(int)
        lost = need > ticks
        need = np.clip(need, 0, ticks)
        age = np.clip(np.asarray(age), 0, self.moves.shape[3] - 1).astype(int)
        moves = self.moves[left - 1, need, np.asarray(up, dtype=int), age, np.asarray(on)]
        return np.where(lost, OD, moves)


def _at(values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """values[w] along the first axis at fractional work `where` (linear between ticks): none left costs nothing,
    more than the table holds is a miss."""
    last = len(values) - 1
    lo = np.clip(np.floor(where).astype(int), 0, last)
    hi = np.clip(lo + 1, 0, last)
    frac = np.clip(where - np.floor(where), 0.0, 1.0)
    shape = (-1,) + (1,) * (values.ndim - 1)
    out = (1 - frac).reshape(shape) * values[lo] + frac.reshape(shape) * values[hi]
    out = np.where((where <= 0).reshape(shape), 0.0, out)
    return np.where((where > last).reshape(shape), BIG, out)
