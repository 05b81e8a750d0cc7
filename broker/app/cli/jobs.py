"""`broker submit|list|status|cancel|policies`: a user's jobs and the policies that plan them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from broker import planning
from broker.app import render, render_costs
from broker.app.cli.common import (
    JsonOpt,
    err,
    make_broker,
    make_store,
    out,
    print_json,
    redis_url,
    stop_signals_as_ctrl_c,
    user_errors,
)
from broker.app.settings import Settings
from broker.domain.errors import BrokerError, NotFoundError
from broker.domain.model import Job, JobSpec, JobState
from broker.domain.specfile import load_spec

if TYPE_CHECKING:
    from broker.core.broker import Broker
    from broker.store.jobs import Store

# a limit past Redis's 64-bit range was a ResponseError from the store: an internal error
JobLimit = typer.Option(50, min=0, max=10**9, help="The newest jobs to show (0 for all).")


@user_errors
def submit(
    job_file: Path = typer.Argument(..., help="The job spec (YAML)."),
    deadline: str | None = typer.Option(
        None, help="Overrides the spec: ISO time (2026-12-01T18:00Z), or from now: +36h, +1d12h, +1w."
    ),
    budget: float | None = typer.Option(None, help="Overrides the spec: budget in USD."),
    quote_only: bool = typer.Option(False, "--quote", help="Print the quote; store nothing."),
    as_json: bool = JsonOpt,
) -> None:
    """Quote a job and store it (queued); --quote only prices it."""
    broker = make_broker(with_store=not quote_only, live=not quote_only)
    spec = load_spec(job_file, broker.clock.now(), deadline=deadline, budget_usd=budget)
    note_data_region(spec, broker)
    waiting = None
    if quote_only:
        quote, job_id = broker.quote(spec), None
    else:
        from broker.core.waiting import waiting_for

        job = broker.submit(spec)
        quote, job_id = job.quote, job.id
        waiting = waiting_for(broker.store, job)  # no server or agent: it would wait, and nothing said so
    if as_json:
        doc = render.quote_dict(quote, job_id, stored=job_id is not None)
        print_json(doc if job_id is None else {**doc, "waiting_for": waiting})
        return
    title = f"job {job_id} queued" if job_id else f"quote for {spec.name} (not stored)"
    out.print(render.quote_table(quote, title))
    if waiting:
        out.print(f"waiting: {waiting}", highlight=False)  # as `broker status` says it


def note_data_region(spec: JobSpec, broker: Broker) -> None:
    """Say (on stderr, beside a JSON document too) when the job's input is where no offer of its cloud is."""
    from broker.models.placement import data_region_note

    if note := data_region_note(spec, broker.catalog.offers):
        err.print(f"[yellow]note:[/] {note}", highlight=False)


@user_errors
def list_jobs(
    state: list[JobState] | None = typer.Option(None, help="Only jobs in this state (repeatable)."),
    limit: int = JobLimit,
    as_json: bool = JsonOpt,
) -> None:
    """List the newest jobs, oldest first."""
    states = set(state) if state else None
    show_jobs(*newest_jobs(make_store(), states, limit), as_json, states)


def newest_jobs(store: Store, states: set[JobState] | None, limit: int) -> tuple[list[Job], int]:
    """The newest `limit` jobs (0: all) in submission order, and how many there are: without a state to match, only
    those are read, and with states, only those and the jobs with a run under way (the other jobs' states are in
    their figures kept beside them: a store keeps every job it ever ran, and may hold a long queue)."""
    from broker.store import figures

    if not states:
        return (store.recent_jobs(limit) if limit else store.list_jobs()), store.job_count()
    if (found := figures.newest_in_states(store, states, limit)) is not None:
        return found
    if any(state.terminal for state in states):  # a store from before the records: its jobs are read
        jobs = store.list_jobs(states)
    else:
        jobs = [job for job in store.unfinished_jobs() if job.state in states]
    return jobs[-limit:] if limit else jobs, len(jobs)


def show_jobs(jobs: list[Job], total: int, as_json: bool, states: set[JobState] | None = None) -> None:
    """The jobs table (`broker list`, and `broker status` without a job), or their JSON."""
    if as_json:
        print_json([render.job_dict(j) for j in jobs])
    elif not jobs and states:  # there may be jobs in other states: "no jobs yet" would send the user to submit one
        out.print(f"no {' or '.join(sorted(s.value for s in states))} jobs; `broker list` shows every state")
    elif not jobs:
        out.print("no jobs yet: run `broker submit examples/finetune-lora.yaml` (or `broker demo`)")
    else:
        out.print(render.jobs_table(jobs, total))


