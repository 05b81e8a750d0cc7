"""Cost benchmark: every policy over every shared trace directory that maps to GPU offers, 3 seeds each.

Each (directory, seed) is one `broker backtest` (the ML mix of --jobs jobs arriving over 48 h, bubbles
from the two FreeRide-like main jobs, the omniscient bound per job), with the market model that quotes and
the hedge policy decide from fitted on the *other* GPU trace directories (leave one out, as bench/forecast.py
does: the evaluated traces are never seen by the model). The summary adds the runs up per
policy: total cost, savings against all on-demand, deadline misses (and the avoidable ones: jobs all on-demand met in
the same backtest) and hours late, cost / omniscient (per job, the joint bound, and the joint offline schedule:
`joint_schedule_vs_joint_bound` says how far above the bound the joint optimum can lie), migrations, work lost and
the mean quote error, and checks the issue's goals. With `--idle-first`, pools that shrink take their idle
instances first (the bounds' world, where a pool's instances are interchangeable): the difference from a run without
it is what the random victims of the traces' shrinking pools cost each policy. A spot instance taken back gives its
cloud's notice and the agents checkpoint on it (as live agents do); with `--no-notices` a preemption loses the work
since the newest periodic checkpoint instead (the world before 2026-11-26). `--if-late extend` (or `soonest`) gives
every job of the mix that spec choice instead of its default, `cheapest`.
`--warm`: each broker starts with a history (sim/history.py), as a live one has after its first day: another
workload's jobs (seed sim/history.SEED_OFFSET + the run's) run on on-demand over one of the fit directories (by seed),
finished before the evaluated backtest starts.

    python bench/cost.py --json [--traces ../shared/data/traces] [--jobs 40] [--seeds 0 1 2] [--workers 2]
        [--idle-first] [--no-notices] [--if-late cheapest|soonest|extend] [--warm]
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from broker.domain.errors import BrokerError
from broker.domain.model import IfLate
from broker.planning import DEFAULT_POLICY
from broker.pricing.availability import MarketModel
from broker.pricing.traces import load_traces
from broker.sim import backtest
from broker.sim.calibration import job_rows
from broker.sim.history import SEED_OFFSET, on_demand_history
from broker.sim.market import Market, backtest_market
from broker.sim.workloads import backtest_workload
from broker.store import embedded

POLICIES = [*backtest.DEFAULT_POLICIES, backtest.OMNISCIENT]
SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"  # the benches' --traces


def leaf_directories(root: Path) -> list[Path]:
    return sorted({p.parent for p in root.glob("**/*.json")})


def gpu_directories(root: Path) -> list[Path]:
    """Trace directories whose traces map to GPU offers (the backtest skips the others)."""
    out = []
    for directory in leaf_directories(root):
        try:
            backtest_market(directory)
        except BrokerError:
            continue
        out.append(directory)
    return out


def gpu_directories_or_exit(parser: argparse.ArgumentParser, root: Path) -> list[str]:
    """gpu_directories, or the one-line error when fewer than two are found (leave one out fits on another)."""
    found = [str(d) for d in gpu_directories(root)]
    if len(found) < 2:
        parser.error(f"--traces {root}: {len(found)} trace directories map to GPU offers, 2 needed")
    return found


def fit_market(directory: str, fit: list[str]) -> tuple[Market, MarketModel]:
    """The backtest's market on `directory` and the market model, both learned from the traces of `fit` only (the
    offers' hazard too), read once."""
    traces = [t for d in fit for t in load_traces(Path(d))]
    market = backtest_market(Path(directory), hazard_from=traces)
    return market, MarketModel.fit(traces, market.tick_s)


def history_jobs(fit: list[str], seed: int, jobs: int, workload: int, before: datetime, url: str) -> tuple[list, str]:
    """A warm broker's history: another workload's jobs (seed SEED_OFFSET + `workload`, drawn as the evaluated
    ones are) run on on-demand over one of the fit directories (by seed), moved to end before `before`; and which."""
    directory = fit[seed % len(fit)]
    market, _ = fit_market(directory, fit)
    arrivals = backtest_workload(market, SEED_OFFSET + workload, jobs)
    return on_demand_history(market, arrivals, url, seed, before), directory


