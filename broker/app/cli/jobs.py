"""`broker submit|list|status|cancel|policies`: a user's jobs and the policies that plan them."""

from __future__ import annotations

from pathlib import Path

import typer

from broker import planning
from broker.app import render
from broker.app.cli.common import (
    JsonOpt,
    make_broker,
    out,
    print_json,
    user_errors,
)
from broker.app.settings import Settings
from broker.domain.model import JobState
from broker.domain.specfile import load_spec


@user_errors
def submit(
    job_file: Path = typer.Argument(..., help="The job spec (YAML)."),
    deadline: str | None = typer.Option(None, help="Overrides the spec: ISO time (2026-12-01T18:00Z) or +36h."),
    budget: float | None = typer.Option(None, help="Overrides the spec: budget in USD."),
    quote_only: bool = typer.Option(False, "--quote", help="Print the quote; store nothing."),
    as_json: bool = JsonOpt,
) -> None:
    """Quote a job and store it (queued); --quote only prices it."""
    broker = make_broker(with_store=not quote_only, live=not quote_only)
    spec = load_spec(job_file, broker.clock.now(), deadline=deadline, budget_usd=budget)
    if quote_only:
        quote, job_id = broker.quote(spec), None
    else:
        job = broker.submit(spec)
        quote, job_id = job.quote, job.id
    if as_json:
        print_json(render.quote_dict(quote, job_id, stored=job_id is not None))
        return
    title = f"job {job_id} queued" if job_id else f"quote for {spec.name} (not stored)"
    out.print(render.quote_table(quote, title))


@user_errors
def list_jobs(
    state: list[JobState] | None = typer.Option(None, help="Only jobs in this state (repeatable)."),
    as_json: bool = JsonOpt,
) -> None:
    """List jobs, oldest first."""
    jobs = make_broker().jobs(set(state) if state else None)
    if as_json:
        print_json([render.job_dict(j) for j in jobs])
    elif not jobs:
        out.print("no jobs yet: run `broker submit examples/finetune-lora.yaml` (or `broker demo`)")
    else:
        out.print(render.jobs_table(jobs))


@user_errors
def status(job_id: str = typer.Argument(..., help="The job id (see `broker list`)."), as_json: bool = JsonOpt) -> None:
    """Show one job: its state, quote and events."""
    broker = make_broker()
    job = broker.get(job_id)
    events = broker.store.events(job_id)
    if as_json:
        print_json(render.job_dict(job, events))
        return
    out.print(f"[bold]{job.id}[/]  state: [bold]{job.state.value}[/]" + (f"  ({job.reason})" if job.reason else ""))
    out.print(render.quote_table(job.quote, f"quote at {job.quote.created_at:%Y-%m-%d %H:%M} UTC"))
    if job.runs:
        out.print(render.runs_table(job))
    for line in job.log_tail:
        out.print(f"  | {line}", highlight=False, markup=False)
    for event in events:
        out.print(f"  {event['at']}  {event['state']:<10} {event['reason']}")


@user_errors
def logs(
    job_id: str = typer.Argument(..., help="The job id (see `broker list`)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new output until the job ends."),
) -> None:
    """The job's output, run by run, as its agents sent it; --follow streams it until the job ends."""
    import time

    broker = make_broker()
    read_to: dict[int, str] = {}  # run's fence -> the newest log entry read
    printed = 0
    while True:
        job = broker.get(job_id)
        ended = job.state.terminal  # read before the output: what was sent before the end is read below
        for run in job.runs:
            if run.fence not in read_to:
                where = f"{run.offer.tier.value} {run.offer.cloud} {run.offer.instance_type}"
                out.print(f"[dim]── run {run.fence} on {run.agent} ({where}), started {render.when(run.started_at)}[/]")
                read_to[run.fence] = "0"
            read_to[run.fence], lines = broker.store.read_log(run.agent, job.id, run.fence, read_to[run.fence])
            for line in lines:
                out.print(line, markup=False, highlight=False, soft_wrap=True)
            printed += len(lines)
        if not follow or ended:
            break
        time.sleep(0.5)
    if not printed:
        why = "it has not run yet" if not job.runs else "its agents sent no output"
        out.print(f"no output from {job.id} ({job.state.value}): {why}")


@user_errors
def cost_report(as_json: bool = JsonOpt) -> None:
    """Spend per job and tier (bubble, spot, on-demand) against what on-demand would have cost, oldest first."""
    from datetime import UTC, datetime

    from broker.models.accounting import cost_report as report

    frame = report(make_broker().jobs(), datetime.now(UTC))
    if as_json:
        print_json(frame.astype(object).where(frame.notna(), None).to_dict(orient="records"))  # NaN is not JSON
    elif frame.empty:
        out.print("no jobs yet: run `broker submit examples/finetune-lora.yaml` (or `broker demo`)")
    else:
        out.print(render.cost_report_table(frame))


@user_errors
def cancel(job_id: str = typer.Argument(..., help="The job id."), as_json: bool = JsonOpt) -> None:
    """Cancel a job that has not finished."""
    job = make_broker().cancel(job_id)
    if as_json:
        print_json(render.job_dict(job))
    else:
        out.print(f"{job.id} cancelled")


@user_errors
def list_policies(as_json: bool = JsonOpt) -> None:
    """The planning policies by name; choose one with BROKER_POLICY or `broker server --policy`."""
    active = Settings.from_env().policy
    rows = [{**row, "active": row["name"] == active} for row in planning.describe()]
    print_json(rows) if as_json else out.print(render.policies_table(rows))
