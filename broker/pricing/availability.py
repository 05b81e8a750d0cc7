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
A zone without traces (every live offer named by an AWS zone id, or by its region alone) draws from the
traced zones of its region, where there are any, else of its type: zones of one region go together (a
traced zone held out is told its share of time up within 0.11 on average by its region's other zones, 0.18 by
its type's anywhere: bench/sibling_prior.py). An instance type without any trace falls back to the hazard
model: exponential up-spells of mean 1/lambda and down-spells that give its availability.

Pure functions on numpy arrays; fitting and sampling take no clock and do no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from broker.domain.offer import exponential_down_h

PRIOR_STRENGTH = 20.0  # up-spells of evidence a zone needs before its own spells weigh as much as its siblings'
AGE_EDGES_H = (0.0, 1.0, 4.0, 12.0, math.inf)  # run-age bins of the hazard by age
RECENT_STRENGTH = 4.0  # spells our fleet saw in a zone before they weigh as much as all its traces
MIN_SHARE_UP = 1e-3  # a zone never seen up: launch odds the money model can divide by (its cost comes out huge)


def tick_minimum(data: np.ndarray, gap_s: float, tick_s: float) -> np.ndarray:
    """The least count during each `tick_s` tick (a tick has spot only when it lasted all of the tick);
    a tick finer than the trace repeats its values."""
    count = int(len(data) * gap_s // tick_s)
    if count == 0:
        return np.zeros(0, dtype=int)
    first = (np.arange(count) * tick_s // gap_s).astype(int)
    last = np.minimum(((np.arange(count) + 1) * tick_s - 1e-9) // gap_s, len(data) - 1).astype(int)
    return np.asarray([data[a : b + 1].min() for a, b in zip(first, last)], dtype=int)


def shrink_per_tick(counts: np.ndarray) -> float | None:
    """The share of a pool lost per tick while it stays up: the chance a running instance goes when the pool shrinks
    without emptying (every instance busy, the victims at random). None where no pool was seen (at most 1)."""
    counts = np.asarray(counts, dtype=float)
    if len(counts) < 2 or counts.max() <= 1:
        return None
    before, after = counts[:-1], counts[1:]
    stays = (before > 0) & (after > 0)
    return float((np.clip(before - after, 0, None) / np.maximum(before, 1))[stays].mean()) if stays.any() else 0.0


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
    """Spot availability of one (cloud, zone, instance type) at `tick_h` resolution, from three sources of spells:
    what the broker's own fleet saw there lately (`recent_*`), the zone's traces, and its siblings' traces."""

    cloud: str
    zone: str
    instance_type: str
    tick_h: float
    up: np.ndarray  # own up-spells, ticks
    down: np.ndarray  # own down-spells, ticks
    prior_up: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))  # the siblings' spells
    prior_down: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    evidence: str = ""
    recent_up: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))  # seen by our fleet lately
    recent_down: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    shrink: float = 0.0  # per tick up, the chance a running instance goes as its pool shrinks (as our fleet saw)
    # the spell our fleet saw the zone in last: (up, ticks it had lasted); None where the fleet did not see the zone
    current: tuple[bool, int] | None = None

    @property
    def weight(self) -> float:
        """The share of the traces' draws from the zone's own spells (the rest come from its siblings')."""
        if len(self.prior_up) == 0:
            return 1.0
        return len(self.up) / (len(self.up) + PRIOR_STRENGTH)

    @property
    def recent_weight(self) -> float:
        """The share of draws from what our fleet saw lately (the market drifts: a few spells outweigh old traces)."""
        if len(self.up) + len(self.prior_up) == 0:
            return 1.0
        seen = len(self.recent_up) + len(self.recent_down)
        return seen / (seen + RECENT_STRENGTH)

    def _mixture(self, up: bool) -> tuple[np.ndarray, np.ndarray]:
        """Every known spell length of one state and its probability: each source's share spread over its spells."""
        sources = (self.recent_up, self.up, self.prior_up) if up else (self.recent_down, self.down, self.prior_down)
        recent, w = self.recent_weight, self.weight
        shares = np.array([recent, (1 - recent) * w, (1 - recent) * (1 - w)])
        shares = np.where([len(x) > 0 for x in sources], shares, 0.0)
        if shares.sum() <= 0:
            return np.zeros(0), np.zeros(0)
        values = np.concatenate([np.asarray(x, dtype=float) for x in sources])
        probs = np.concatenate([np.full(len(x), share / max(len(x), 1)) for x, share in zip(sources, shares)])
        return values, probs / probs.sum()

    def _mean(self, up: bool) -> float:
        values, probs = self._mixture(up)
        return float(values @ probs * self.tick_h) if len(values) else 0.0

    @property
    def mean_up_h(self) -> float:
        return self._mean(True)

    @property
    def mean_down_h(self) -> float:
        return self._mean(False)

    @property
    def p_launch(self) -> float:
        """P(spot can be launched at a random moment): the long-run share of time up."""
        up, down = self.mean_up_h, self.mean_down_h
        return up / (up + down) if up + down > 0 else 0.0

    def hazard_by_age(self) -> list[tuple[float, float, float]]:
        """(from h, to h, preemptions per hour) for runs of each age: up-spells ending in the bin over the hours
        runs spent in it. Falling with age on every shared trace: a run that survived an hour tends to last."""
        values, probs = self._mixture(True)
        lengths = values * self.tick_h
        out = []
        for lo, hi in zip(AGE_EDGES_H[:-1], AGE_EDGES_H[1:]):
            exposure = probs @ np.clip(lengths - lo, 0, hi - lo)
            ends = probs @ ((lengths > lo) & (lengths <= hi))
            out.append((lo, hi, float(ends / exposure) if exposure > 0 else float("nan")))
        return out

    def with_seen(self, counts: np.ndarray) -> ZoneModel:
        """This zone with what our fleet saw there lately (its spot agents per tick, oldest first): its spells as the
        recent ones, read as the traces are (the cut-off first and last spells kept as they were seen), and how its
        pool shrank without emptying (`shrink`). Only our own agents show a pool as it is: a trace of one node
        says whether spot could be had, not how many."""
        counts = np.asarray(counts, dtype=float)
        up, down = spells(counts > 0)
        shrink = shrink_per_tick(counts)
        now_up = bool(counts[-1] > 0) if len(counts) else False
        last = (now_up, int((up if now_up else down)[-1])) if len(counts) else None  # the spell it is in
        seen = replace(
            self, recent_up=up, recent_down=down, shrink=self.shrink if shrink is None else shrink, current=last
        )
        hours = len(counts) * self.tick_h
        note = f"; {len(up) + len(down)} spells our fleet saw in {hours:.0f} h (weight {seen.recent_weight:.2f})"
        if last is not None:
            note += f", {'up' if last[0] else 'down'} the last {last[1] * self.tick_h:.1f} h"
        if shrink:
            note += f", its pool shrinking by {shrink / self.tick_h:.0%} an hour while up"
        return replace(seen, evidence=self.evidence + note)

    def sample(
        self,
        rng: np.random.Generator,
        n: int,
        ticks: int,
        up_now: bool | None = None,
        aged: bool = False,
    ) -> np.ndarray:
        """`n` futures of `ticks` ticks from now: True where spot can be had (bool array n x ticks). When the
        state now is known (`up_now`: the broker has an agent there or none), every future starts in it. With
        `aged`, where our fleet saw the zone, the first spell goes on from the one it saw last, as long as that had
        lasted (`current`; heavy tails: a zone down for a day tends to stay down), or, where the state now differs
        from it, starts now. A pool that shrinks while up (`shrink`) is up here: core/forecast
        takes a run's instance back apart (a pool shrunk is still there to start again in)."""
        up_mean, down_mean = self.mean_up_h / self.tick_h, self.mean_down_h / self.tick_h
        if up_mean <= 0:
            return np.zeros((n, ticks), dtype=bool)
        per_path = int(2 * ticks / (up_mean + down_mean)) + 8
        seen = self.current if aged else None
        if up_now is None and seen is not None:
            up_now = seen[0]
        start_up = rng.random(n) < up_mean / (up_mean + down_mean) if up_now is None else np.full(n, bool(up_now))
        up = self._draw(rng, True, (n, per_path))
        down = self._draw(rng, False, (n, per_path))
        if seen is not None:  # the spell now is known: lasted seen[1] ticks, or (another state now) just began
            age = seen[1] if seen[0] == up_now else 0
            first = self._rest_of(rng, bool(up_now), age, n)
        else:
            first = np.where(start_up, self._residual(rng, True, n), self._residual(rng, False, n))
        # spells alternate from the first one's state: [first, other, same, other, ...]
        lengths = np.empty((n, 2 * per_path + 1), dtype=float)
        lengths[:, 0] = first
        lengths[:, 1::2] = np.where(start_up[:, None], down, up)
        lengths[:, 2::2] = np.where(start_up[:, None], up, down)
        index = spell_at_ticks(np.cumsum(lengths, axis=1), ticks)
        return (index % 2 == 0) == start_up[:, None]

    def _draw(self, rng, up: bool, shape: tuple[int, int]) -> np.ndarray:
        values, probs = self._mixture(up)
        if len(values) == 0:
            return rng.exponential(1.0, shape)  # no spells of this state seen: short ones
        return rng.choice(values, shape, p=probs)

    def _residual(self, rng, up: bool, n: int) -> np.ndarray:
        """What is left of the spell now falls in: a length-biased draw, cut at a uniform point."""
        values, probs = self._mixture(up)
        if len(values) == 0 or values @ probs <= 0:
            return rng.exponential(1.0, n)
        biased = probs * values
        picked = rng.choice(values, n, p=biased / biased.sum())
        return np.maximum(rng.random(n) * picked, 1e-6)

    def _rest_of(self, rng, up: bool, age: int, n: int) -> np.ndarray:
        """What is left of a spell that has lasted `age` ticks: a spell length drawn among those longer than that,
        less the age (0: a spell just begun, drawn whole). A spell longer than any known lasts about as long again
        as it has (exponential with its age as the mean)."""
        values, probs = self._mixture(up)
        longer = values > age
        if not longer.any() or probs[longer].sum() <= 0:
            return np.maximum(rng.exponential(max(age, 1), n), 1e-6)
        picked = rng.choice(values[longer], n, p=probs[longer] / probs[longer].sum())
        return picked - age