def one(
    directory: str,
    seed: int,
    jobs: int,
    fit: list[str],
    idle_first: bool = False,
    notices: bool = True,
    repeats: float = 0.0,
    if_late: IfLate | None = None,
    warm: bool = False,
) -> dict:
    """One backtest, its market model fitted on `fit`; its rows, or why the directory has no GPU offers. `warm`: its
    brokers start with a history (history_jobs)."""
    try:
        market, model = fit_market(directory, fit)
        market = replace(market, idle_first=idle_first, notices=notices)
    except BrokerError as err:
        return {"traces": directory, "seed": seed, "skipped": str(err)}
    arrivals = backtest_workload(market, seed, jobs, repeats=repeats)
    if if_late is not None:
        arrivals = [replace(a, spec=a.spec.model_copy(update={"if_late": if_late})) for a in arrivals]
    with embedded.scratch() as url:
        history = history_jobs(fit, seed, jobs, seed, market.start, url)[0] if warm else []
        result = backtest.run(market, arrivals, POLICIES, seed, url, model=model, history=history)
    bound_status = sorted({b.status for b in result.bound.values()})
    missed = missed_jobs(result.outcomes)
    return {"traces": directory, "seed": seed, "rows": result.rows, "bound_status": bound_status, "missed": missed}


def missed_jobs(outcomes) -> dict[str, list[str]]:
    """Per policy, the jobs that missed their deadline (late or unfinished)."""
    return {o.policy: [row["job"] for row in job_rows(o.jobs, o.end) if not row["met"]] for o in outcomes}


def avoidable_misses(runs: list[dict], policy: str) -> int:
    """The policy's misses of jobs that all on-demand met in the same backtest: the others the job's true speed
    lost whatever the policy."""
    return sum(len(set(r["missed"].get(policy, [])) - set(r["missed"].get("on-demand", []))) for r in runs)


def aggregate(runs: list[dict]) -> list[dict]:
    """Per policy over all runs: sums, and ratios of sums."""
    done = [r for r in runs if "rows" in r]
    out = []
    for policy in POLICIES:
        rows = [row for r in done for row in r["rows"] if row["policy"] == policy]
        od = sum(row["cost_usd"] for r in done for row in r["rows"] if row["policy"] == "on-demand")
        best = sum(row["cost_usd"] for r in done for row in r["rows"] if row["policy"] == backtest.OMNISCIENT)
        cost = sum(row["cost_usd"] for row in rows)
        # on the jobs each joint bound covers (those some schedule meets): a run's ratio times its bound, pooled
        joint = [(_cost(r, backtest.JOINT), _cost(r, policy, "cost_vs_joint_omniscient")) for r in done]
        joint_usd = sum(bound for bound, _ in joint)
        schedule = [(_cost(r, backtest.SCHEDULE), _cost(r, policy, "cost_vs_joint_schedule")) for r in done]
        schedule_usd = sum(usd for usd, _ in schedule)
        errors = [row["median_abs_cost_error_pct"] for row in rows if row["median_abs_cost_error_pct"] is not None]
        out.append(
            {
                "policy": policy,
                "cost_usd": round(cost, 2),
                "savings_pct": round(100 * (1 - cost / od), 1),
                "deadline_misses": sum(row["deadline_misses"] for row in rows),
                "avoidable_misses": avoidable_misses(done, policy),
                "hours_late": round(sum(row["hours_late"] for row in rows), 1),
                "cost_vs_omniscient": round(cost / best, 3),
                "cost_vs_joint_omniscient": round(sum(b * x for b, x in joint) / joint_usd, 3) if joint_usd else None,
                "cost_vs_joint_schedule": round(sum(u * x for u, x in schedule) / schedule_usd, 3)
                if schedule_usd
                else None,
                "migrations": sum(row["migrations"] for row in rows),
                "work_lost_h": round(sum(row["work_lost_h"] for row in rows), 1),
                "median_abs_cost_error_pct": round(float(np.median(errors)), 1) if errors else None,
            }
        )
    return out


