"""What the hedge rule knows of the market: the market model's spells, for the zones a job may use.

The rule itself is models/futures.Hedge (the quote's futures play it) and planning/hedge.py (the server
runs it); both need the same view of the market: the no-capacity spells of all the job's zones together
(sampled from the model, so a zone with little evidence borrows from its siblings) and each zone's mean
up-spell. Computing it samples futures, so it is kept per set of zones.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from broker.domain.model import JobSpec, Tier
from broker.domain.offer import Offer
from broker.models.fit import fit_key, fits
from broker.models.futures import Hedge
from broker.pricing.availability import MarketModel, spells

HORIZON_H = 400.0  # hours of sampled futures: long enough for the heavy tail of the spells
PATHS = 64
MAX_ZONES = 12  # offers a job may launch in (the quote's forecast plays the same ones)
PLANS_KEPT = 64  # cost-to-go tables kept (tens of MB at most)
PLAN_TICKS = 72  # cost-to-go tables are solved for a multiple of this many ticks left (12 h at 10-minute ticks)


def hedge_for(model: MarketModel, offers: list[Offer], tick_h: float, seed: int = 0) -> Hedge:
    """The hedge rule's view of these zones together: spells of `any zone up` on futures sampled from the model."""
    rng = np.random.default_rng(seed)
    horizon = int(HORIZON_H / tick_h)
    sampled = np.stack([model.for_offer(o).sample(rng, PATHS, horizon) for o in offers]).any(axis=0)
    found = [spells(path) for path in sampled]
    up = np.concatenate([f[0][1:-1] for f in found])  # the cut-off first and last spells are not whole
    down = np.concatenate([f[1][1:-1] for f in found])
    # where no spell of a kind was seen whole, the cut-off ones are all there is: they last at least that long. Spot
    # up in every future all horizon long (a dozen zones modelled from a hazard: one of them is always up) had no
    # up-spell, read as spot gone at once, and cost-to-go ran every job on on-demand
    up = up if len(up) else np.concatenate([f[0] for f in found])
    down = down if len(down) else np.concatenate([f[1] for f in found])
    zone_up_h = tuple(model.for_offer(o).mean_up_h for o in offers)
    view = Hedge.from_spells(up, down, tick_h, horizon, zone_up_h, tuple(o.id for o in offers))
    return replace(view, shrink=model.for_offer(offers[0]).shrink) if offers else view  # it launches there first


class MarketHedge:
    """`hedge(spec)`: the Hedge for the spot offers a job fits (the cheapest MAX_ZONES of `offers()`), on the
    market model `model()` (both callables: the live catalog's prices change, the model is learned when first
    needed); None when no spot offer fits it."""

    def __init__(self, model: Callable[[], MarketModel], offers: Callable[[], list[Offer]]):
        self.model, self.offers = model, offers
        self._zones: dict[str, tuple[Offer, ...]] = {}  # by what `fits` reads of a spec: planning asks per job
        self._priced: list[Offer] | None = None  # the offers those were chosen from (a server's are read anew)
        self._known: dict[tuple[str, ...], Hedge] = {}
        self._plans: dict[tuple, Hedge] = {}  # with cost-to-go moves, per chain, zones, horizon, prices, changeover
        self._of: MarketModel | None = None  # the model those were computed on (it is learned again as it goes)

    def __call__(self, spec: JobSpec) -> Hedge | None:
        spot = self.zones_of(spec)
        return self.for_zones(list(spot)) if spot else None

    def zones_of(self, spec: JobSpec) -> tuple[Offer, ...]:
        """The cheapest MAX_ZONES spot offers the job fits, cheapest first."""
        shape, offers = fit_key(spec), self.offers()
        if offers is not self._priced:  # new prices: the cheapest zones may be others
            self._zones, self._priced = {}, offers
        if shape not in self._zones:
            fitting = (o for o in offers if o.tier == Tier.spot and fits(spec, o))
            self._zones[shape] = tuple(sorted(fitting, key=lambda o: o.price_usd_per_h)[:MAX_ZONES])
        return self._zones[shape]

    def for_zones(self, offers: list[Offer]) -> Hedge:
        """The Hedge of exactly these zones, in this order (the futures index its zones so)."""
        key, model = tuple(o.id for o in offers), self.model()
        if model is not self._of:
            self._known, self._of = {}, model
        if key not in self._known:
            self._known[key] = hedge_for(model, offers, model.tick_h)
        return self._known[key]

    def planned(
        self,
        offers: list[Offer],
        ticks: int,
        od_usd: float,
        changeover_h: float,
        od_speed: float = 1.0,
        loss_h: float = 0.0,
    ) -> Hedge:
        """The Hedge of these zones with the cost-to-go moves (priced at the cheapest zone) for at least `ticks`
        ticks left, a preemption losing `loss_h` hours of work: tables are solved for whole multiples of PLAN_TICKS
        and the loss in whole ticks, so jobs of similar windows and checkpoints share one."""
        view = self.for_zones(offers)
        # the fleet's shrink moves a little every tick: a table is solved again only when it moves by 0.01 a tick
        view = replace(view, shrink=round(view.shrink, 2))
        ticks = PLAN_TICKS * max(1, math.ceil(ticks / PLAN_TICKS))
        spot_usd = min(o.price_usd_per_h for o in offers)
        loss_h = round(loss_h / view.tick_h) * view.tick_h
        # the model is learned again every tick; a table is solved again only when its chain moved by a point or more
        chain = np.round(view.chain.ends, 2).tobytes()
        prices = (round(spot_usd, 4), round(od_usd, 4))
        key = (chain, view.zones, ticks, prices, round(changeover_h, 3), round(od_speed, 3), round(loss_h, 3))
        key += (view.shrink,)
        if key not in self._plans:
            if len(self._plans) >= PLANS_KEPT:
                del self._plans[next(iter(self._plans))]  # the oldest
            self._plans[key] = view.planned(ticks, spot_usd, od_usd, changeover_h, od_speed, loss_h)
        return replace(self._plans[key], idle_h=view.idle_h, mean_up_h=view.mean_up_h, zone_up_h=view.zone_up_h)