def spell_at_ticks(ends: np.ndarray, ticks: int) -> np.ndarray:
    """For rows of spell ends (each row increasing), the spell each tick's middle t + 0.5 falls in: how many of the
    row's spells ended by then (a searchsorted per row, done for all rows at once: per row it took a tenth of a
    backtest). A spell ending at e has ended by every tick t >= ceil(e - 0.5)."""
    rows = ends.shape[0]
    behind = np.clip(np.ceil(ends - 0.5), 0, ticks).astype(np.int64) + (np.arange(rows) * (ticks + 1))[:, None]
    counts = np.bincount(behind.ravel(), minlength=rows * (ticks + 1)).reshape(rows, ticks + 1)
    return counts.cumsum(axis=1)[:, :ticks]


def exponential_zone(
    cloud: str, zone: str, instance_type: str, tick_h: float, hazard_per_h: float, availability: float, source: str
) -> ZoneModel:
    """A zone without traces: exponential up-spells of mean 1/hazard and down-spells giving `availability`, as
    the distribution's evenly spaced quantiles (400 random draws put the mean up-spell 13% off the hazard's)."""
    mean_up = 1 / hazard_per_h / tick_h if hazard_per_h > 0 else 1e6
    mean_down = exponential_down_h(availability, 1 / (mean_up * tick_h)) / tick_h  # as the money model prices it
    quantiles = -np.log1p(-(np.arange(400) + 0.5) / 400)  # of the exponential with mean 1
    up = np.maximum(1, np.round(mean_up * quantiles)).astype(int)
    down = np.maximum(1, np.round(mean_down * quantiles)).astype(int)
    return ZoneModel(cloud, zone, instance_type, tick_h, up, down, evidence=f"no trace; {source}")


