"""The `broker` command: parse, call the core, render. Errors a user can cause exit 2 with one line each."""

from __future__ import annotations

import logging
from datetime import UTC
from pathlib import Path

import redis
import typer
from rich.progress import Progress

from broker import planning
from broker.app import render
from broker.app.cli.acl import acl_app
from broker.app.cli.backtest import backtest_command
from broker.app.cli.common import (
    JsonOpt,
    debug_flag,
    err,
    make_broker,
    out,
    print_json,
    redis_url,
    store_for,
    user_errors,
)
from broker.app.cli.layout import layout_command
from broker.app.cli.prices import prices_app
from broker.app.settings import Settings
from broker.domain.errors import BrokerError, InfeasibleError
from broker.domain.model import JobState, Quote
from broker.domain.specfile import load_spec
from broker.store import embedded

app = typer.Typer(
    help=(
        "Run GPU jobs on the cheapest capacity (pipeline bubbles, spot, on-demand) that meets their "
        "deadline and budget."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(prices_app, name="prices")
app.add_typer(acl_app, name="acl")
app.command("backtest")(backtest_command)
app.command("layout")(layout_command)


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show tracebacks of unexpected errors.")) -> None:
    debug_flag["on"] = debug
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s %(message)s")


@app.command()
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


@app.command("list")
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
        out.print("no jobs yet: run `broker submit examples/finetune-l4.yaml`")
    else:
        out.print(render.jobs_table(jobs))


@app.command()
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


@app.command()
@user_errors
def cancel(job_id: str = typer.Argument(..., help="The job id."), as_json: bool = JsonOpt) -> None:
    """Cancel a job that has not finished."""
    job = make_broker().cancel(job_id)
    if as_json:
        print_json(render.job_dict(job))
    else:
        out.print(f"{job.id} cancelled")


@app.command("policies")
@user_errors
def list_policies(as_json: bool = JsonOpt) -> None:
    """The planning policies by name; choose one with BROKER_POLICY or `broker server --policy`."""
    active = Settings.from_env().policy
    rows = [{**row, "active": row["name"] == active} for row in planning.describe()]
    print_json(rows) if as_json else out.print(render.policies_table(rows))


@app.command()
@user_errors
def demo(
    examples: Path = typer.Option(Path("examples"), help="Directory of example job specs (runnable ones in demo/)."),
    speedup: float = typer.Option(60.0, help="Time compression: simulated seconds per wall-clock second."),
    timeout: float = typer.Option(150.0, help="Give up after this many wall-clock seconds."),
    bubbles: bool = typer.Option(
        False, "--bubbles", help="Instead: a fill job in a real DeepSpeed pipeline's bubbles (about 2 minutes)."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Quote the example jobs, then run the runnable ones end to end: dispatch, preemption, migration."""
    from broker.app.demo import run_demo

    if bubbles:
        return demo_bubbles(examples, max(timeout, 300.0), as_json)

    files = sorted(examples.glob("*.yaml"))
    if not files or not (examples / "demo").is_dir():
        raise BrokerError(
            f"examples: no *.yaml and demo/ in {examples}; run from the project root or pass --examples DIR"
        )
    settings = Settings.from_env()
    broker = make_broker(with_store=False)
    quotes = []
    for path in files:
        spec = load_spec(path, broker.clock.now())
        try:
            quotes.append({"file": str(path), **render.quote_dict(broker.quote(spec), None, False)})
        except InfeasibleError as refusal:
            quotes.append({"file": str(path), "refused": str(refusal)})
    if not as_json:
        for q in quotes:
            if "quote" in q:
                out.print(render.quote_table(Quote.model_validate(q["quote"]), f"{q['file']}: quote"))
            else:
                out.print(f"[bold]{q['file']}[/]: [yellow]refused[/] {q['refused']}\n")
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("running the demo jobs", total=None)

        def show(jobs):
            bar.update(task, description="  ".join(f"{j.spec.name}: {j.state.value}" for j in jobs))

        summary = run_demo(
            redis_url(settings), settings.home, examples, broker.catalog, broker.policy, speedup, timeout, show
        )
    if as_json:
        print_json({"quotes": quotes, **summary})
        return
    out.print(render.run_summary(summary))


def demo_bubbles(examples: Path, timeout: float, as_json: bool) -> None:
    from broker.app.demo_bubbles import run_bubbles_demo

    if not (examples / "bubbles" / "train_gpt.py").exists():
        raise BrokerError(
            f"examples: no bubbles/train_gpt.py in {examples}; run from the project root or pass --examples DIR"
        )
    settings = Settings.from_env()
    broker = make_broker(with_store=False)
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("starting the training job (DeepSpeed, 4 ranks)", total=None)

        def show(job, training):
            run = job.runs[-1] if job.runs else None
            where = f"{run.offer.tier.value}@{run.agent}" if run else "waiting"
            bar.update(
                task,
                description=(
                    f"training {'running' if training else 'ended'}; {job.spec.name}: {job.state.value} {where}"
                ),
            )

        summary = run_bubbles_demo(
            redis_url(settings), settings.home, examples, broker.catalog, broker.policy, timeout, progress=show
        )
    if as_json:
        print_json(summary)
        return
    out.print(render.bubbles_summary(summary))


@app.command()
@user_errors
def stop() -> None:
    """Stop the embedded private redis-server (its data stays on disk)."""
    settings = Settings.from_env()
    if settings.redis_url:
        raise BrokerError("stop: BROKER_REDIS_URL is set; broker only stops the private server it started")
    stopped = embedded.stop(settings.home)
    out.print("stopped private redis-server" if stopped else "no private redis-server running")


@app.command()
@user_errors
def agent(
    agent_id: str = typer.Option(..., "--id", help="This agent's unique name."),
    offer_id: str = typer.Option(
        ..., "--offer", help="The offer this instance is (cloud/zone/type/tier, see `broker prices`)."
    ),
    notices: str = typer.Option(
        "none", help="Preemption notices: aws, gcp, azure (optionally =URL), trace=PATH[@TICK], none."
    ),
    speedup: float = typer.Option(1.0, help="Time compression for trace notices."),
    lease_s: float = typer.Option(5.0, help="Heartbeat lease; the broker moves the job when it lapses."),
    checkpoints: str | None = typer.Option(None, help="Checkpoint store URL (default BROKER_CHECKPOINTS)."),
    runs: Path | None = typer.Option(None, help="Where job logs and events go (default $BROKER_HOME/runs)."),
    metrics_port: int = typer.Option(0, help="Serve Prometheus metrics on this loopback port (0: off)."),
    token: str | None = typer.Option(
        None, envvar="BROKER_AGENT_TOKEN", help="Registration token (`broker agents token`)."
    ),
) -> None:
    """Run the agent of one instance: take assignments, run jobs, report, checkpoint on notices."""
    from broker.agents.agent import Agent
    from broker.agents.notices import watcher

    settings = Settings.from_env()
    try:
        catalog = make_broker(
            live=True
        ).catalog  # the newest prices and the hazard with every piece of evidence the store has
    except redis.exceptions.NoPermissionError:  # an agent's ACL user reads no prices or jobs: the snapshot's offer
        catalog = make_broker(with_store=False).catalog
    try:
        source = watcher(notices, speedup)
    except ValueError as error:
        raise BrokerError(str(error)) from None
    from broker.app.metrics import AgentMetrics, serve

    metrics = AgentMetrics()
    if metrics_port:
        serve(metrics.registry, metrics_port)
    worker = Agent(
        store_for(settings, daemon=True),
        agent_id,
        catalog.offer(offer_id),
        checkpoints or settings.checkpoints,
        runs or settings.home / "runs",
        notices=source,
        lease_s=lease_s,
        metrics=metrics,
        token=token,
    )
    err.print(f"agent {agent_id} ended: {worker.run()}")


@app.command()
@user_errors
def server(
    speedup: float = typer.Option(1.0, help="Clock compression (demos and tests)."),
    consumer: str = typer.Option(None, help="This replica's name (consumer group, planning lease); default host-pid."),
    metrics_port: int = typer.Option(9464, help="Serve Prometheus metrics on this loopback port (0: off)."),
    policy: str = typer.Option(None, help="Planning policy (see `broker policies`); default BROKER_POLICY or costslo."),
    leader_lease_s: float = typer.Option(
        5.0, min=0.1, help="Planning lease: a standby replica takes over this long after the leader stops."
    ),
) -> None:
    """Run the broker's control loop: apply agent reports, reclaim lost agents, dispatch. Run several for
    fail-over: one plans (the lease holder), the others stand by."""
    import os
    import socket

    from broker.agents.checkpoints import CheckpointStore
    from broker.core.clock import ScaledClock
    from broker.core.server import BrokerServer

    settings = Settings.from_env()
    broker = make_broker(daemon=True)
    from broker.app.metrics import ServerMetrics, serve

    metrics = ServerMetrics(broker.store)
    if metrics_port:
        serve(metrics.registry, metrics_port)
    chosen = planning.get(policy, **settings.policy_options()) if policy else broker.policy
    consumer = consumer or f"server-{socket.gethostname()}-{os.getpid()}"
    loop = BrokerServer(
        broker.store,
        chosen,
        ScaledClock(speedup),
        CheckpointStore(settings.checkpoints),
        consumer,
        metrics=metrics,
        agent_secret=settings.agent_secret,
        leader_lease_s=leader_lease_s,
    )
    err.print(f"broker server {consumer} running; Ctrl-C stops it")
    try:
        loop.serve()
    except KeyboardInterrupt:
        pass


@app.command()
@user_errors
def dashboard(
    port: int = typer.Option(8501, help="Port to serve on."),
    address: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default)."),
    backtest_dir: Path | None = typer.Option(
        None, "--backtest", help="A `broker backtest --out` directory for the Backtest page."
    ),
) -> None:
    """Serve the Streamlit dashboard on the live store (read-only)."""
    import os
    import subprocess
    import sys

    import broker

    app_path = Path(broker.__file__).resolve().parent.parent / "dashboards" / "app.py"
    if not app_path.exists():
        raise BrokerError(f"dashboard: {app_path} not found; run broker from its source checkout (pip install -e .)")
    settings = Settings.from_env()
    env = {**os.environ, "BROKER_REDIS_URL": redis_url(settings), "BROKER_PREFIX": settings.prefix}
    if backtest_dir:
        env["BROKER_BACKTEST_DIR"] = str(backtest_dir.resolve())
    argv = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app_path),
        "--server.headless",
        "true",
        "--server.address",
        address,
        "--server.port",
        str(port),
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "viewer",
    ]
    err.print(f"dashboard on http://{address}:{port} (Ctrl-C stops it)")
    try:
        subprocess.run(argv, env=env, check=False)
    except KeyboardInterrupt:
        pass


agents_app = typer.Typer(
    help="Provision agents for the current plan with Terraform (infra/terraform).", no_args_is_help=True
)
app.add_typer(agents_app, name="agents")
POOLS_DIR = Path("infra/terraform/pools")


@agents_app.command("provision")
@user_errors
def agents_provision(
    site: Path = typer.Option(
        ..., help="YAML with per-cloud site values (ami_id, checkpoint_bucket, secret references, redis_url, ...)."
    ),
    plan: bool = typer.Option(
        True, "--plan/--apply", help="--plan writes the Terraform roots; --apply also runs terraform."
    ),
    out: Path = typer.Option(POOLS_DIR, help="Where the pools' Terraform roots go."),
    as_json: bool = JsonOpt,
) -> None:
    """Write <pool>.auto.tfvars.json for each pool of the current plan (pending jobs by chosen offer)."""
    import subprocess

    import yaml

    from broker.agents import terraform

    try:
        site_values = yaml.safe_load(site.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise BrokerError(
            f"site: cannot read {site} ({error}); give a YAML file with aws:, gcp:, azure: sections"
        ) from None
    broker = make_broker()
    pools = terraform.pools_from_jobs(broker.jobs())
    if not pools:
        out_msg = "no pending jobs: nothing to provision (submit jobs first)"
        print_json([]) if as_json else out.print(out_msg)
        return
    written = []
    for pool in pools:
        values = terraform.pool_values(pool, site_values, broker.catalog)
        root = terraform.write_pool(pool, values, out)
        written.append({"pool": pool.name, "offer": pool.offer.id, "count": pool.count, "dir": str(root)})
    binary = terraform.terraform_binary()
    for row in written:
        row["command"] = f"terraform -chdir={row['dir']} init && terraform -chdir={row['dir']} apply"
        if not plan:
            if binary is None:
                raise BrokerError(
                    "terraform: not installed; install Terraform >= 1.5 or OpenTofu, then rerun with "
                    "--apply (or run the printed commands)"
                )
            for step in (["init", "-input=false"], ["apply", "-input=false", "-auto-approve"]):
                if subprocess.run([binary, f"-chdir={row['dir']}", *step]).returncode != 0:
                    raise BrokerError(f"terraform {step[0]} failed for pool {row['pool']}; see its output above")
    if as_json:
        print_json(written)
        return
    for row in written:
        out.print(f"[bold]{row['pool']}[/]: {row['count']} x {row['offer']}\n  {row['command']}")


@agents_app.command("token")
@user_errors
def agents_token(
    agent_id: str = typer.Option(..., "--id", help="The agent the token is for."),
    ttl_hours: float = typer.Option(24.0, help="Hours until the token expires."),
) -> None:
    """Print a registration token for one agent (needs BROKER_AGENT_SECRET, the broker's secret)."""
    from datetime import datetime, timedelta

    from broker.agents.tokens import issue

    settings = Settings.from_env()
    if not settings.agent_secret:
        raise BrokerError("BROKER_AGENT_SECRET: not set; set the broker's secret (the server checks tokens against it)")
    if ttl_hours <= 0:
        raise BrokerError("--ttl-hours: must be > 0")
    typer.echo(issue(settings.agent_secret, agent_id, datetime.now(UTC) + timedelta(hours=ttl_hours)))


@agents_app.command("deprovision")
@user_errors
def agents_deprovision(
    pool: str = typer.Argument(..., help="The pool's name (a directory under --out)."),
    out: Path = typer.Option(POOLS_DIR, help="Where the pools' Terraform roots are."),
) -> None:
    """Destroy a pool's instances with terraform destroy."""
    import subprocess

    from broker.agents import terraform

    root = out / pool
    if not (root / "main.tf.json").exists():
        raise BrokerError(f"pool: no Terraform root at {root}; `ls {out}` shows the pools")
    binary = terraform.terraform_binary()
    command = f"terraform -chdir={root} destroy"
    if binary is None:
        raise BrokerError(
            f"terraform: not installed; install Terraform >= 1.5 or OpenTofu, or run `{command}` where it is"
        )
    if subprocess.run([binary, f"-chdir={root}", "destroy", "-input=false", "-auto-approve"]).returncode != 0:
        raise BrokerError(f"terraform destroy failed for pool {pool}; see its output above")
    out.print(f"pool {pool} destroyed")
