"""Forecast benchmark: are quotes true? Quotes made on a market model learned from some traces, checked against
what the jobs really cost and when they really finished in backtests on other traces.

For every shared trace directory that maps to GPU offers (the p3.2xlarge ones) and every seed, one backtest
of the ML mix: the market model is fitted on all the *other* GPU trace directories (leave one out: the
evaluated traces are never seen by the model), each policy's quotes carry a forecast (1,000 futures of
that model, run by the policy's rule), and the simulated world takes its truth from the evaluated traces
and from each job's true speed (off the planner's estimate by a log-normal factor no policy sees). Each
(directory, seed) draws its own jobs (workload seed: seed x directories + the directory's index): whether a job
meets its deadline rests mostly on its window and true speed, so the same jobs in every market would count each
job's outcome once per market, and the reliability bins would hold a quarter as many independent jobs as they show.

Prints one JSON object: `jobs`, the quote figures pooled over every job of the forecasting policies
(`median_abs_cost_error_pct`, `p90_abs_cost_error_pct` of |realised / quoted p50 - 1| over the jobs quoted a cost;
`median_abs_cost_error_warm_pct` over those quoted WARM_H or more after their backtest's first job, `warm_jobs` of
them: a backtest starts with a broker that has seen no job come, and its first quotes expect no contention;
`quoted_free_jobs`, quoted $0 (a bubble), and `quoted_free_but_paid`, those of them that cost something after all;
`calibration_max_gap_pts` of the reliability diagram of P(meet) in 10-point bins with >= 20 jobs,
`calibration_mean_gap_pts` (the bins' gaps weighted by jobs), `calibration_max_gap_if_calibrated_pts` (median and
90th percentile of the largest gap that true odds would show on the same quotes: the figure's noise floor, with one
job's rows under the pooled policies meeting or missing together, as they mostly do: the floor's high end) and
`calibration_max_gap_if_calibrated_rows_apart_pts` (every row drawn on its own, as before 2026-11-27: its low end),
`brier`, `cost_at_or_below_p10_p50_p90`: the share of jobs whose realised cost was at most the quoted p10, p50 and
p90, a cost equal to one counted half (true quotes: 0.1, 0.5, 0.9), over the quotes with a spread (p10 < p90; a
quote free in every future is counted in `quoted_free_*`), `median_quoted_spread_pct`: the median over those quotes
of their own futures' median |cost / p50 - 1|, the error a quote makes even when its model is right),
`cost_realised_over_quoted_mean` and `_p50` (the realised costs summed over the quoted means, and over the p50s,
summed: a skewed cost's p50s sum low on right quotes; the mean says whether the quotes are right on average),
`preemptions_realised_over_quoted` (the runs spot took back, summed, over the quotes' futures' means summed), and per
policy (the default, hedge, also with bubbles) the same plus
`savings_pct` (vs all on-demand in the same backtests), `deadline_misses`, `avoidable_misses` (those of them that
all on-demand met: the others the job's true speed lost whatever the policy), `hours_late` (summed past the
deadlines), and `cost_vs_joint_omniscient` (null here: `broker backtest` with omniscient reports it); and the seconds
a quote with its forecast takes (`quote_seconds`).

`outlook` (pooled, and per policy): the same quote figures for each job's outlook (Broker.outlook: the quote made
again from where the job stands, taken once in the first tick its speed is measured), with `window_gone_median`, the
median share of the jobs' windows gone when it was made: what a user who looks again once the job has run learns.

`--warm`: each backtest's broker starts with a history (sim/history.py), as a live one has after its first day:
the jobs of another workload (seed sim/history.SEED_OFFSET + the workload's) run on on-demand over one of the fit
directories (by seed), finished before the evaluated backtest starts; its fleet learns their speeds (`history_from`).

    python bench/forecast.py [--traces ../shared/data/traces] [--jobs 40] [--seeds 0 1 2] [--workers 2] [--warm]
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta

import numpy as np
from cost import (  # bench/cost.py, beside this file
    avoidable_misses,
    backtests_parser,
    fit_market,
    gpu_directories_or_exit,
    history_jobs,
    missed_jobs,
)
from rich.console import Console
from rich.progress import Progress

from broker import planning
from broker.core.broker import Broker
from broker.core.clock import SimulatedClock
from broker.sim import backtest
from broker.sim.calibration import cost_coverage, cost_errors_pct, job_rows, preemptions_over_quoted, reliability
from broker.sim.market import OfferBook
from broker.sim.workloads import backtest_workload
from broker.store import embedded

POLICIES = ["on-demand", "uniform-progress", "cbl-greedy", "costslo", "hedge", "hedge+bubbles"]
# pooled as before (on-demand is certain); hedge and the default with bubbles per policy
FORECASTING = ["uniform-progress", "cbl-greedy", "costslo"]
WARM_H = 24.0  # quotes made this long after a backtest's first job: `median_abs_cost_error_warm_pct`


def one(directory: str, fit: list[str], seed: int, jobs: int, workload: int, warm: bool = False) -> dict:
    """One backtest on `directory` with quotes forecast on a model fitted on `fit`, of the jobs workload seed
    `workload` draws; per policy its row and jobs. `warm`: each policy's broker starts with a history (sim/history.py),
    the jobs of another workload run on on-demand over a fit directory's traces."""
    market, model = fit_market(directory, fit)
    arrivals = backtest_workload(market, workload, jobs)
    with embedded.scratch() as url:
        history, source = history_jobs(fit, seed, jobs, workload, market.start, url) if warm else ([], None)
        result = backtest.run(
            market, arrivals, POLICIES, seed, url, model=model, outlooks_for=tuple(POLICIES), history=history
        )
    return {
        "traces": directory,
        "fit_on": fit,
        "history_from": source,
        "seed": seed,
        "workload_seed": workload,
        "rows": result.rows,
        "jobs": {o.policy: with_case(job_rows(o.jobs, o.end), directory, seed) for o in result.outcomes},
        "outlooks": {
            o.policy: with_case(job_rows(o.jobs, o.end, o.outlooks), directory, seed) for o in result.outcomes
        },
        "missed": missed_jobs(result.outcomes),
    }