@dataclass
class MarketModel:
    """Zone models by (cloud, zone, instance type); `fit` learns them from traces."""

    tick_h: float
    zones: dict[tuple[str, str, str], ZoneModel]
    pooled: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # per type
    regional: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # per region
    _spells: dict = field(default_factory=dict, repr=False, compare=False)  # spot_spells', per zone

    @classmethod
    def fit(cls, traces: list, tick_s: float = 600.0) -> MarketModel:
        """Spells of every trace (pricing.traces.Trace) at `tick_s`, with each instance type's pooled prior."""
        tick_h = tick_s / 3600
        own: dict[tuple[str, str, str], list[tuple[np.ndarray, np.ndarray, float]]] = {}
        region: dict[tuple[str, str, str], str] = {}
        for trace in (t for t in traces if not t.pool):  # a pool refilled to its size never shows a gap
            up, down = spells(tick_minimum(trace.data, trace.gap_s, tick_s) > 0)
            own.setdefault((trace.cloud, trace.zone, trace.instance_type), []).append((up, down, trace.hours))
            region[(trace.cloud, trace.zone, trace.instance_type)] = trace.region
        pooled: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
        regional: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]] = {}
        for key, parts in own.items():
            cloud, _zone, kind = key
            for groups, group in ((pooled, (cloud, kind)), (regional, (cloud, region[key], kind))):
                up, down = groups.get(group, (np.zeros(0, int), np.zeros(0, int)))
                groups[group] = (np.r_[up, *[p[0] for p in parts]], np.r_[down, *[p[1] for p in parts]])
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
        return cls(tick_h, zones, pooled, regional)

    def for_offer(self, offer) -> ZoneModel:
        """The offer's zone model: its own, else its instance type's siblings in its region or, where none is
        traced, anywhere (the prior alone), else an exponential one from the offer's hazard and availability (set by
        the catalog's hazard model)."""
        found = self._measured(offer)
        if found is not None:
            return found
        return exponential_zone(
            offer.cloud,
            offer.zone or offer.region,
            offer.instance_type,
            self.tick_h,
            offer.hazard_per_h,
            offer.availability,
            f"hazard {offer.hazard_per_h:.3f}/h ({offer.hazard_source}), "
            f"spot there {offer.availability:.0%} of the time",
        )

    def spot_spells(self, offer) -> tuple[float, float, float] | None:
        """The offer's zone's long-run share of time up and the mean hours of a spell up and of one down, where
        traces or our fleet measured it or its siblings (None where the model knows only the offer's own hazard and
        availability): the money model's odds, preemptions and waits (risk.expectation), so a quote's choice and its
        futures read one market. Kept per zone for this model's life (a model tick)."""
        key = (offer.cloud, offer.zone or offer.region, offer.instance_type, offer.region)
        if key not in self._spells:
            known = self._measured(offer)
            self._spells[key] = (
                None if known is None else (max(known.p_launch, MIN_SHARE_UP), known.mean_up_h, known.mean_down_h)
            )
        return self._spells[key]

    def _measured(self, offer) -> ZoneModel | None:
        """The offer's zone as traces (its own, else its siblings') and our fleet measured it; None where none did."""
        zone = offer.zone or offer.region
        return self.zones.get((offer.cloud, zone, offer.instance_type)) or self._siblings(
            offer.cloud, zone, offer.instance_type, offer.region
        )

    def with_recent(
        self, seen: dict[tuple[str, str, str], np.ndarray], regions: dict[tuple[str, str, str], str] | None = None
    ) -> MarketModel:
        """This model with what the broker's own fleet saw lately per (cloud, zone, instance type): its spot agents
        per tick, oldest first (none: spot could not be had). A zone without traces gets a model of its own from it,
        its prior the siblings `for_offer` gives it (`regions`: each such zone's region, as its offers name it)."""
        zones, regions = dict(self.zones), regions or {}
        for key, series in seen.items():
            if len(series) == 0:
                continue
            empty = np.zeros(0, dtype=int)
            base = (
                zones.get(key)
                or self._siblings(*key, regions.get(key))
                or ZoneModel(*key, self.tick_h, empty, empty, evidence="")
            )
            zones[key] = base.with_seen(series)
        return MarketModel(self.tick_h, zones, self.pooled, self.regional)

    def _siblings(self, cloud: str, zone: str, kind: str, region: str | None) -> ZoneModel | None:
        """A zone without traces of its own: its instance type's traced zones in its region as its prior, else
        those anywhere, if there are any."""
        pooled, where = self.regional.get((cloud, region, kind)), f" in {region}"
        if pooled is None or not len(pooled[0]):
            pooled, where = self.pooled.get((cloud, kind)), ""
        if pooled is None or not len(pooled[0]):
            return None
        return ZoneModel(
            cloud,
            zone,
            kind,
            self.tick_h,
            np.zeros(0, int),
            np.zeros(0, int),
            pooled[0],
            pooled[1],
            f"no trace of this zone; {len(pooled[0])} up-spells of its instance type's traced zones{where}",
        )


def seen_counts(points: list[tuple[float, float]], since: float, until: float, tick_s: float) -> np.ndarray:
    """Ticks from `since` (or the first point, if later) to `until` of a count recorded where it changed (epoch
    seconds, count), as the traces are read: the least count during each tick (spot only where it lasted all of it)."""
    if not points:
        return np.zeros(0)
    epochs = np.asarray([p[0] for p in points], dtype=float)
    counts = np.asarray([p[1] for p in points], dtype=float)
    start = max(since, epochs[0])
    ticks = int((until - start) // tick_s)
    if ticks <= 0:
        return np.zeros(0)
    begins = start + np.arange(ticks) * tick_s
    least = counts[np.searchsorted(epochs, begins, side="right") - 1]  # the count each tick starts with
    inside = ((epochs - start) // tick_s).astype(int)  # and any it changed to during one
    keep = (epochs >= start) & (inside < ticks)
    np.minimum.at(least, inside[keep], counts[keep])
    return least
