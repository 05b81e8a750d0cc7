"""Hazard model validation: fit on the first 70% of every shared preemption trace, predict the last 30%.

The model is the product's own (`HazardModel`, region level, as offers are priced), built from
the evidence of the first 70% of all traces. For each trace it predicts the number of
preemptions in the trace's last 30% from that period's exposure (instance-hours running):
the mean, and the 90% interval of a Gamma-Poisson count (posterior uncertainty plus the
day-to-day dispersion of the rate). Calibration is the share of traces whose observed count
falls inside its interval (goal >= 85%); `calibration_poisson` is the same without dispersion,
for comparison, and `mean_width_ratio` how wide the intervals are relative to the mean.

    python bench/hazard.py --json [--traces ../shared/data/traces/preemption]
        [--pools ../shared/data/traces/node-events/gcloud]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table
from scipy import stats

from broker.pricing.hazard import PRIOR_HOURS, HazardModel
from broker.pricing.traces import evidence, load_pool, load_traces

FIT_SHARE = 0.7


def interval(rate: float, shape: float, dispersion: float, exposure_h: float, level: float = 0.90) -> tuple[int, int]:
    """Central interval of a Poisson count whose rate is Gamma with mean `rate` and squared CV 1/shape + dispersion."""
    if rate <= 0 or exposure_h <= 0:
        return 0, 0
    cv2 = 1 / shape + dispersion
    r, p = 1 / cv2, 1 / (1 + rate * cv2 * exposure_h)
    tail = (1 - level) / 2
    return int(stats.nbinom.ppf(tail, r, p)), int(stats.nbinom.ppf(1 - tail, r, p))


def run(directory: Path, pools: Path | None = None) -> dict:
    traces = [t for t in load_traces(directory) if t.kind == "preemption"]
    traces += [load_pool(p) for p in sorted(pools.glob("*.txt"))] if pools else []
    fitted = HazardModel(evidence([t.window(0, FIT_SHARE) for t in traces]), HazardModel.packaged().bands)
    rows, inside, inside_poisson, widths = [], 0, 0, []
    for t in traces:
        test = t.window(FIT_SHARE, 1)
        key = (t.cloud, t.region, t.instance_type)
        h = fitted.spot(*key)
        seen = fitted.evidence.get(key)
        shape = h.per_hour * (PRIOR_HOURS + (seen.hours if seen else 0.0))  # the posterior's shape
        dispersion = seen.dispersion if seen else 0.0
        exposure, observed = test.exposure_hours(), test.preemptions()
        low, high = interval(h.per_hour, shape, dispersion, exposure)
        plain = interval(h.per_hour, shape, 0.0, exposure)
        predicted = h.per_hour * exposure
        inside += low <= observed <= high
        inside_poisson += plain[0] <= observed <= plain[1]
        widths.append((high - low) / max(predicted, 1.0))
        rows.append(
            {
                "trace": f"{directory.name}/{t.cloud}/{t.zone}_{t.instance_type}",
                "exposure_h": round(exposure, 1),
                "predicted": round(predicted, 1),
                "low": low,
                "high": high,
                "observed": observed,
            }
        )
    return {
        "traces": rows,
        "calibration": round(inside / len(rows), 3),
        "calibration_poisson": round(inside_poisson / len(rows), 3),
        "mean_width_ratio": round(sum(widths) / len(widths), 2),
        "fit_share": FIT_SHARE,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "preemption"
    )
    parser.add_argument(
        "--pools",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "node-events" / "gcloud",
        help="Bamboo's GCP pool logs (traces.load_pool), validated the same way",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.traces, args.pools if args.pools.is_dir() else None)
    if args.json:
        print(json.dumps(result))
        return
    table = Table(title=f"hazard: fit on {FIT_SHARE:.0%}, predict the rest; calibration {result['calibration']:.0%}")
    for column in ("trace", "exposure_h", "predicted", "low", "high", "observed"):
        table.add_column(column, justify="left" if column == "trace" else "right")
    for r in result["traces"]:
        table.add_row(*(str(r[c]) for c in ("trace", "exposure_h", "predicted", "low", "high", "observed")))
    Console(width=120).print(table)
    print(
        f"calibration {result['calibration']:.0%} (without dispersion {result['calibration_poisson']:.0%}); "
        f"mean interval width {result['mean_width_ratio']}x the prediction"
    )


if __name__ == "__main__":
    main()
