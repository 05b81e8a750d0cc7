"""The simulated cloud of a backtest: which offers exist and how much capacity each has at every tick.

Spot offers follow traces (one per trace file): an instance can be had at a tick, and a running
one survives it, only when the trace shows capacity for the whole tick (the minimum of the
trace's own ticks inside it), scaled as below. Their prices come from the
catalog: the trace's zone name (us-east-1a) is not the catalog's zone ID (use1-az1), the mapping
differs per AWS account, so a zone's spot price is the median of its region's. On-demand offers
are the catalog's, for the traced instance types and regions, always available. Bubble offers
come from main training jobs' profiles, one executor (capacity 1) per stage. A trace's peak stands for at
least `spot_instances` instances (a 1-node trace says whether spot could be had, not that only one could).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import yaml

from broker.bubbles.capacity import bubble_offer
from broker.domain.bubbles import BubbleProfile
from broker.domain.errors import BrokerError
from broker.domain.model import Tier
from broker.domain.offer import Offer
from broker.pricing.availability import tick_minimum
from broker.pricing.catalog import PriceCatalog
from broker.pricing.hazard import HazardModel
from broker.pricing.traces import Trace, evidence, load_trace, read_ticks
from broker.sim.workloads import FREERIDE_MAIN_JOBS

UNLIMITED = 10**6


@dataclass
class SpotSeries:
    """One spot offer and the instances obtainable at each simulated tick."""

    offer: Offer
    capacity: np.ndarray  # per tick
    trace: str  # the file it follows

    def at(self, tick: int) -> int:
        """Instances at a tick; none after the trace ends."""
        return int(self.capacity[tick]) if tick < len(self.capacity) else 0


@dataclass
class OfferBook:
    """What the core's Broker prices a job on in a backtest: the market's offers (duck-types PriceCatalog)."""

    offers: list[Offer]


@dataclass
class Market:
    """The offers of a backtest and their capacity over time."""

    start: datetime
    tick_s: float
    spot: list[SpotSeries]
    on_demand: list[Offer]
    bubbles: list[Offer] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # trace files that give no GPU offer, and why
    # where a pool shrinks, its idle instances go first (the world the bounds assume, where a pool's instances are
    # interchangeable), not instances drawn at random (the traces say how many went, not which): a measuring aid
    idle_first: bool = False
    # a spot instance taken back comes with its cloud's notice, and the agent checkpoints the job within the lead
    # (agents/agent.py); False: no notice, a preemption loses the work since the newest checkpoint (a measuring aid)
    notices: bool = True

    @property
    def ticks(self) -> int:
        return max((len(s.capacity) for s in self.spot), default=0)

    def offers(self, bubbles: bool = True) -> list[Offer]:
        return [s.offer for s in self.spot] + self.on_demand + (self.bubbles if bubbles else [])

    def with_bubbles(self, bubbles: list[Offer]) -> Market:
        return replace(self, bubbles=bubbles)


def resample(trace: Trace, tick_s: float) -> np.ndarray:
    """The trace's count per simulated tick: the least count seen during the tick (a tick is survived
    only when capacity lasted all of it); a tick finer than the trace repeats its values."""
    return tick_minimum(trace.data, trace.gap_s, tick_s)


def _placement(path: Path, mapping: dict) -> dict:
    """cloud, region, zone and instance type of a trace file: from offers.yaml, else from its name."""
    entry = mapping.get(path.name) or mapping.get(path.stem)
    if entry is None:
        trace = load_trace(path)
        return {
            "trace": trace,
            "cloud": trace.cloud,
            "region": trace.region,
            "zone": trace.zone,
            "instance_type": trace.instance_type,
        }
    missing = [k for k in ("cloud", "region", "instance_type") if k not in entry]
    if missing:
        raise BrokerError(
            f"offers.yaml: {path.name} needs {', '.join(missing)}; give cloud, region, zone and instance_type"
        )
    gap_s, data = read_ticks(path)
    zone = entry.get("zone") or entry["region"]
    trace = Trace(path.stem, "availability", entry["cloud"], entry["region"], zone, entry["instance_type"], gap_s, data)
    return {
        "trace": trace,
        **{k: entry.get(k) for k in ("cloud", "region", "instance_type", "spot_usd_per_h")},
        "zone": zone,
    }


def from_traces(
    directory: Path, catalog: PriceCatalog, start: datetime, tick_s: float = 600.0, spot_instances: int = 4
) -> Market:
    """The market of a trace directory (its JSON files, recursively) priced with the catalog."""
    directory = Path(directory)
    files = sorted(directory.glob("**/*.json"))
    if not directory.is_dir() or not files:
        raise BrokerError(
            f"traces: {directory} has no trace files (*.json); point --traces at e.g. "
            "../shared/data/traces/availability/1-node"
        )
    mapping_file = directory / "offers.yaml"
    mapping = yaml.safe_load(mapping_file.read_text()) or {} if mapping_file.exists() else {}
    rows = catalog.rows
    spot, skipped, seen = [], [], set()
    regions: set[tuple[str, str, str]] = set()
    for path in files:
        place = _placement(path, mapping)
        here = rows[(rows.cloud == place["cloud"]) & (rows.instance_type == place["instance_type"])]
        in_region = here[here.region == place["region"]]
        if here.empty or in_region.empty:
            skipped.append(
                f"{path.relative_to(directory)}: no GPU offer {place['instance_type']} in "
                f"{place['region']} in the catalog"
            )
            continue
        price = place.get("spot_usd_per_h") or in_region.spot_usd_per_h.median()
        if price is None or (isinstance(price, float) and math.isnan(price)):
            skipped.append(
                f"{path.relative_to(directory)}: the catalog has no spot price for "
                f"{place['instance_type']} in {place['region']}"
            )
            continue
        row = in_region.iloc[0]
        risk = catalog.hazard.spot(place["cloud"], place["region"], place["instance_type"])
        offer = Offer(
            cloud=place["cloud"],
            region=place["region"],
            zone=place["zone"],
            instance_type=place["instance_type"],
            tier=Tier.spot,
            accelerator=row.accelerator,
            accelerator_count=int(row.accelerator_count),
            gpu_memory_gb=float(row.gpu_memory_gb),
            vcpus=None if math.isnan(row.vcpus) else float(row.vcpus),
            memory_gb=None if math.isnan(row.memory_gb) else float(row.memory_gb),
            price_usd_per_h=float(price),
            hazard_per_h=risk.per_hour,
            hazard_source=risk.source,
            availability=risk.availability,
        )
        if offer.id in seen:
            skipped.append(f"{path.relative_to(directory)}: a second trace for {offer.id}; the first one is used")
            continue
        seen.add(offer.id)
        regions.add((place["cloud"], place["region"], place["instance_type"]))
        scale = max(1, spot_instances // max(1, int(place["trace"].data.max())))
        spot.append(SpotSeries(offer, resample(place["trace"], tick_s) * scale, str(path.relative_to(directory))))
    if not spot:
        raise BrokerError(
            f"traces: no trace in {directory} maps to a GPU offer in the catalog: " + "; ".join(skipped[:3])
        )
    return Market(start, tick_s, spot, _on_demand(catalog, regions), [], skipped)


def _on_demand(catalog: PriceCatalog, regions: set[tuple[str, str, str]]) -> list[Offer]:
    """The cheapest on-demand offer of each traced (cloud, region, instance type)."""
    best: dict[tuple, Offer] = {}
    for offer in catalog.offers:
        key = (offer.cloud, offer.region, offer.instance_type)
        if (
            offer.tier == Tier.on_demand
            and key in regions
            and (key not in best or offer.price_usd_per_h < best[key].price_usd_per_h)
        ):
            best[key] = offer.model_copy(update={"zone": None})
    return sorted(best.values(), key=lambda o: o.id)


PACKAGED_TRACES = Path(__file__).parent / "data" / "traces"  # the default --traces


def trace_start(directory: Path) -> datetime:
    """When the traces begin: the date in a `<cloud>-MM-DD-YYYY` directory name, else 2023-01-01."""
    for part in [directory.name, *(p.name for p in directory.iterdir() if p.is_dir())]:
        found = re.search(r"(\d{2})-(\d{2})-(\d{4})$", part)
        if found:
            month, day, year = (int(g) for g in found.groups())
            return datetime(year, month, day, tzinfo=UTC)
    return datetime(2023, 1, 1, tzinfo=UTC)


def measured_bubbles(path: Path, market) -> list:
    """Bubble offers from a file of measured profiles, on the traces' accelerator in the first on-demand region."""
    try:
        found = [BubbleProfile.model_validate(p) for p in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError) as err:
        raise BrokerError(
            f"profiles: {path} is not a JSON list of bubble profiles ({str(err).splitlines()[0]}); "
            "write one from `broker.bubbles.profiler.load_profiles`"
        ) from None
    home = market.on_demand[0]
    offers = (bubble_offer(p, home.cloud, home.region, home.accelerator) for p in found)
    return [o for o in offers if o is not None]


def backtest_market(
    traces: Path,
    prices_dir: Path | None = None,
    tick_s: float = 600.0,
    spot_instances: int = 4,
    profiles: Path | None = None,
    hazard_from: list[Trace] | None = None,
) -> Market:
    """The market a backtest runs in: spot offers from the traces, on-demand from the catalog, and bubbles from
    measured profiles or, without them, two FreeRide-like main jobs. The offers' preemption hazard is learned from
    the traces `hazard_from` (those the market model is fitted on, loaded once by the caller) when given, else from
    the evidence shipped in the package, which has every shared trace in it, the evaluated ones too."""
    hazard = None
    if hazard_from is not None:
        hazard = HazardModel.packaged(evidence(hazard_from))
    catalog = PriceCatalog.from_snapshot(prices_dir, hazard)
    market = from_traces(traces, catalog, trace_start(traces), tick_s, spot_instances)
    return market.with_bubbles(
        measured_bubbles(profiles, market)
        if profiles
        else [o for main in FREERIDE_MAIN_JOBS for o in main.offers(market.start)]
    )