def with_case(rows: list[dict], directory: str, seed: int) -> list[dict]:
    """The rows, each naming its job in its backtest (`case`): pooled over policies, one job's rows are one case."""
    return [r | {"case": f"{directory}:{seed}:{r['job']}"} for r in rows]


def figures(rows: list[dict]) -> dict:
    median, p90 = cost_errors_pct(rows)
    warm = [r for r in rows if r["quoted_after_h"] >= WARM_H]
    calibration = reliability(rows)
    apart = reliability([{k: v for k, v in r.items() if k != "case"} for r in rows])
    return {
        "jobs": len(rows),
        "median_abs_cost_error_pct": median,
        "p90_abs_cost_error_pct": p90,
        # the quotes made once the broker had seen WARM_H of arrivals: the first are made with no rate of jobs to
        # come, so they count on no contention (a cold start a live broker has once, each backtest has once)
        "median_abs_cost_error_warm_pct": cost_errors_pct(warm)[0],
        "warm_jobs": len(warm),
        # quoted free (a bubble): no ratio to take, so counted apart, with those that cost something after all
        "quoted_free_jobs": sum(1 for r in rows if r["quoted_cost_usd"] <= 0),
        "quoted_free_but_paid": sum(1 for r in rows if r["quoted_cost_usd"] <= 0 and r["cost_usd"] > 0.005),
        **cost_coverage(rows),
        "preemptions_realised_over_quoted": preemptions_over_quoted(rows),
        "calibration_max_gap_pts": calibration["calibration_max_gap_pts"],
        "calibration_mean_gap_pts": calibration["calibration_mean_gap_pts"],
        "calibration_max_gap_if_calibrated_pts": calibration["calibration_max_gap_if_calibrated_pts"],
        "calibration_max_gap_if_calibrated_rows_apart_pts": apart["calibration_max_gap_if_calibrated_pts"],
        "brier": calibration["brier"],
        "reliability": calibration["bins"],
    }


