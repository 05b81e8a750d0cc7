"""Hedge: what the hedge rule knows of the market, for the quote's futures (models/futures.py) and the server's rule
(planning/hedge.py) alike: the spells of the job's zones, how long a wait a gap is worth, and the cost-to-go moves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from broker.models.cost_to_go import CostToGo, SpellChain


@dataclass(frozen=True)
class Hedge:
    """What the hedge rule knows of the market, from the model's spells (no-capacity spells of every zone
    the job may use, together): idle_h[a] = E[min(D, a ticks)] hours, the idle time a job spends in one
    no-capacity spell D when it waits at most `a` ticks before paying on-demand; and the mean up-spell.

    With slack S (time left beyond on-demand work and the safety net's 2d), about N more no-capacity
    spells before the work is done (spot work left / mean up-spell) and P more preemptions in its zone
    (spot work left / that zone's mean up-spell), the job can afford to wait a* = the longest wait with
    N idle_h[a*] + P d <= S in each spell; past a* the spell is a long one
    (spells are heavy-tailed: the longer one has lasted, the longer it goes on) and on-demand is cheaper
    than the slack it would burn. On-demand is left for spot when spot returns, if a mean up-spell on spot
    saves more than the two changeovers cost. A run on spot moves to a cheaper zone that has capacity when
    the saving over that zone's mean up-spell (`zone_up_h`, one per zone) beats the changeover (SpotHedge's
    idea: the cheap zones come and go, follow them)."""

    idle_h: np.ndarray
    mean_up_h: float
    zone_up_h: tuple[float, ...] = ()
    tick_h: float = 1.0  # idle_h's index unit
    zones: tuple[str, ...] = ()  # the offer ids zone_up_h is given for, when known
    chain: SpellChain | None = None  # the same spells as a chain (cost_to_go), for `planned`
    plan: CostToGo | None = None  # the cost-to-go moves the rule `cost-to-go` plays (`planned`)
    shrink: float = 0.0  # per tick up, the chance a run in the cheapest zone is taken back (ZoneModel.shrink)

    def up_h(self, zone: str) -> float:
        """The mean up-spell of this zone (offer id), or of the market as a whole when it is not known."""
        return self.zone_up_h[self.zones.index(zone)] if zone in self.zones else self.mean_up_h

    def longest_wait(self, slack_h, spot_left_h, changeover_h: float, zone_up_h):
        """a*, in ticks (-1: no wait is affordable): the longest wait per no-capacity spell that the slack pays
        for every spell and preemption still to come (scalars or arrays over futures)."""
        spells_left = np.maximum(1.0, spot_left_h / max(self.mean_up_h - changeover_h, 1e-6))
        preemptions = np.maximum(1.0, spot_left_h / np.maximum(zone_up_h - changeover_h, 1e-6))
        per_spell = (slack_h - preemptions * changeover_h) / spells_left
        return np.searchsorted(self.idle_h, per_spell, side="right") - 1

    def zone_move_worth(self, price_now, price_there, up_there_h, spot_left_h, slack_h, changeover_h: float):
        """Whether a run on spot moves to a cheaper zone: it is cheaper by more, over that zone's mean up-spell (at
        most the work left), than the changeover there costs, and the slack pays this changeover and still one
        for each preemption to come there (scalars or arrays over futures)."""
        gain = (price_now - price_there) * np.minimum(up_there_h, spot_left_h)
        restarts = np.maximum(1.0, spot_left_h / np.maximum(up_there_h - changeover_h, 1e-6)) * changeover_h
        return (gain > changeover_h * price_there) & (slack_h >= restarts + changeover_h)

    def spot_worth(self, od_price: float, spot_price, changeover_h: float):
        """Whether a mean up-spell on spot saves more than the two changeovers (there and back) cost."""
        return self.mean_up_h * (od_price - spot_price) > changeover_h * (od_price + spot_price)

    @classmethod
    def from_spells(
        cls,
        up: np.ndarray,
        down: np.ndarray,
        tick_h: float,
        max_ticks: int,
        zone_up_h: tuple[float, ...] = (),
        zones: tuple[str, ...] = (),
    ) -> Hedge:
        """From up and down spell lengths in ticks (e.g. pricing.availability.ZoneModel's, or those of
        several zones' sampled futures together)."""
        down = np.asarray(down, dtype=float)
        idle = mean_capped(down, max_ticks)
        mean_up = float(np.mean(up)) * tick_h if len(up) else 0.0
        chain = SpellChain.from_spells(np.asarray(up, dtype=int), down.astype(int))
        return cls(idle * tick_h, mean_up, tuple(zone_up_h), tick_h, tuple(zones), chain)

    def planned(
        self,
        ticks: int,
        spot_usd: float,
        od_usd: float,
        changeover_h: float,
        od_speed: float = 1.0,
        loss_h: float = 0.0,
    ) -> Hedge:
        """This view with the cost-to-go moves for up to `ticks` ticks left (models/cost_to_go.py); a preemption
        (a spell's end, or the pool's shrink within one) loses `loss_h` hours of spot work; a start pays
        `changeover_h` (as the rule counts it)."""
        restart = math.ceil(changeover_h / self.tick_h - 1e-9)  # a part tick is a tick
        loss = loss_h / self.tick_h
        plan = CostToGo.solve(self.chain, ticks, spot_usd, od_usd, self.tick_h, restart, od_speed, loss, self.shrink)
        return replace(self, plan=plan)


def mean_capped(spells: np.ndarray, max_ticks: int) -> np.ndarray:
    """E[min(D, a)] over the spells D, for each wait a = 0..max_ticks: the spells sorted once, and for each a those
    up to it summed and the rest counted a each (a (max_ticks x spells) minimum took 36 ms a view, nine views a
    quote). Spells of whole ticks sum exactly, so the figures are the same to the bit."""
    if not len(spells):
        return np.zeros(max_ticks + 1)
    ordered = np.sort(spells)
    upto = np.concatenate(([0.0], np.cumsum(ordered)))
    waits = np.arange(max_ticks + 1)
    shorter = np.searchsorted(ordered, waits, side="right")  # spells that end within the wait
    return (upto[shorter] + waits * (len(ordered) - shorter)) / len(ordered)
