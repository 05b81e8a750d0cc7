"""Out of sample, is spot as available as the market model says? Each trace directory's zones against the model
fitted on the others.

bench/forecast.py evaluates each GPU trace directory with the market model fitted on the other directories (leave
one out). A zone's availability drifts between the directories' dates, so the model may be wrong about the evaluated
world before any quote is made. For every zone of every directory this prints the world's share of ticks with spot
(the backtest's capacity series, `sim/market.backtest_market`) and the mean of its down-spells, beside the model's
long-run share up (`ZoneModel.p_launch`) and mean down-spell, both at the backtest's tick. `mean_gap_pts` is the mean
of model minus world over the zones: positive, the model is optimistic about spot.

    python bench/drift.py [--traces ../shared/data/traces]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from cost import SHARED_TRACES, fit_market, gpu_directories_or_exit  # bench/cost.py, beside this file

from broker.pricing.availability import spells


def zones(directory: str, fit: list[str]) -> list[dict]:
    """Per spot series of the directory's backtest market: the world's availability and the model's."""
    market, model = fit_market(directory, fit)
    tick_h = market.tick_s / 3600
    rows = []
    for series in market.spot:
        up = np.asarray(series.capacity) > 0
        _, down = spells(up)
        zone = model.for_offer(series.offer)
        rows.append(
            {
                "directory": Path(directory).name,
                "zone": series.offer.zone,
                "hours": round(len(up) * tick_h, 1),
                "world_share_up": round(float(up.mean()), 3),
                "model_share_up": round(zone.p_launch, 3),
                "world_mean_down_h": round(float(down.mean()) * tick_h, 2) if len(down) else 0.0,
                "model_mean_down_h": round(zone.mean_down_h, 2),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=SHARED_TRACES)
    args = parser.parse_args()
    directories = gpu_directories_or_exit(parser, args.traces)
    rows = [row for d in directories for row in zones(d, [f for f in directories if f != d])]
    gaps = [r["model_share_up"] - r["world_share_up"] for r in rows]
    summary = {
        "split": "leave one trace directory out: each directory's zones against the model fitted on the others",
        "zones": len(rows),
        "mean_gap_pts": round(100 * float(np.mean(gaps)), 1),
        "mean_abs_gap_pts": round(100 * float(np.mean(np.abs(gaps))), 1),
        "optimistic_zones": int(sum(g > 0 for g in gaps)),
        "rows": rows,
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
