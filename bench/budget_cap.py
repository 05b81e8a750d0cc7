"""The budget cap (`if_over_budget: stop`, core/budget.py) in the backtest: the ML mix run by one policy with its
budgets as they are (run) and capped (stop), on the same jobs and traces.

The mix's budgets are 1.3 times a job's cost on on-demand at its estimated speed, so a job overruns only when it is
slower than estimated and runs long on on-demand: `--speed-median` below 1 makes the jobs slower than their
estimates (0.7: their on-demand cost is 1.43 times the estimate's). Per trace directory (the market model fitted on
the others, as bench/cost.py) and mode: cost, deadline misses, budgeted jobs, how many spent more than their budget,
the most one spent over it (as a multiple), the jobs the cap stopped, and the dollars spent past budgets.

    python bench/budget_cap.py [--traces ../shared/data/traces] [--seed 0] [--speed-median 0.7] [--jobs 40]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from cost import fit_market, gpu_directories_or_exit  # bench/cost.py, beside this file
from rich.console import Console
from rich.progress import Progress

from broker.domain.figures import spend_usd
from broker.domain.model import IfOverBudget
from broker.planning import DEFAULT_POLICY
from broker.sim import backtest
from broker.sim.calibration import job_rows
from broker.sim.workloads import backtest_workload
from broker.store import embedded


def capped(arrivals: list) -> list:
    """The same jobs, each one with a budget capped."""
    stop = {"if_over_budget": IfOverBudget.stop}
    return [replace(a, spec=a.spec.model_copy(update=stop)) if a.spec.budget_usd else a for a in arrivals]


def figures(outcome, directory: str, mode: str) -> dict:
    budgeted = [j for j in outcome.jobs if j.spec.budget_usd]
    spent = {j.id: spend_usd(j, outcome.end) for j in budgeted}
    over = [j for j in budgeted if spent[j.id] > j.spec.budget_usd + 1e-6]
    return {
        "traces": Path(directory).name,
        "mode": mode,
        "cost_usd": round(outcome.cost_usd(), 2),
        "deadline_misses": sum(not row["met"] for row in job_rows(outcome.jobs, outcome.end)),
        "budgeted": len(budgeted),
        "over_budget": len(over),
        "most_over_budget_x": round(max((spent[j.id] / j.spec.budget_usd for j in budgeted), default=0.0), 3),
        "stopped_by_cap": sum((j.reason or "").startswith("budget spent") for j in outcome.jobs),
        "spent_past_budgets_usd": round(sum(spent[j.id] - j.spec.budget_usd for j in over), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=Path("../shared/data/traces"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--speed-median", type=float, default=0.7)
    parser.add_argument("--policy", default=DEFAULT_POLICY + backtest.BUBBLES)  # the default, with the bubbles
    args = parser.parse_args()
    directories = gpu_directories_or_exit(parser, args.traces)
    rows = []
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("backtests", total=2 * len(directories))
        for directory in directories:
            market, model = fit_market(directory, [d for d in directories if d != directory])
            arrivals = backtest_workload(market, args.seed, args.jobs, speed_median=args.speed_median)
            for mode, jobs in (("run", arrivals), ("stop", capped(arrivals))):
                with embedded.scratch() as url:
                    outcome = backtest.run_policy(args.policy, url, market, jobs, args.seed, model=model)
                rows.append(figures(outcome, directory, mode))
                print(json.dumps(rows[-1]), flush=True)
                progress.advance(task)


if __name__ == "__main__":
    main()