@user_errors
def status(
    job_id: str | None = typer.Argument(
        None, help="The job id, or its start if no other id begins so (see `broker list`); none: every job."
    ),
    as_json: bool = JsonOpt,
    outlook: bool = typer.Option(
        True,
        "--outlook/--no-outlook",
        help="For a job under way: its quote made again from where it stands (about a second: the model is learned).",
    ),
    limit: int = JobLimit,
) -> None:
    """Show one job: its state, quote, outlook and events; without a job, the newest jobs (as `broker list`)."""
    from broker.core.waiting import waiting_for

    store = make_store()
    if job_id is None:
        jobs, total = newest_jobs(store, None, limit)
        show_jobs(jobs, total, as_json)
        if jobs and not as_json:
            out.print("one job's quote, runs and events: `broker status JOB`", highlight=False)
        return
    job_id = store.job_id_for(job_id)
    job = store.get_job(job_id)
    events = store.events(job_id)
    waiting = waiting_for(store, job)
    ahead = make_broker(live=True).outlook(job) if outlook and not job.state.terminal else None
    if as_json:
        dumped = ahead.model_dump(mode="json") if ahead else None
        print_json({**render.job_dict(job, events), "waiting_for": waiting, "outlook": dumped})
        return
    now = datetime.now(UTC)
    out.print(f"[bold]{job.id}[/]  state: [bold]{job.state.value}[/]" + (f"  ({job.reason})" if job.reason else ""))
    out.print(render.job_times(job, now), highlight=False)
    if job.demo_copy:
        out.print("[dim]a copy of a `broker demo` job: its times are on the demo's compressed clock[/]")
    if waiting:
        out.print(f"[yellow]waiting:[/] {waiting}", highlight=False)
    out.print(render.quote_table(job.quote, f"quote at {job.quote.created_at:%Y-%m-%d %H:%M} UTC"))
    if verdict := render_costs.quote_verdict(job, now):
        out.print(verdict, highlight=False)
    if ahead is not None:
        out.print(render.outlook_line(ahead, job.spec.deadline_probability, job.id), highlight=False)
    if job.runs:
        out.print(render.runs_table(job))
        if job.runs[-1].checkpoint_error:  # why its newest save is not one a run can resume from
            out.print(f"[yellow]last save failed:[/] {job.runs[-1].checkpoint_error}", highlight=False)
    if job.log_tail:
        out.print("last output:" if job.state.terminal else "output so far:")
    for line in job.log_tail:
        out.print(f"  | {line}", highlight=False, markup=False)
    for event in events:
        at = datetime.fromisoformat(event["at"])
        out.print(
            f"  {at:%H:%M:%S} ({render.since(at, job, now)})  {event['state']:<10} {event['reason']}", highlight=False
        )


