"""`broker backtest`: how much broker would have saved on real spot traces, and whether it would have
missed deadlines, against every baseline and the omniscient bound."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from broker.app import render_figures as figures
from broker.app.cli.common import JsonOpt, err, out, print_json, stop_signals_as_ctrl_c, user_errors
from broker.app.settings import Settings
from broker.domain.errors import BrokerError
from broker.store import embedded


def command(
    traces: Path | None = typer.Option(
        None,
        help="Directory of spot traces (JSON, Can't Be Late format), optionally with offers.yaml; default the "
        "packaged AWS traces.",
    ),
    jobs: int = typer.Option(40, min=1, max=2000, help="Jobs in the seeded ML mix."),
    seed: int = typer.Option(0, min=0, help="Workload seed: the same seed gives the same result."),
    policies: str | None = typer.Option(
        None,
        help="Comma-separated: registered policies, NAME+bubbles, omniscient; default the baselines, "
        "costslo, hedge (each also +bubbles) and omniscient.",
    ),
    out_dir: Path | None = typer.Option(
        None, "--out", help="Write policies.csv, jobs.csv, spend.csv, summary.json and PNG plots here."
    ),
    tick_minutes: float = typer.Option(10.0, min=1.0, max=120.0, help="Simulated tick."),
    spot_instances: int = typer.Option(
        4,
        min=1,
        max=1000,  # 10^12 built as many simulated instances: the command never came back
        help="Instances a trace's peak stands for (a 1-node trace says spot could be had).",
    ),
    arrival_hours: float = typer.Option(48.0, min=0.0, max=8784.0, help="Jobs arrive over this many hours."),
    repeats: float = typer.Option(
        0.0,
        min=0.0,
        max=1.0,
        help="Share of the jobs that are an earlier job run again (same name, within 3% of its speed).",
    ),
    speed_median: float = typer.Option(
        1.0,
        min=0.5,
        max=2.0,
        help="The jobs' true speed over the estimate, median (below 1: the estimates are optimistic); spread 0.15.",
    ),
    profiles: Path | None = typer.Option(
        None, help="Measured bubble profiles (a JSON list of BubbleProfile) instead of the FreeRide-like forecasts."
    ),
    fit_traces: Path | None = typer.Option(
        None,
        help="Trace directory the market model and the offers' preemption hazard are learned from (quotes are "
        "forecast on it); default the packaged traces and the shipped hazard evidence. Give other traces than "
        "--traces to evaluate out of sample.",
    ),
    single_job: bool = typer.Option(
        False,
        "--single-job",
        help="Can't Be Late's setting instead: one 48 h job, deadlines 52 h and 70 h, changeover 0.2 h, started every "
        "--stride-hours over the traces' last half (the market model learns from the first), each zone alone and "
        "all together.",
    ),
    stride_hours: float = typer.Option(
        6.0, min=0.5, max=240.0, help="With --single-job: hours between two windows' starts."
    ),
    warm: bool = typer.Option(
        False,
        "--warm",
        help="Each policy's broker starts as a live one runs after its first day: with --jobs other jobs of the mix "
        "(workload seed + 1000) run on on-demand and finished, whose speeds its quotes learn from.",
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Run the live core on a simulated clock and cloud over real spot traces, for every policy."""
    if single_job:
        if out_dir:
            raise BrokerError("out: --single-job writes no files; drop --out, or use --json for its rows")
        if warm:
            raise BrokerError("warm: --single-job plays one job alone, with no fleet to warm; drop --warm")
        return _single_job(traces, stride_hours, as_json)
    if out_dir:
        _writable(out_dir)
    from broker.pricing.availability import MarketModel
    from broker.pricing.traces import load_traces
    from broker.sim import backtest, results  # here: the simulator's imports would slow every `broker` command
    from broker.sim.history import SEED_OFFSET, on_demand_history
    from broker.sim.market import PACKAGED_TRACES, backtest_market
    from broker.sim.workloads import backtest_workload

    traces = traces or PACKAGED_TRACES
    own_fit = fit_traces is not None  # else the hazard from the shipped evidence, as the live broker has it
    fit_traces = fit_traces or PACKAGED_TRACES
    if not fit_traces.is_dir():
        raise BrokerError(f"fit-traces: {fit_traces} is not a directory; point --fit-traces at trace JSON files")
    fit = load_traces(fit_traces)
    if not fit:  # it fitted the market model on nothing, and the backtest ran on it without a word
        raise BrokerError(f"fit-traces: {fit_traces} has no trace files (*.json); point --fit-traces at some")
    model = MarketModel.fit(fit, tick_minutes * 60)
    policies = policies or ",".join([*backtest.DEFAULT_POLICIES, backtest.OMNISCIENT])
    names = [n.strip() for n in policies.split(",") if n.strip()]
    if not names:
        raise BrokerError("policies: give at least one, e.g. --policies costslo,uniform-progress,omniscient")
    backtest.check_policies(names)
    if not traces.is_dir():
        raise BrokerError(f"traces: {traces} is not a directory; point --traces at a directory of trace JSON files")
    prices_dir = Settings.from_env().prices_dir
    hazard_from = fit if own_fit else None
    market = backtest_market(traces, prices_dir, tick_minutes * 60, spot_instances, profiles, hazard_from)
    arrivals = backtest_workload(market, seed, jobs, arrival_hours, repeats, speed_median)
    setting = {
        "traces": str(traces),
        "fit_traces": str(fit_traces),
        "hazard_from": str(fit_traces) if own_fit else "shipped evidence",
        "jobs": jobs,
        "seed": seed,
        "repeats": repeats,
        "speed_median": speed_median,
        "tick_minutes": tick_minutes,
        "spot_instances": spot_instances,
        "spot_offers": [s.offer.id for s in market.spot],
        "start": market.start.isoformat(),
        "warm": warm,
    }
    for line in market.skipped:
        err.print(f"[yellow]skipped[/] {line}", highlight=False)
    with (
        Progress(
            TextColumn("{task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=as_json,
        ) as bar,
        embedded.scratch() as url,
    ):
        tasks: dict[str, int] = {}

        def progress(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=total)
            bar.update(tasks[name], completed=done)

        history = []
        if warm:  # a live broker's measured jobs (sim/history.py)
            earlier = backtest_workload(market, SEED_OFFSET + seed, jobs, arrival_hours, repeats, speed_median)
            shown = bar.add_task("history (on-demand)", total=None)  # one live display: the bar's
            history = on_demand_history(market, earlier, url, seed, market.start)
            bar.update(shown, total=1, completed=1)
        result = backtest.run(market, arrivals, names, seed, url, progress, setting, model, history=history)
    if out_dir:
        results.write(result, out_dir)
    if as_json:
        print_json({**setting, "policies": result.rows, "skipped": result.skipped})
        return
    title = f"Backtest: {jobs} jobs, seed {seed}, {len(market.spot)} spot offers from {traces}"
    note, optional = figures.BACKTEST_NOTE, figures.BACKTEST_OPTIONAL
    out.print(figures.figures_table(result.rows, figures.BACKTEST_COLUMNS, title, note, optional))
    if out_dir:
        out.print(
            f"wrote {out_dir}/: policies.csv, jobs.csv, spend.csv, summary.json, cost_by_policy.png, "
            "spend_over_time.png, tier_mix.png"
        )


def _writable(directory: Path) -> None:
    """Before the backtest's minutes, not after them: --out must be a directory this user can write."""
    import os

    if directory.exists() and not directory.is_dir():
        raise BrokerError(f"out: {directory} is a file; give a directory (made if missing) for the backtest's files")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise BrokerError(f"out: cannot make {directory} ({error.strerror}); give a directory you can write") from None
    if not os.access(directory, os.W_OK):
        raise BrokerError(f"out: cannot write to {directory}; give a directory you can write")


def _single_job(traces: Path | None, stride_h: float, as_json: bool) -> None:
    from broker.sim import single_job
    from broker.sim.market import PACKAGED_TRACES

    traces = traces or PACKAGED_TRACES
    if not traces.is_dir():
        raise BrokerError(f"traces: {traces} is not a directory; point --traces at a directory of trace JSON files")
    with err.status("playing every rule on every window of the traces"):
        rows = single_job.run(traces, stride_h=stride_h, prices_dir=Settings.from_env().prices_dir)
    if as_json:
        print_json({"traces": str(traces), "rows": rows})
        return
    title = f"Can't Be Late's single job ({single_job.WORK_H:g} h of work) on {traces}"
    note, optional = figures.SINGLE_JOB_NOTE, figures.SINGLE_JOB_OPTIONAL
    out.print(figures.figures_table(rows, figures.SINGLE_JOB_COLUMNS, title, note, optional))


backtest_command = user_errors(stop_signals_as_ctrl_c(command))  # a kill stops its scratch redis-server too
