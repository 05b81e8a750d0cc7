"""The market model's prior for a zone without traces: its region's traced zones, or its type's anywhere?

Every live offer the model has no trace of (AWS names zones by account-independent ids the traces do not use; other
offers name a region only) is modelled from the spells of its instance type's traced zones. This holds each traced
zone out in turn (all its traces, every directory), fits the product's model (`MarketModel.fit`) on every other
trace, and asks it for the held-out zone as a live offer there: once named in its region (the model then draws
from the region's traced zones), once in a region with no trace (the type's zones anywhere, what it did before).
Each is compared with the zone's own spells: its share of time up (P(launch)) and its mean up- and down-spells.
Only zones whose region has another traced zone of their type are counted (elsewhere both priors are the same).
The offers' availability (`HazardModel`, per region) is held out the same way, a region at a time from the shipped
evidence: what the model gives it from the rest (its type elsewhere, else the traced types' gaps), against the 1.0
an offer without evidence of its own had before.

    python bench/sibling_prior.py --json [--traces ../shared/data/traces]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from broker.domain.model import Tier
from broker.domain.offer import Offer
from broker.pricing.availability import MarketModel
from broker.pricing.hazard import HazardModel
from broker.pricing.snapshot import packaged_dir
from broker.pricing.traces import load_traces

NOWHERE = "nowhere-1"  # a region no trace is in


def live_offer(cloud: str, region: str, instance_type: str) -> Offer:
    """A spot offer as a live catalog names one: a zone the traces do not (an AWS zone id); the model reads its
    cloud, region, zone and instance type only."""
    return Offer(
        cloud=cloud,
        region=region,
        zone=f"{region}-zone-id",
        instance_type=instance_type,
        tier=Tier.spot,
        accelerator="V100",
        accelerator_count=1,
        gpu_memory_gb=16,
        vcpus=8,
        memory_gb=61,
        price_usd_per_h=1.0,
        hazard_per_h=0.2,
        availability=0.9,
    )


def run(root: Path) -> dict:
    traces = [t for d in sorted({p.parent for p in root.glob("**/*.json")}) for t in load_traces(d)]
    keys = sorted({(t.cloud, t.region, t.zone, t.instance_type) for t in traces})
    rows = []
    for cloud, region, zone, kind in keys:
        if not any(k[:2] == (cloud, region) and k[3] == kind and k[2] != zone for k in keys):
            continue  # no other zone of its region traced: both priors are its type's
        mine = [(t.cloud, t.zone, t.instance_type) == (cloud, zone, kind) for t in traces]
        truth = MarketModel.fit([t for t, m in zip(traces, mine) if m]).zones[(cloud, zone, kind)]
        rest = MarketModel.fit([t for t, m in zip(traces, mine) if not m])
        row = {"zone": f"{cloud}/{zone}", "instance_type": kind}
        for name, model in (
            ("truth", truth),
            ("region", rest.for_offer(live_offer(cloud, region, kind))),
            ("type", rest.for_offer(live_offer(cloud, NOWHERE, kind))),
        ):
            row |= {f"{name}_p_launch": round(model.p_launch, 3), f"{name}_up_h": round(model.mean_up_h, 2)}
            row[f"{name}_down_h"] = round(model.mean_down_h, 2)
        rows.append(row)

    def mean_error(prior: str) -> dict:
        """Mean |P(launch) error| and mean |log ratio| of the spells' means over the zones."""
        n = len(rows)
        return {
            "p_launch_abs_error": round(sum(abs(r[f"{prior}_p_launch"] - r["truth_p_launch"]) for r in rows) / n, 3),
            "up_h_abs_log_ratio": round(sum(abs(math.log(r[f"{prior}_up_h"] / r["truth_up_h"])) for r in rows) / n, 3),
            "down_h_abs_log_ratio": round(
                sum(abs(math.log(r[f"{prior}_down_h"] / r["truth_down_h"])) for r in rows) / n, 3
            ),
        }

    return {
        "zones": rows,
        "region_prior": mean_error("region"),
        "type_prior": mean_error("type"),
        "availability": availability_held_out(),
    }


def availability_held_out() -> dict:
    """Each traced region's availability (per instance type) from the shipped evidence without its rows."""
    evidence = pd.read_csv(packaged_dir() / "trace_evidence.csv")
    shipped = HazardModel.packaged()
    rows = []
    for key, truth in sorted(shipped.availability.items()):
        cloud, region, kind = key
        mine = (evidence.cloud == cloud) & (evidence.region == region) & (evidence.instance_type == kind)
        held_out = HazardModel(evidence[~mine], shipped.bands).spot(*key)
        rows.append({"region": "/".join(key), "own": round(truth, 3), "held_out": round(held_out.availability, 3)})
    n = len(rows)
    return {
        "regions": rows,
        "held_out_abs_error": round(sum(abs(r["held_out"] - r["own"]) for r in rows) / n, 3),
        "always_abs_error": round(sum(abs(1.0 - r["own"]) for r in rows) / n, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.traces)
    if args.json:
        print(json.dumps(result))
        return
    table = Table(title="a held-out zone's P(launch) and mean spells (h): its own, from its region, from its type")
    columns = ["zone", "instance_type"] + [
        f"{p}_{m}" for p in ("truth", "region", "type") for m in ("p_launch", "up_h")
    ]
    for column in columns:
        table.add_column(column, justify="left" if column in ("zone", "instance_type") else "right")
    for r in result["zones"]:
        table.add_row(*(str(r[c]) for c in columns))
    Console(width=140).print(table)
    print(f"region prior: {result['region_prior']}\ntype prior:   {result['type_prior']}")
    held = result["availability"]
    print(
        f"availability held out by region: {held['held_out_abs_error']} mean abs error "
        f"(taken as always there: {held['always_abs_error']})"
    )


if __name__ == "__main__":
    main()
