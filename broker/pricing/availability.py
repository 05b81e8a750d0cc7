"""The market model learned from evidence: when spot can be had in a zone, and for how long.

The traces say spot capacity comes and goes in spells: up (an instance can be launched, and a
running one survives) and down (no capacity). Their lengths are heavy-tailed (in the shared AWS
p3.2xlarge traces the median up-spell is 0.3-1.4 h while the mean is 1.4-21 h), so a constant
Poisson hazard gets both the short flicker and the long calm wrong. Per (cloud, zone, instance
type) this module keeps the spells the traces show, at the tick the broker decides on, and samples
futures from them as an alternating renewal process: the first spell is a length-biased draw cut
at a uniform point (where "now" falls), then up and down spells alternate, each drawn from the
zone's own spells or, with weight k / (n + k) for a zone with n up-spells, from the spells of all
zones of its instance type (the shared prior: a zone with little evidence borrows from its siblings).
An instance type without any trace falls back to the hazard model: exponential up-spells of mean
1/lambda and down-spells that give its availability.

Pure functions on numpy arrays; fitting and sampling take no clock and do no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

PRIOR_STRENGTH = 20.0  # up-spells of evidence a zone needs before its own spells weigh as much as its siblings'
AGE_EDGES_H = (0.0, 1.0, 4.0, 12.0, math.inf)  # run-age bins of the hazard by age


def tick_minimum(data: np.ndarray, gap_s: float, tick_s: float) -> np.ndarray:
    """The least count during each `tick_s` tick (a tick has spot only when it lasted all of the tick);
    a tick finer than the trace repeats its values."""
    count = int(len(data) * gap_s // tick_s)
    if count == 0:
        return np.zeros(0, dtype=int)
    first = (np.arange(count) * tick_s // gap_s).astype(int)
    last = np.minimum(((np.arange(count) + 1) * tick_s - 1e-9) // gap_s, len(data) - 1).astype(int)
    return np.asarray([data[a : b + 1].min() for a, b in zip(first, last)], dtype=int)


def spells(available: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(up, down) spell lengths in ticks of a boolean series; the cut-off first and last spells are kept."""
    available = np.asarray(available, dtype=bool)
    if len(available) == 0:
        return np.zeros(0, dtype=int), np.zeros(0, dtype=int)
    bounds = np.r_[0, np.flatnonzero(np.diff(available.astype(int))) + 1, len(available)]
    lengths = np.diff(bounds)
    states = available[bounds[:-1]]
    return lengths[states], lengths[~states]