def schedule_vs_bound(runs: list[dict]) -> float | None:
    """The offline schedules' cost over the joint bounds', pooled: how far from the bound the joint optimum can be."""
    done = [r for r in runs if "rows" in r]
    bound = sum(_cost(r, backtest.JOINT) for r in done)
    return round(sum(_cost(r, backtest.SCHEDULE) for r in done) / bound, 3) if bound else None


def _cost(run: dict, policy: str, key: str = "cost_usd") -> float:
    """A figure of one policy's row in one run (0 when it has none)."""
    return next((row[key] or 0.0 for row in run["rows"] if row["policy"] == policy), 0.0)


def goals(table: list[dict]) -> dict:
    by = {row["policy"]: row for row in table}
    broker, up = by[f"{DEFAULT_POLICY}+bubbles"], by["uniform-progress"]
    return {
        "broker_vs_omniscient_le_1.10": broker["cost_vs_omniscient"] <= 1.10,
        "broker_misses_0": broker["deadline_misses"] == 0,
        "broker_le_0.85x_uniform_progress": broker["cost_usd"] <= 0.85 * up["cost_usd"],
        "broker_savings_ge_60pct": broker["savings_pct"] >= 60,
        "broker_vs_uniform_progress": round(broker["cost_usd"] / up["cost_usd"], 3),
    }


def backtests_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every leave-one-out bench over the shared traces takes (this one and bench/forecast.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--traces", type=Path, default=SHARED_TRACES)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2)
    return parser


def main() -> None:
    parser = backtests_parser(__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--idle-first", action="store_true", help="shrinking pools take idle instances first")
    parser.add_argument(
        "--no-notices", action="store_true", help="no preemption notice: the work since the checkpoint is lost"
    )
    parser.add_argument("--repeats", type=float, default=0.0, help="share of jobs that are an earlier one run again")
    parser.add_argument("--if-late", choices=[i.value for i in IfLate], help="every job's if_late (default: its own)")
    parser.add_argument("--warm", action="store_true", help="each broker starts with a history of finished jobs")
    args = parser.parse_args()
    gpu = gpu_directories_or_exit(parser, args.traces)
    tasks = [(str(d), s, [f for f in gpu if f != str(d)]) for d in leaf_directories(args.traces) for s in args.seeds]
    console = Console(stderr=True)
    runs = []
    with Progress(console=console) as bar, ProcessPoolExecutor(args.workers) as pool:
        task = bar.add_task("backtests", total=len(tasks))
        directories, seeds, fits = zip(*tasks)
        flags = [args.idle_first] * len(tasks), [not args.no_notices] * len(tasks), [args.repeats] * len(tasks)
        flags += ([IfLate(args.if_late) if args.if_late else None] * len(tasks),)
        flags += ([args.warm] * len(tasks),)
        for run in pool.map(one, directories, seeds, [args.jobs] * len(tasks), fits, *flags):
            runs.append(run)
            bar.advance(task)
    table = aggregate(runs)
    body = {
        "jobs_per_run": args.jobs,
        "seeds": args.seeds,
        "idle_first": args.idle_first,
        "notices": not args.no_notices,
        "repeats": args.repeats,
        "if_late": args.if_late,
        "warm": args.warm,
    }
    body["policies"] = table
    body["goals"] = goals(table)
    body["joint_schedule_vs_joint_bound"] = schedule_vs_bound(runs)
    body["runs"] = runs
    if args.json:
        print(json.dumps(body, indent=1))
        return
    view = Table(title=f"{len([r for r in runs if 'rows' in r])} backtests of {args.jobs} jobs")
    for column in table[0]:
        view.add_column(column)
    for row in table:
        view.add_row(*(str(v) for v in row.values()))
    Console().print(view)
    Console().print(body["goals"])


if __name__ == "__main__":
    main()
