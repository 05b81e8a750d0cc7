"""Planner benchmark: the cost/SLO program on N jobs x M offers from the real price catalog.

Jobs are a seeded mix (accelerator shapes the catalog has, 1-200 reference GPU-hours,
deadlines at 1.2-4x the on-demand time or none, budgets on a third); offers are M of the
catalog's 4,190 (sampled; beyond that, copies in made-up zones with prices moved +-10%),
spot offers with 0-8 obtainable instances each, on-demand without a limit (the broker learns a
capacity only when a launch fails). Times are wall-clock on this machine.

    python bench/planner.py --jobs 10000 --offers 2000 --json
    python bench/planner.py --curve
    python bench/planner.py --jobs 10000 --offers 2000 --incremental 1000 --json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from datetime import UTC, datetime

from rich.console import Console
from rich.table import Table

from broker.domain.model import Tier
from broker.domain.offer import Offer
from broker.domain.specfile import validate_spec
from broker.planning.costslo import CostSLO
from broker.planning.option_table import PlanItem
from broker.pricing.catalog import PriceCatalog

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SHAPES = [
    "L4:1",
    "A10G:1",
    "T4:1",
    "L40S:1",
    "A100:1",
    "H100:1",
    "V100:1",
    "L4:4",
    "A10G:4",
    "A100:8",
    "H100:8",
    "A100-80GB:1",
]


def make_offers(catalog: PriceCatalog, count: int, rng: random.Random) -> tuple[list[Offer], dict[str, int]]:
    base = catalog.offers
    offers = rng.sample(base, min(count, len(base)))
    copy = 0
    while len(offers) < count:
        o = rng.choice(base)
        copy += 1
        offers.append(
            o.model_copy(
                update={
                    "zone": f"{o.zone or o.region}-x{copy}",
                    "price_usd_per_h": o.price_usd_per_h * rng.uniform(0.9, 1.1),
                }
            )
        )
    return offers, {o.id: rng.randint(0, 8) for o in offers if o.tier != Tier.on_demand}


def make_jobs(count: int, rng: random.Random, prefix: str = "j") -> list[PlanItem]:
    items = []
    for k in range(count):
        shapes = rng.sample(SHAPES, rng.randint(1, 3))
        hours = round(rng.lognormvariate(2.5, 1.2), 2)
        data = {
            "name": f"{prefix}{k}",
            "run": ["true"],
            "resources": {"accelerators": shapes},
            "work": {"gpu_hours": min(max(hours, 1), 200), "kind": rng.choice(["training", "inference"])},
            "checkpoint": {"size_gb": rng.choice([1, 5, 20, 80])},
            "fill": rng.random() < 0.3,
        }
        if rng.random() < 0.7:
            data["deadline"] = f"+{min(max(hours, 1), 200) * rng.uniform(1.2, 4) + 1:.1f}h"
        if rng.random() < 0.33:
            data["budget_usd"] = round(min(max(hours, 1), 200) * rng.uniform(0.5, 3), 2)
        items.append(PlanItem(f"{prefix}{k}", validate_spec(data, NOW)))
    return items


def run(jobs: int, offers: int, seed: int, incremental: int = 0) -> dict:
    rng = random.Random(seed)
    catalog = PriceCatalog.from_snapshot()
    offer_list, capacity = make_offers(catalog, offers, rng)
    items = make_jobs(jobs, rng)
    started = time.perf_counter()
    plan = CostSLO().plan(items, offer_list, capacity, NOW)
    total = time.perf_counter() - started
    out = {
        "jobs": jobs,
        "offers": offers,
        **{k: round(v, 3) for k, v in plan.stats.items()},
        "total_s": round(total, 3),
        "objective": round(plan.objective, 2),
        "bound": round(plan.bound, 2),
        "gap": plan.gap,
        "placed": len(plan.assignments),
        "unplaced": len(plan.unplaced),
        "expected_cost_usd": round(plan.expected_cost_usd, 2),
    }
    if incremental:
        left = dict(capacity)
        for offer_id in plan.assignments.values():
            if offer_id in left:  # on-demand has no limit
                left[offer_id] -= 1
        arrivals = make_jobs(incremental, rng, prefix="new")
        started = time.perf_counter()
        again = CostSLO().plan(arrivals, offer_list, left, NOW)
        out["incremental"] = {
            "jobs": incremental,
            "total_s": round(time.perf_counter() - started, 3),
            "gap": again.gap,
            "placed": len(again.assignments),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--offers", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--incremental", type=int, default=0, help="then re-plan this many new jobs on what is left")
    parser.add_argument("--curve", action="store_true", help="a table for 100..10,000 jobs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.curve:
        result = run(args.jobs, args.offers, args.seed, args.incremental)
        print(json.dumps(result) if args.json else json.dumps(result, indent=2))
        return
    rows = [run(n, args.offers, args.seed) for n in (100, 300, 1_000, 3_000, 10_000)]
    if args.json:
        print(json.dumps({"curve": rows}))
        return
    table = Table(title=f"costslo planner, {args.offers} offers")
    columns = ("jobs", "price_s", "auction_s", "build_s", "solve_s", "total_s", "passes", "columns", "gap", "placed")
    for column in columns:
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(*(f"{r[c]:.2e}" if c == "gap" else str(r.get(c, "-")) for c in columns))
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