@user_errors
def logs(
    job_id: str = typer.Argument(..., help="The job id, or its start if no other id begins so."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new output until the job ends."),
) -> None:
    """The job's output, run by run, as its agents sent it; --follow streams it until the job ends."""
    import time

    from broker.app.run import LogFollower, StateTeller

    store = make_store()
    job_id = store.job_id_for(job_id)
    follower, teller = LogFollower(store, job_id), StateTeller(store)
    while True:
        job = store.get_job(job_id)
        ended = job.state.terminal  # read before the output: what was sent before the end is read below
        if follow and not ended:
            teller.tell(job, show_output)
        for kind, text in follower.read(job):
            show_output(kind, text)
        if not follow or ended:
            break
        time.sleep(0.5)
    if follow and teller.state is not None:  # followed from before its end: the end too
        show_output("state", teller.said(job))
    if not follower.lines:
        why = "its agents sent no output" if job.runs else "it never ran" if ended else "it has not run yet"
        out.print(f"no output from {job.id} ({job.state.value}): {why}")


def show_output(kind: str, text: str) -> None:
    """A followed job's line: its output as sent, run headers and state changes dimmed."""
    if kind == "out":
        out.print(text, markup=False, highlight=False, soft_wrap=True)
    else:
        out.print(f"[dim]── {text}[/]", highlight=False)


@user_errors
@stop_signals_as_ctrl_c
def run(
    job_file: str = typer.Argument(..., help="The job spec (YAML), or the id of a job not ended to see through."),
    deadline: str | None = typer.Option(
        None, help="Overrides the spec: ISO time (2026-12-01T18:00Z), or from now: +36h, +1d12h, +1w."
    ),
    budget: float | None = typer.Option(None, help="Overrides the spec: budget in USD."),
) -> None:
    """Submit a job and see it through: plan it here (a standby while a `broker server` plans), start a local
    agent for its chosen offer unless an idle registered one fits it, and stream its state and output until it ends.
    Given a job's id instead, see that job through (one left after Ctrl-C, or resumed by `broker amend --budget`)."""
    import contextlib
    import os
    import socket

    import redis

    from broker.agents.checkpoints import CheckpointStore
    from broker.agents.provision import LocalProvisioner
    from broker.app import wiring
    from broker.app.run import fold_exit, run_job
    from broker.models.accounting import savings_pct

    settings = Settings.from_env()
    CheckpointStore(settings.checkpoints).ensure_root()  # its agents save there: said before a job is stored
    broker = make_broker(live=True)
    job = submitted_job(broker, job_file, deadline, budget)
    if job is None:
        spec = load_spec(Path(job_file), broker.clock.now(), deadline=deadline, budget_usd=budget)
        note_data_region(spec, broker)
        job = broker.submit(spec)
        out.print(render.quote_table(job.quote, f"job {job.id} queued"))
    else:
        out.print(f"seeing {job.id} through: {job.state.value}" + (f" ({job.reason})" if job.reason else ""))
    server = wiring.make_server(broker, f"run-{socket.gethostname()}-{os.getpid()}", shard=broker.store.of_job(job.id))
    provisioner = LocalProvisioner(
        redis_url(settings),
        settings.checkpoints,
        settings.home / "runs",
        prefix=settings.prefix,
        shards=len(broker.store.shards),
        agent_secret=settings.agent_secret,
    )
    try:
        job = run_job(broker, server, provisioner, job, show_output)
    except KeyboardInterrupt:
        provisioner.stop_all()  # each agent checkpoints its job and reports the exit, which is folded here
        fold_exit(broker, server, job.id)
        raise BrokerError(
            f"stopped following {job.id}; the agent started here checkpoints its work and leaves, and the job waits "
            f"for a server and an agent (`broker status {job.id}` says which; `broker run {job.id}` takes it up)"
        ) from None
    finally:
        provisioner.stop_all()
        with contextlib.suppress(redis.RedisError):  # Redis away: the lease lapses by itself
            server.resign()  # where it planned (no server did), a server started next plans now, not a lease later
    for agent_id in provisioner.agents:  # stopped after its job ended: not left behind as a lapsed agent
        broker.store.of_job(job.id).remove_agent(agent_id)
    if job.state != JobState.done:
        raise BrokerError(f"{job.id} {job.state.value}: {job.reason or 'no reason recorded'}; `broker logs {job.id}`")
    base = job.on_demand_usd(job.updated_at)
    saved = f", {savings_pct(job.cost_usd, base):.0f}% less than on-demand (${base:.4f})" if base else ""
    out.print(f"{job.id} done: ${job.cost_usd:.4f}{saved}")


def submitted_job(broker: Broker, given: str, deadline: str | None, budget: float | None) -> Job | None:
    """The job not ended that `broker run` is given by its id (or the start of it), or None where `given` is a file
    or names no job (then read as a spec file, with that file's errors). Refused in one line: a job that ended (one
    the budget cap stopped is told how to resume it), and a deadline or budget given with it (amend changes them)."""
    if Path(given).exists():
        return None
    try:
        job = broker.get(broker.store.job_id_for(given))
    except NotFoundError:
        return None
    if deadline is not None or budget is not None:
        raise BrokerError(f"--deadline/--budget: {job.id} is submitted already; `broker amend {job.id}` changes them")
    if job.state.terminal:
        fix = f"; `broker amend {job.id} --budget` with more resumes it" if job.stopped_at_budget else ""
        raise BrokerError(f"job: {job.id} is already {job.state.value}; nothing to run{fix}")
    return job


@user_errors
def cost_report(limit: int = JobLimit, as_json: bool = JsonOpt) -> None:
    """Spend per job and tier (bubble, spot, on-demand) against what on-demand would have cost: the newest jobs,
    oldest first, and the total of every job."""
    from broker.app.ledger import Ledger
    from broker.models.accounting import cost_report as report
    from broker.models.accounting import quote_record

    now = datetime.now(UTC)
    figures = sorted(Ledger(make_store()).figures(now), key=lambda f: f.submitted_at)
    frame = report(figures)
    shown = frame.tail(limit) if limit else frame
    if as_json:
        print_json(shown.astype(object).where(shown.notna(), None).to_dict(orient="records"))  # NaN is not JSON
    elif frame.empty:
        out.print("no jobs yet: run `broker submit examples/finetune-lora.yaml` (or `broker demo`)")
    else:
        out.print(render_costs.cost_report_table(shown, frame))
        if line := render_costs.quote_record_line(quote_record(figures, now)):
            out.print(line)


@user_errors
def cancel(
    job_ids: list[str] = typer.Argument(None, help="Job ids, or their starts where no other id begins so."),
    every: bool = typer.Option(False, "--all", help="Every job that has not ended."),
    yes: bool = typer.Option(False, "--yes", help="With --all: no question asked."),
    as_json: bool = JsonOpt,
) -> None:
    """Cancel jobs that have not finished: the ones named, or with --all every one."""
    if bool(job_ids) == every:
        raise BrokerError("cancel: give job ids, or --all for every job that has not ended (not both)")
    broker = make_broker()
    if job_ids and len(job_ids) == 1:  # one job: its record (--json), or its one-line error
        job = broker.cancel(broker.store.job_id_for(job_ids[0]))
        if as_json:
            print_json(render.job_dict(job))
        else:
            out.print(f"{job.id} cancelled")
        return
    ids = [j.id for j in broker.store.unfinished_jobs()] if every else [broker.store.job_id_for(i) for i in job_ids]
    if every and ids and not yes:
        if as_json:
            raise BrokerError(f"--all: it would cancel {len(ids)} jobs; add --yes (--json asks no question)")
        one = len(ids) == 1
        typer.confirm(
            f"cancel {len(ids)} job{'' if one else 's'} that {'has' if one else 'have'} not ended?", abort=True
        )
    rows, refused = [], 0
    for job_id in ids:  # every id resolved first: a typo cancels nothing
        try:
            job = broker.cancel(job_id)
        except BrokerError as error:  # ended meanwhile, or named already ended
            refused += 1
            rows.append({"id": job_id, "error": str(error)})
            if not as_json:
                err.print(f"[red]error:[/] {error}", highlight=False)
            continue
        rows.append(render.job_dict(job))
        if not as_json:
            out.print(f"{job.id} cancelled")
    if as_json:
        print_json(rows)  # one record a job: its own, or why it was not cancelled
    elif not ids:
        out.print("no job that has not ended: nothing to cancel")
    if refused:
        raise typer.Exit(2)


@user_errors
def amend(
    job_id: str = typer.Argument(..., help="The job id, or its start if no other id begins so."),
    deadline: str | None = typer.Option(None, help="The new deadline: ISO time (2026-12-01T18:00Z), or +36h from now."),
    budget: float | None = typer.Option(None, help="The new budget in USD."),
    as_json: bool = JsonOpt,
) -> None:
    """Give a job that has not ended another deadline or budget: planning, the deadline guard, the budget cap and its
    outlook use them from the next round (its quote stays the one made at submit). A job the budget cap stopped
    resumes from its checkpoint when given a larger budget."""
    broker = make_broker(live=True)
    job_id = broker.store.job_id_for(job_id)
    was = broker.get(job_id).state
    job = broker.amend(job_id, deadline=deadline, budget_usd=budget)
    ahead = broker.outlook(job)  # what the new deadline or budget means: one no future meets was taken in silence
    if as_json:
        print_json({**render.job_dict(job), "outlook": ahead.model_dump(mode="json") if ahead else None})
        return
    said = f"amended and {job.state.value} again ({job.reason})" if job.state != was else "amended"
    out.print(f"{job.id} {said}: {render.job_times(job, datetime.now(UTC))}", highlight=False)
    if ahead is not None:
        out.print(render.outlook_line(ahead, job.spec.deadline_probability, job.id), highlight=False)


@user_errors
def list_policies(as_json: bool = JsonOpt) -> None:
    """The planning policies by name; choose one with `broker server --policy` (the CLIs follow it) or BROKER_POLICY."""
    try:
        active = make_broker().policy.name  # the servers' where BROKER_POLICY is unset
    except BrokerError:  # no store to ask (Redis unreachable): the registry is still worth listing
        active = Settings.from_env().policy or planning.DEFAULT_POLICY
    rows = [{**row, "active": row["name"] == active} for row in planning.describe()]
    print_json(rows) if as_json else out.print(render.policies_table(rows))
