"""Spot traces (the Can't Be Late format) and what they say about preemption and availability.

A trace file is `{"metadata": {"gap_seconds": N}, "data": [v0, v1, ...]}`; v is how many spot
instances were running (preemption traces: relaunched after each loss) or obtainable
(availability traces) at each tick. A file's name says where and what: `us-west-2b_v100_1`
is zone us-west-2b, one V100; the directory above it says the cloud (`aws-04-22-2023`).

Bamboo's GCP pools (`node-events/gcloud/a100x1-east1b.txt`: `date, time, live instances` at each change, in
us-east1-b) are read as preemption traces at one-minute ticks: a pool kept at its size, so its drops are instances
lost, but a count that never reaches zero does not say whether capacity could be had (`pool`: no availability).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from broker.domain.errors import BrokerError

# Trace names -> the instance type they were measured on (the upstream README says which).
INSTANCE_TYPES = {
    ("aws", "v100_1"): "p3.2xlarge",
    ("aws", "v100_8"): "p3.16xlarge",
    ("aws", "k80_1"): "p2.xlarge",
    ("aws", "k80_8"): "p2.8xlarge",
    ("aws", "intel_64"): "r5.16xlarge",
    ("aws", "a100_40gb_8"): "p4d.24xlarge",
    ("gcp", "c3-88"): "c3-highcpu-88",
}
_NAME = re.compile(r"^(?P<zone>[a-z]+-[a-z]+-?\d+-?[a-z])_(?P<shape>[a-z0-9_-]+)$")
GCP_POOL_TYPES = {"a100x1": "a2-highgpu-1g"}  # Bamboo's GCP pools -> the catalog's type (V100s have none there)
_POOL_NAME = re.compile(r"^(?P<shape>[a-z0-9]+x\d+)-(?P<region>[a-z]+\d+)(?P<zone>[a-z])$")  # a100x1-east1b
POOL_TICK_S = 60.0


@dataclass(frozen=True)
class Trace:
    """One trace file: where it was measured and its ticks."""

    name: str
    kind: str  # "preemption" (running count, relaunched after each loss) or "availability"
    cloud: str
    region: str
    zone: str
    instance_type: str
    gap_s: float
    data: np.ndarray
    pool: bool = False  # a pool refilled to its size: preemptions, not availability

    @property
    def hours(self) -> float:
        return len(self.data) * self.gap_s / 3600

    def window(self, start: float, end: float) -> Trace:
        """The part of the trace between two fractions of its length (0.0-1.0)."""
        a, b = int(len(self.data) * start), int(len(self.data) * end)
        return replace(self, data=self.data[a:b])

    def preemptions(self) -> int:
        """Instances lost: every drop in the running count."""
        return int(np.maximum(0, self.data[:-1] - self.data[1:]).sum())

    def exposure_hours(self) -> float:
        """Instance-hours at risk: the running count summed over ticks."""
        return float(self.data.sum() * self.gap_s / 3600)

    def dispersion(self, block_h: float = 24.0) -> float:
        """Squared coefficient of variation of the preemption rate between blocks (days by default):
        how much more the count varies than a constant-rate Poisson process would (0 = not at all); NaN for a trace
        shorter than two blocks, which cannot say."""
        per = max(2, int(block_h * 3600 / self.gap_s))
        blocks = [self.data[i : i + per] for i in range(0, len(self.data) - per + 1, per)]
        counts = np.array([np.maximum(0, b[:-1] - b[1:]).sum() for b in blocks])
        exposure = np.array([b.sum() * self.gap_s / 3600 for b in blocks])
        if len(blocks) < 2:
            return float("nan")
        if exposure.sum() <= 0:
            return 0.0
        mean = counts.sum() / exposure.sum() * exposure
        return float(max(0.0, np.sum((counts - mean) ** 2 - mean) / max(np.sum(mean**2), 1e-9)))

    def availability(self) -> float:
        """Share of ticks at which spot capacity could be had at all."""
        return float((self.data > 0).mean()) if len(self.data) else 0.0


def read_ticks(path: Path) -> tuple[float, np.ndarray]:
    """(gap seconds, counts) of a trace file; BrokerError naming the file when it is not in the trace format."""
    try:
        body = json.loads(path.read_text())
        gap_s, data = float(body["metadata"]["gap_seconds"]), np.asarray(body["data"], dtype=float)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BrokerError(
            f"trace {path}: not a spot trace ({err}); expected {{metadata: {{gap_seconds}}, data: [...]}}"
        ) from None
    if gap_s <= 0 or data.ndim != 1 or (data < 0).any():
        raise BrokerError(f"trace {path}: gap_seconds must be > 0 and data a list of counts >= 0")
    return gap_s, data


def load_trace(path: Path) -> Trace:
    """Read one trace file, placed by its name (<zone>_<gpu>_<count>.json in a <cloud>-<date> directory)."""
    path = Path(path)
    gap_s, data = read_ticks(path)
    cloud = path.parent.name.split("-")[0]
    kind = "availability" if "availability" in path.parts else "preemption"
    match = _NAME.match(path.stem)
    if cloud not in ("aws", "gcp", "azure") or match is None:
        raise BrokerError(f"trace {path}: name it <zone>_<gpu>_<count>.json in a <cloud>-<date> directory")
    zone, shape = match["zone"], match["shape"]
    region = zone[:-1] if cloud == "aws" else zone.rsplit("-", 1)[0]
    instance_type = INSTANCE_TYPES.get((cloud, shape), shape)
    return Trace(path.stem, kind, cloud, region, zone, instance_type, gap_s, data)


def load_traces(directory: Path, pattern: str = "**/*.json") -> list[Trace]:
    """Every trace file under a directory, sorted by path."""
    return [load_trace(p) for p in sorted(Path(directory).glob(pattern))]


def load_pool(path: Path) -> Trace:
    """One of Bamboo's GCP pool logs (`date, time, live instances` at each change; `<gpu>x<count>-<region><zone>`,
    regions in the us), as a preemption trace of the count in effect at each minute."""
    path = Path(path)
    match = _POOL_NAME.match(path.stem)
    try:
        if match is None:
            raise ValueError("name it <gpu>x<count>-<region><zone>.txt, e.g. a100x1-east1b.txt")
        log = pd.read_csv(path, header=None, names=["date", "time", "count"], skipinitialspace=True)
        at = (pd.to_datetime(log["date"] + " " + log["time"]) - pd.Timestamp(0)).dt.total_seconds()
        counts = log["count"].astype(float).to_numpy()
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BrokerError(f"pool log {path}: {err}") from None
    # each change is logged on three rows a minute apart, the next change's rows may start before those end: a
    # change is the first row of its count, and the changes are in time order
    first, end = np.r_[True, counts[1:] != counts[:-1]], at.max()  # the log runs to its last row
    at, counts = at.to_numpy()[first], counts[first]
    order = np.argsort(at, kind="stable")
    at, counts = at[order], counts[order]
    ticks = np.arange(at[0], end, POOL_TICK_S)
    data = counts[np.searchsorted(at, ticks, side="right") - 1]  # the newest count by each minute
    region = f"us-{match['region']}"
    zone, shape = f"{region}-{match['zone']}", match["shape"]
    instance_type = GCP_POOL_TYPES.get(shape, shape)
    return Trace(path.stem, "preemption", "gcp", region, zone, instance_type, POOL_TICK_S, data, pool=True)


def shared_traces(root: Path) -> list[Trace]:
    """Every trace the shared data holds: the Can't Be Late files, then Bamboo's GCP pool logs (what is shipped)."""
    return load_traces(root) + [load_pool(p) for p in sorted(Path(root).glob("node-events/gcloud/*.txt"))]


EVIDENCE_COLUMNS = [
    "trace",
    "kind",
    "cloud",
    "region",
    "zone",
    "instance_type",
    "hours",
    "preemptions",
    "exposure_h",
    "dispersion",
    "availability",
]


def evidence(traces: list[Trace]) -> pd.DataFrame:
    """One row of evidence per trace: preemptions over exposure, their day-to-day dispersion, availability."""
    rows = [
        [
            t.name,
            t.kind,
            t.cloud,
            t.region,
            t.zone,
            t.instance_type,
            round(t.hours, 3),
            t.preemptions() if t.kind == "preemption" else 0,
            round(t.exposure_hours(), 3) if t.kind == "preemption" else 0.0,
            round(t.dispersion(), 4) if t.kind == "preemption" else 0.0,
            float("nan") if t.pool else round(t.availability(), 4),
        ]
        for t in traces
    ]
    return pd.DataFrame(rows, columns=EVIDENCE_COLUMNS)


if (
    __name__ == "__main__"
):  # python -m broker.pricing.traces ../shared/data/traces > broker/pricing/data/trace_evidence.csv
    import sys

    evidence(shared_traces(Path(sys.argv[1]))).to_csv(sys.stdout, index=False)
