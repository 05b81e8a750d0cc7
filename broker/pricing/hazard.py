"""Preemption hazard per spot offer (preemptions per hour) with an uncertainty band, from evidence.

Per (cloud, region, instance type) the hazard is a Gamma posterior over a Poisson rate:
    shape = prior_mean x PRIOR_HOURS + preemptions,  rate = PRIOR_HOURS + exposure hours
Evidence is what the shipped spot traces measured (`data/trace_evidence.csv`, derived by
`python -m broker.pricing.traces`) plus what our own agents observe (preemptions over hours on
spot, added online with `observe`). The prior, in order of preference:
1. the same instance type's pooled evidence in other regions of the cloud (traces, our agents), itself
   weighed against the prior below as a key's own evidence is: an hour of a sibling's runs without a
   preemption does not make a hazard of zero;
2. AWS Spot Advisor bands, anchored on the traces: every traced AWS instance type sits in the
   ">20%" band, so that band's rate is their pooled rate, and a lower band scales it by the
   ratio of band midpoints (2.5/25 for "<5%" ...). A monthly-probability reading of the bands
   (-ln(1-p)/730) predicts ~1,000x fewer preemptions than the traces saw, so it is not used;
3. for clouds without bands (GCP, Azure GPUs): the ">20%" anchor, a cautious default.
The band (low, high) is the 5-95% range of the rate over the next period: posterior uncertainty
plus the day-to-day dispersion the traces show (a rate that is itself Gamma distributed), which is
what `bench/hazard.py` checks against the last 30% of every trace.
An offer's availability (the share of time spot can be had) follows the same order: its region's traces, else its
type's in other regions, else the gaps the anchor's traced types show (their mean gap, from their availability and
rate, after up-spells of 1 / its hazard): no evidence is not evidence of capacity always there.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass

import pandas as pd

from broker.pricing.snapshot import packaged_dir

PRIOR_HOURS = 24.0  # the prior weighs as much as a day of observation
BAND_MIDPOINT = {"<5%": 2.5, "5-10%": 7.5, "10-15%": 12.5, "15-20%": 17.5, ">20%": 25.0}
AZURE_BANDS = {
    "0-5": "<5%",
    "5-10": "5-10%",
    "10-15": "10-15%",
    "15-20": "15-20%",
    "20+": ">20%",
}  # Resource Graph labels
ANCHOR_BAND = ">20%"
DEFAULT_DISPERSION = 0.3  # day-to-day squared CV of the rate where no trace measured it (traces: 0-0.9)

Key = tuple[str, str, str]  # cloud, region, instance type


@dataclass(frozen=True)
class Evidence:
    preemptions: float = 0.0
    hours: float = 0.0
    dispersion: float = 0.0

    def __add__(self, other: Evidence) -> Evidence:
        hours = self.hours + other.hours
        weighted = (self.dispersion * self.hours + other.dispersion * other.hours) / hours if hours else 0.0
        return Evidence(self.preemptions + other.preemptions, hours, weighted)


@dataclass(frozen=True)
class Hazard:
    per_hour: float
    low: float  # 5% quantile of the rate
    high: float  # 95% quantile
    band: str  # the Spot Advisor band, or "-" for none
    source: str  # what the number rests on, in a few words
    availability: float = 1.0  # share of time spot capacity could be had at all


def gamma_band(shape: float, rate: float, dispersion: float, level: float = 0.90) -> tuple[float, float]:
    """The central `level` range of a rate whose mean is Gamma(shape, rate), varying with squared CV `dispersion`."""
    mean = shape / rate
    cv2 = 1 / shape + dispersion
    if mean <= 0:
        return 0.0, 0.0
    tail = (1 - level) / 2
    # the gamma quantiles from the inverse incomplete gamma function: a catalog prices every spot offer with its
    # band, and scipy.stats' frozen distributions took 3.8 of `broker submit`'s 5.7 s for 2,073 offers
    from scipy.special import gammaincinv

    alpha, scale = 1 / cv2, mean * cv2  # the rate's own gamma
    return float(scale * gammaincinv(alpha, tail)), float(scale * gammaincinv(alpha, 1 - tail))


class HazardModel:
    """Hazard per (cloud, region, instance type) from traces, Spot Advisor bands and our own observations."""

    def __init__(self, evidence: pd.DataFrame, bands: dict[tuple[str, str], str]):
        self.bands = bands
        preempt = evidence[evidence["kind"] == "preemption"]
        self.evidence: dict[Key, Evidence] = {}
        for row in preempt.itertuples(index=False):
            key = (row.cloud, row.region, row.instance_type)
            dispersion = DEFAULT_DISPERSION if pd.isna(row.dispersion) else row.dispersion  # a day's trace: unknown
            self.evidence[key] = self.evidence.get(key, Evidence()) + Evidence(
                row.preemptions, row.exposure_h, dispersion
            )
        avail = evidence.dropna(subset=["availability"]).groupby(["cloud", "region", "instance_type"])["availability"]
        self.availability = {k: float(v) for k, v in avail.mean().items()}  # a pool's log has none (traces.py)
        self.traces = len(preempt)
        self.cloud_bands: dict[Key, str] = {}  # bands of clouds other than AWS, added by with_bands
        self.anchor = self._anchor()
        anchored = [a for (c, r, t), a in self.availability.items() if c == "aws" and bands.get((r, t)) == ANCHOR_BAND]
        self.anchor_availability = sum(anchored) / len(anchored) if anchored else None

    @classmethod
    def packaged(cls, evidence: pd.DataFrame | None = None) -> HazardModel:
        """The model from the evidence and Spot Advisor slice shipped in the package; with `evidence` (rows as
        `traces.evidence` writes them), from that evidence instead of the shipped one, which has every shared trace
        in it (a backtest evaluated on traces the model must not have seen)."""
        data = json.loads((packaged_dir() / "aws_spot_advisor_gpu.json").read_text())
        labels = {r["index"]: r["label"] for r in data["ranges"]}
        bands = {
            (region, itype): labels[row["r"]]
            for region, oses in data["spot_advisor"].items()
            for itype, row in oses.get("Linux", {}).items()
        }
        return cls(pd.read_csv(packaged_dir() / "trace_evidence.csv") if evidence is None else evidence, bands)

    def observe(self, observed: dict[Key, Evidence]) -> HazardModel:
        """A model that also counts preemptions our agents saw (offer key -> preemptions over spot hours)."""
        model = copy.copy(self)
        model.evidence = dict(self.evidence)
        for key, seen in observed.items():
            model.evidence[key] = model.evidence.get(key, Evidence()) + seen
        model.anchor = model._anchor()
        return model

    def with_bands(self, bands: dict[Key, str]) -> HazardModel:
        """A model that also knows other clouds' eviction-rate bands (Azure's from Resource Graph), keyed by Key."""
        model = copy.copy(self)
        model.cloud_bands = {**self.cloud_bands, **{k: AZURE_BANDS.get(v, v) for k, v in bands.items()}}
        return model

    def _anchor(self) -> Evidence:
        """Pooled evidence of AWS instance types in the anchor band."""
        pooled = Evidence()
        for (cloud, region, itype), seen in self.evidence.items():
            if cloud == "aws" and self.bands.get((region, itype)) == ANCHOR_BAND:
                pooled = pooled + seen
        return pooled

    def _prior(self, cloud: str, region: str, instance_type: str) -> tuple[float, float, str, str]:
        """(mean, dispersion, band, source) before this key's own evidence."""
        same_type = Evidence()
        for (c, r, itype), seen in self.evidence.items():
            if c == cloud and itype == instance_type and r != region:
                same_type = same_type + seen
        band = (
            self.bands.get((region, instance_type), "-")
            if cloud == "aws"
            else self.cloud_bands.get((cloud, region, instance_type), "-")
        )
        band = band if band in BAND_MIDPOINT or band == "-" else "-"
        anchor_rate = self.anchor.preemptions / self.anchor.hours if self.anchor.hours else 0.0
        dispersion = self.anchor.dispersion if self.anchor.hours else DEFAULT_DISPERSION
        if band != "-":
            mean, source = anchor_rate * BAND_MIDPOINT[band] / BAND_MIDPOINT[ANCHOR_BAND], f"advisor band {band}"
        else:
            mean, source = anchor_rate, "no band: a cautious default"
        if same_type.hours > 0:
            mean, dispersion = weigh(mean, dispersion, same_type)
            source = f"{instance_type} in other regions"
        return mean, dispersion, band, source

    def _availability(self, cloud: str, region: str, instance_type: str, per_hour: float) -> float:
        """The share of time spot can be had, from evidence in the hazard prior's order: the region's traces, its
        type's in other regions, else the anchor's mean gap (from its availability and rate: down for (1 - a) / (a x
        rate) hours an up-spell) after up-spells of 1 / `per_hour`. Without any evidence: always."""
        own = self.availability.get((cloud, region, instance_type))
        if own is not None:
            return own
        same_type = [a for (c, _r, t), a in self.availability.items() if c == cloud and t == instance_type]
        if same_type:
            return sum(same_type) / len(same_type)
        a = self.anchor_availability
        rate = self.anchor.preemptions / self.anchor.hours if self.anchor.hours else 0.0
        if not a or rate <= 0:
            return 1.0
        return 1 / (1 + per_hour * (1 - a) / (a * rate))

    def spot(self, cloud: str, region: str, instance_type: str) -> Hazard:
        """The spot hazard of an instance type in a region, with its 90% band and the evidence behind it."""
        key = (cloud, region, instance_type)
        mean0, dispersion, band, source = self._prior(*key)
        seen = self.evidence.get(key, Evidence())
        shape, rate = max(mean0 * PRIOR_HOURS, 1e-6) + seen.preemptions, PRIOR_HOURS + seen.hours
        if seen.hours > 0:
            dispersion = weigh(mean0, dispersion, seen)[1]
            source = f"{counted(seen)} observed, prior: {source}"
        low, high = gamma_band(shape, rate, dispersion)
        return Hazard(shape / rate, low, high, band, source, self._availability(*key, shape / rate))


def weigh(mean: float, dispersion: float, seen: Evidence) -> tuple[float, float]:
    """A prior's (mean, dispersion) updated by evidence, the prior weighing PRIOR_HOURS: a few hours of runs move it
    a little, thousands of hours of traces replace it (the Gamma posterior's mean)."""
    hours = PRIOR_HOURS + seen.hours
    return (mean * PRIOR_HOURS + seen.preemptions) / hours, (
        dispersion * PRIOR_HOURS + seen.dispersion * seen.hours
    ) / hours


def counted(seen: Evidence) -> str:
    """'3 preemptions in 1,250 h', in words that read right for one preemption and for under an hour."""
    count = f"{seen.preemptions:.0f} preemption{'' if round(seen.preemptions) == 1 else 's'}"
    if seen.hours < 1:
        return f"{count} in {seen.hours * 60:.0f} min" if seen.hours >= 1 / 60 else f"{count} in under a minute"
    return f"{count} in {seen.hours:,.0f} h" if seen.hours >= 10 else f"{count} in {seen.hours:.1f} h"