@dataclass
class ZoneModel:
    """Spot availability of one (cloud, zone, instance type) at `tick_h` resolution."""

    cloud: str
    zone: str
    instance_type: str
    tick_h: float
    up: np.ndarray  # own up-spells, ticks
    down: np.ndarray  # own down-spells, ticks
    prior_up: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))  # the siblings' spells
    prior_down: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    evidence: str = ""

    @property
    def weight(self) -> float:
        """The share of draws from the zone's own spells (the rest come from its siblings')."""
        if len(self.prior_up) == 0:
            return 1.0
        return len(self.up) / (len(self.up) + PRIOR_STRENGTH)

    def _mean(self, own: np.ndarray, prior: np.ndarray) -> float:
        w = self.weight
        own_mean = own.mean() if len(own) else 0.0
        prior_mean = prior.mean() if len(prior) else own_mean
        return float((w * own_mean + (1 - w) * prior_mean) * self.tick_h)

    @property
    def mean_up_h(self) -> float:
        return self._mean(self.up, self.prior_up)

    @property
    def mean_down_h(self) -> float:
        return self._mean(self.down, self.prior_down)

    @property
    def p_launch(self) -> float:
        """P(spot can be launched at a random moment): the long-run share of time up."""
        up, down = self.mean_up_h, self.mean_down_h
        return up / (up + down) if up + down > 0 else 0.0

    def hazard_by_age(self) -> list[tuple[float, float, float]]:
        """(from h, to h, preemptions per hour) for runs of each age: up-spells ending in the bin over the hours
        runs spent in it. Falling with age on every shared trace: a run that survived an hour tends to last."""
        lengths = self._pool(self.up, self.prior_up) * self.tick_h
        out = []
        for lo, hi in zip(AGE_EDGES_H[:-1], AGE_EDGES_H[1:]):
            exposure = np.clip(lengths - lo, 0, hi - lo).sum()
            ends = ((lengths > lo) & (lengths <= hi)).sum()
            out.append((lo, hi, float(ends / exposure) if exposure > 0 else float("nan")))
        return out

    def _pool(self, own: np.ndarray, prior: np.ndarray) -> np.ndarray:
        """Own and sibling spells, the siblings' repeated or thinned to their weight (for summaries)."""
        if len(prior) == 0 or self.weight >= 1:
            return own
        share = int(round(len(own) * (1 - self.weight) / max(self.weight, 1e-9))) if len(own) else len(prior)
        return np.r_[own, np.resize(prior, share)]

    def sample(self, rng: np.random.Generator, n: int, ticks: int, up_now: bool | None = None) -> np.ndarray:
        """`n` futures of `ticks` ticks from now: True where spot can be had (bool array n x ticks). When the
        state now is known (`up_now`: the broker has an agent there or none), every future starts in it."""
        up_mean, down_mean = self.mean_up_h / self.tick_h, self.mean_down_h / self.tick_h
        if up_mean <= 0:
            return np.zeros((n, ticks), dtype=bool)
        per_path = int(2 * ticks / (up_mean + down_mean)) + 8
        start_up = rng.random(n) < up_mean / (up_mean + down_mean) if up_now is None else np.full(n, bool(up_now))
        up = self._draw(rng, self.up, self.prior_up, (n, per_path))
        down = self._draw(rng, self.down, self.prior_down, (n, per_path))
        first = np.where(
            start_up, self._residual(rng, self.up, self.prior_up, n), self._residual(rng, self.down, self.prior_down, n)
        )
        # spells alternate from the first one's state: [first, other, same, other, ...]
        lengths = np.empty((n, 2 * per_path + 1), dtype=float)
        lengths[:, 0] = first
        lengths[:, 1::2] = np.where(start_up[:, None], down, up)
        lengths[:, 2::2] = np.where(start_up[:, None], up, down)
        ends = np.cumsum(lengths, axis=1)
        index = np.empty((n, ticks), dtype=int)
        moments = np.arange(ticks) + 0.5
        for i in range(n):
            index[i] = np.searchsorted(ends[i], moments, side="right")
        return (index % 2 == 0) == start_up[:, None]

    def _draw(self, rng, own: np.ndarray, prior: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
        if len(own) == 0 and len(prior) == 0:
            return rng.exponential(1.0, shape)  # no spells of this state seen: short ones
        if len(prior) == 0 or len(own) == 0:
            pool = own if len(own) else prior
            return rng.choice(pool, shape).astype(float)
        mine = rng.random(shape) < self.weight
        return np.where(mine, rng.choice(own, shape), rng.choice(prior, shape)).astype(float)

    def _residual(self, rng, own: np.ndarray, prior: np.ndarray, n: int) -> np.ndarray:
        """What is left of the spell now falls in: a length-biased draw, cut at a uniform point."""
        pool = self._pool(own, prior).astype(float)
        if len(pool) == 0:
            return rng.exponential(1.0, n)
        picked = rng.choice(pool, n, p=pool / pool.sum())
        return np.maximum(rng.random(n) * picked, 1e-6)


def exponential_zone(
    cloud: str, zone: str, instance_type: str, tick_h: float, hazard_per_h: float, availability: float, source: str
) -> ZoneModel:
    """A zone without traces: exponential up-spells of mean 1/hazard and down-spells giving `availability`."""
    rng = np.random.default_rng(0)
    mean_up = 1 / hazard_per_h / tick_h if hazard_per_h > 0 else 1e6
    mean_down = mean_up * (1 - availability) / availability  # a preemption ends the tick's capacity at least
    up = np.maximum(1, np.round(rng.exponential(mean_up, 400))).astype(int)
    down = np.maximum(1, np.round(rng.exponential(mean_down, 400))).astype(int)
    return ZoneModel(cloud, zone, instance_type, tick_h, up, down, evidence=f"no trace; {source}")


@dataclass
class MarketModel:
    """Zone models by (cloud, zone, instance type); `fit` learns them from traces."""

    tick_h: float
    zones: dict[tuple[str, str, str], ZoneModel]
    pooled: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # per type

    @classmethod
    def fit(cls, traces: list, tick_s: float = 600.0) -> MarketModel:
        """Spells of every trace (pricing.traces.Trace) at `tick_s`, with each instance type's pooled prior."""
        tick_h = tick_s / 3600
        own: dict[tuple[str, str, str], list[tuple[np.ndarray, np.ndarray, float]]] = {}
        for trace in traces:
            up, down = spells(tick_minimum(trace.data, trace.gap_s, tick_s) > 0)
            own.setdefault((trace.cloud, trace.zone, trace.instance_type), []).append((up, down, trace.hours))
        pooled: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
        for (cloud, _zone, kind), parts in own.items():
            up, down = pooled.get((cloud, kind), (np.zeros(0, int), np.zeros(0, int)))
            pooled[(cloud, kind)] = (np.r_[up, *[p[0] for p in parts]], np.r_[down, *[p[1] for p in parts]])
        zones = {}
        for (cloud, zone, kind), parts in own.items():
            up, down = np.r_[[], *[p[0] for p in parts]].astype(int), np.r_[[], *[p[1] for p in parts]].astype(int)
            siblings = [k for k in own if k[0] == cloud and k[2] == kind and k[1] != zone]
            prior_up = np.r_[[], *[p[0] for k in siblings for p in own[k]]].astype(int)
            prior_down = np.r_[[], *[p[1] for k in siblings for p in own[k]]].astype(int)
            hours = sum(p[2] for p in parts)
            zones[(cloud, zone, kind)] = ZoneModel(
                cloud,
                zone,
                kind,
                tick_h,
                up,
                down,
                prior_up,
                prior_down,
                f"{len(parts)} trace(s), {hours:.0f} h, {len(up)} up-spells; {len(siblings)} sibling zone(s) as prior",
            )
        return cls(tick_h, zones, pooled)

    def for_offer(self, offer) -> ZoneModel:
        """The offer's zone model: its own, else its instance type's siblings (the prior alone), else an
        exponential one from the offer's hazard and availability (set by the catalog's hazard model)."""
        zone = offer.zone or offer.region
        found = self.zones.get((offer.cloud, zone, offer.instance_type))
        if found is not None:
            return found
        pooled = self.pooled.get((offer.cloud, offer.instance_type))
        if pooled is not None and len(pooled[0]):
            return ZoneModel(
                offer.cloud,
                zone,
                offer.instance_type,
                self.tick_h,
                np.zeros(0, int),
                np.zeros(0, int),
                pooled[0],
                pooled[1],
                f"no trace of this zone; {len(pooled[0])} up-spells of its instance type's traced zones",
            )
        return exponential_zone(
            offer.cloud,
            zone,
            offer.instance_type,
            self.tick_h,
            offer.hazard_per_h,
            offer.availability,
            f"hazard {offer.hazard_per_h:.3f}/h ({offer.hazard_source})",
        )
