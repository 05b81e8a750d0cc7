"""Preemption hazard per offer (preemptions per hour), from the best evidence at hand.

Until a hazard model is calibrated on preemption history, the evidence is the AWS Spot
Advisor: per region and instance type, a band of monthly interruption frequency. A band
is read as the probability p that an instance is interrupted within a month (730 h), so
the hazard is -ln(1 - p) / 730. Clouds without published bands (GCP, Azure) get the
worst AWS band, a deliberately cautious default. On-demand capacity has hazard 0.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from broker.pricing.snapshot import packaged_dir

HOURS_PER_MONTH = 730.0
# A representative monthly interruption probability for each Spot Advisor band
# (labels "<5%", "5-10%", "10-15%", "15-20%", ">20%"): the band's midpoint, 25% for the open one.
BAND_PROBABILITY = {"<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.25}
DEFAULT_BAND = ">20%"


def hazard_from_monthly(probability: float) -> float:
    """Preemptions per hour for a probability of interruption within one month."""
    return -math.log(1.0 - probability) / HOURS_PER_MONTH


@dataclass(frozen=True)
class Hazard:
    per_hour: float
    band: str
    source: str


class SpotAdvisorHazard:
    """Hazard per (cloud, region, instance type) from the AWS Spot Advisor bands."""

    def __init__(self, path: Path | None = None):
        path = path or packaged_dir() / "aws_spot_advisor_gpu.json"
        data = json.loads(Path(path).read_text())
        labels = {r["index"]: r["label"] for r in data["ranges"]}
        self._bands = {
            (region, itype): labels[row["r"]]
            for region, oses in data["spot_advisor"].items()
            for itype, row in oses.get("Linux", {}).items()
        }

    def spot(self, cloud: str, region: str, instance_type: str) -> Hazard:
        """The spot hazard of an instance type in a region."""
        band = self._bands.get((region, instance_type)) if cloud == "aws" else None
        if band is None:
            return Hazard(hazard_from_monthly(BAND_PROBABILITY[DEFAULT_BAND]), DEFAULT_BAND, "default")
        return Hazard(hazard_from_monthly(BAND_PROBABILITY[band]), band, "aws-spot-advisor")