def outlook_figures(rows: list[dict]) -> dict:
    gone = [r["window_gone"] for r in rows if r.get("window_gone") is not None]
    return {**figures(rows), "window_gone_median": round(float(np.median(gone)), 4) if gone else None}


def aggregate(runs: list[dict]) -> dict:
    od = sum(row["cost_usd"] for r in runs for row in r["rows"] if row["policy"] == "on-demand")
    policies = {}
    for policy in POLICIES:
        rows = [row for r in runs for row in r["rows"] if row["policy"] == policy]
        cost = sum(row["cost_usd"] for row in rows)
        policies[policy] = {
            "cost_usd": round(cost, 2),
            "savings_pct": round(100 * (1 - cost / od), 1) if od else None,
            "deadline_misses": sum(row["deadline_misses"] for row in rows),
            "avoidable_misses": avoidable_misses(runs, policy),
            "hours_late": round(sum(row["hours_late"] for row in rows), 1),
            "cost_vs_joint_omniscient": None,
            **figures([j for r in runs for j in r["jobs"].get(policy, [])]),
            "outlook": outlook_figures([j for r in runs for j in r["outlooks"].get(policy, [])]),
        }
    pooled = figures([j for r in runs for p in FORECASTING for j in r["jobs"].get(p, [])])
    outlook = outlook_figures([j for r in runs for p in FORECASTING for j in r["outlooks"].get(p, [])])
    return {**pooled, "outlook": outlook, "policies": policies}


def quote_seconds(directory: str, fit: list[str], jobs: int) -> dict:
    """Seconds per quote with its forecast (1,000 futures), costslo, over one workload's jobs."""
    market, model = fit_market(directory, fit)
    clock = SimulatedClock(market.start)
    broker = Broker(None, OfferBook(market.offers()), planning.get("costslo"), clock, model)
    seconds = []
    for arrival in backtest_workload(market, 0, jobs):
        spec = arrival.spec.model_copy(update={"deadline": clock.now() + timedelta(hours=arrival.window_h)})
        began = time.perf_counter()
        broker.quote(spec)
        seconds.append(time.perf_counter() - began)
    return {"quotes": len(seconds), "mean_s": round(sum(seconds) / len(seconds), 3), "max_s": round(max(seconds), 3)}


def main() -> None:
    parser = backtests_parser(__doc__.splitlines()[0])
    parser.add_argument("--warm", action="store_true", help="each broker starts with a history of finished jobs")
    args = parser.parse_args()
    directories = gpu_directories_or_exit(parser, args.traces)
    tasks = [
        (d, [f for f in directories if f != d], s, args.jobs, s * len(directories) + i, args.warm)
        for i, d in enumerate(directories)
        for s in args.seeds
    ]
    runs = []
    with Progress(console=Console(stderr=True)) as bar, ProcessPoolExecutor(args.workers) as pool:
        task = bar.add_task("backtests", total=len(tasks))
        for run in pool.map(one, *zip(*tasks)):
            runs.append(run)
            bar.advance(task)
    body = {
        "seeds": args.seeds,
        "jobs_per_run": args.jobs,
        "split": "leave one trace directory out: each is evaluated with the model fitted on the others",
        "warm": args.warm,
        **aggregate(runs),
        "quote_seconds": quote_seconds(tasks[0][0], tasks[0][1], args.jobs),
        "runs": [
            {
                **{k: r[k] for k in ("traces", "fit_on", "history_from", "seed", "workload_seed", "rows")},
                "median_abs_cost_error_pct": cost_errors_pct([j for p in FORECASTING for j in r["jobs"].get(p, [])])[0],
            }
            for r in runs
        ],
    }
    print(json.dumps(body, indent=1))


if __name__ == "__main__":
    main()
