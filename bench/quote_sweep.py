"""Quote sweep: the example jobs quoted over a range of deadlines on the real catalog, where one job may run on
several instance types at different speeds (an L4 2.5 times slower than an A100). The backtests' offers share one
speed per job, so they never show how a quote picks among speeds; this does. For each deadline: the tier and GPU
chosen, the futures' P(meet deadline) and cost p50, and whether the quote falls short of the odds asked or more
futures overrun the budget than keep it.

Deadlines are multiples (1.0 to 4.0, in quarters) of the job's fastest on-demand time at its estimated speed, from a
fixed clock; the market model and catalog are the packaged ones (`broker submit --quote` without a store).

    python bench/quote_sweep.py --json [--examples examples] [--steps 13]
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from broker.app.wiring import make_broker
from broker.core.clock import SimulatedClock
from broker.domain.errors import InfeasibleError
from broker.domain.model import Tier
from broker.domain.specfile import load_spec
from broker.models.fit import fits
from broker.models.risk import evaluate

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
SWEPT = ["finetune-lora.yaml", "batch-inference.yaml", "pretrain-gpt-1b3.yaml"]


def fastest_on_demand_h(broker, spec) -> float:
    """The job's time on its fastest on-demand offer at the estimate: the sweep's unit of deadline."""
    return min(
        evaluate(spec, o, NOW).expected_wall_h for o in broker.offers([]) if o.tier == Tier.on_demand and fits(spec, o)
    )


def sweep(examples: Path, steps: int) -> dict:
    broker = make_broker(with_store=False)
    broker.clock, broker.explained = SimulatedClock(NOW), False  # the quote alone: no alternatives, no refusal search
    rows = []
    with Progress(transient=True) as progress:
        task = progress.add_task("quotes", total=len(SWEPT) * steps)
        for name in SWEPT:
            unit_h = fastest_on_demand_h(broker, load_spec(examples / name, NOW))
            for i in range(steps):
                multiple = 1.0 + 0.25 * i
                deadline = (NOW + timedelta(hours=unit_h * multiple)).strftime("%Y-%m-%dT%H:%MZ")
                spec = load_spec(examples / name, NOW, deadline=deadline)
                row = {"example": name, "deadline_x": multiple, "deadline_h": round(unit_h * multiple, 2)}
                try:
                    quote = broker.quote(spec)
                except InfeasibleError:
                    rows.append({**row, "refused": True})
                else:
                    f = quote.forecast
                    rows.append(
                        {
                            **row,
                            "refused": False,
                            "tier": quote.chosen.offer.tier.value,
                            "gpu": quote.chosen.offer.accelerator,
                            "p_meet_deadline": f.p_meet_deadline,
                            "asked": spec.deadline_probability,
                            "cost_p50_usd": f.cost_p50_usd,
                            "short_of_odds": quote.short_of_odds,
                            "over_budget": quote.over_budget,
                        }
                    )
                progress.advance(task)
    quoted = [r for r in rows if not r["refused"]]
    return {
        "quotes": len(quoted),
        "refused": len(rows) - len(quoted),
        "short_of_odds": sum(r["short_of_odds"] for r in quoted),
        "over_budget": sum(r["over_budget"] for r in quoted),
        "mean_cost_p50_usd": round(sum(r["cost_p50_usd"] for r in quoted) / max(len(quoted), 1), 2),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=Path, default=Path(__file__).resolve().parents[1] / "examples")
    parser.add_argument("--steps", type=int, default=13)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = sweep(args.examples, args.steps)
    if args.json:
        print(json.dumps(result))
        return
    console = Console()
    for r in result["rows"]:
        console.print(r)
    console.print({k: v for k, v in result.items() if k != "rows"})


if __name__ == "__main__":
    main()
