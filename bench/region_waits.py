"""Are regions independent? The money model's waits for spot capacity (models/launch_waits.py) against the traces'.

`with_launch_waits` prices a start as waiting while every region with a zone of the job's speed is down, taking
regions as independent: P(all down) = prod_r (1 - a_r). This replays the one trace set whose zones share a clock
(9 p3.2xlarge zones in 3 AWS regions, 195 s ticks, 45 days), at the market model's 10-minute tick, and compares:
- P(all regions down): the product against the share of ticks the traces had no zone up anywhere;
- a start's wait: the money model's (its offers as `core/broker.with_market_spells` gives them) against the mean wait
  from a random tick until some zone is up;
- a restart's wait after a preemption in each region: the money model's against the wait from each tick where that
  region's best zone went down.

    python bench/region_waits.py [--traces ../shared/data/traces]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from broker.core.broker import with_market_spells
from broker.domain.offer import Offer
from broker.models.launch_waits import with_launch_waits
from broker.pricing.availability import MarketModel, spells, tick_minimum
from broker.pricing.traces import load_traces
from broker.sim.market import backtest_market

TICK_S = 600.0


def wait_from_each(up: np.ndarray, starts: np.ndarray, tick_h: float) -> float:
    """Mean hours from each start tick until `up` holds (to the trace's end where it never does)."""
    next_up = np.full(len(up) + 1, len(up))
    for i in range(len(up) - 1, -1, -1):
        next_up[i] = i if up[i] else next_up[i + 1]
    return float(np.mean(next_up[starts] - starts) * tick_h) if len(starts) else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=Path(__file__).parents[2] / "shared/data/traces")
    args = parser.parse_args()
    directory = args.traces / "availability/1-node/aws-02-15-2023"
    traces = load_traces(directory)
    tick_h = TICK_S / 3600
    up = {t.zone: tick_minimum(t.data, t.gap_s, TICK_S) > 0 for t in traces}
    model = MarketModel.fit(traces, TICK_S)
    market = backtest_market(directory, tick_s=TICK_S, hazard_from=traces)  # its spot offers, as a backtest's
    offers = with_launch_waits([with_market_spells(s.offer, model) for s in market.spot])
    by_region: dict[str, list[Offer]] = defaultdict(list)
    for o in offers:
        by_region[o.region].append(o)
    best = {r: max(zones, key=lambda o: o.availability) for r, zones in by_region.items()}
    region_up = {r: up[b.zone] for r, b in best.items()}
    anywhere = np.any(np.array(list(region_up.values())), axis=0)
    independent = float(np.prod([1 - b.availability for b in best.values()]))
    restarts = {}
    for r, b in best.items():
        went_down = np.flatnonzero(np.diff(region_up[r].astype(int)) == -1) + 1
        restarts[r] = {
            "model_h": round(b.launch_waits_h[1], 4),
            "traces_h": round(wait_from_each(anywhere, went_down, tick_h), 4),
            "preemptions": len(went_down),
        }
    _, all_down = spells(anywhere)
    print(
        json.dumps(
            {
                "regions": {r: {"zone": b.zone, "share_up": round(b.availability, 3)} for r, b in best.items()},
                "p_all_down_independent": round(independent, 4),
                "p_all_down_traces": round(float(1 - anywhere.mean()), 4),
                "start_wait_model_h": round(
                    next(iter(best.values())).launch_waits_h[0], 4
                ),  # the same for each best zone
                "start_wait_traces_h": round(wait_from_each(anywhere, np.arange(len(anywhere)), tick_h), 4),
                "all_down_spells": len(all_down),
                "all_down_mean_h": round(float(all_down.mean() * tick_h), 3) if len(all_down) else 0.0,
                "restart": restarts,
                "corr_best_zones": np.round(np.corrcoef(np.array(list(region_up.values()), dtype=float)), 3).tolist(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
