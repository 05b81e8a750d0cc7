"""The long-running parts: `broker server`, `broker agent`, `broker dashboard`, and `broker stop`."""

from __future__ import annotations

from pathlib import Path

import typer

from broker.app.cli.common import (
    MetricsAddressOpt,
    above_zero,
    agent_id_checked,
    err,
    make_broker,
    out,
    redis_url,
    stop_signals_as_ctrl_c,
    store_for,
    user_errors,
)
from broker.app.settings import Settings
from broker.domain.errors import BrokerError
from broker.store import embedded


@user_errors
def stop() -> None:
    """Stop the embedded private redis-server (its data stays on disk)."""
    settings = Settings.from_env()
    if settings.redis_url:
        raise BrokerError("stop: BROKER_REDIS_URL is set; broker only stops the private server it started")
    stopped = embedded.stop(settings.home)
    out.print("stopped private redis-server" if stopped else "no private redis-server running")


@user_errors
def agent(
    agent_id: str = typer.Option(..., "--id", callback=agent_id_checked, help="This agent's unique name."),
    offer_id: str = typer.Option(
        ..., "--offer", help="The offer this instance is (cloud/zone/type/tier, see `broker prices`)."
    ),
    notices: str = typer.Option(
        "none",
        help="Preemption notices: aws, gcp, azure (optionally =URL), trace=PATH[@TICK[@job]] "
        "(@job: replayed from its first job), none.",
    ),
    speedup: float = typer.Option(1.0, callback=above_zero, help="Time compression for trace notices."),
    lease_s: float = typer.Option(
        5.0, callback=above_zero, help="Heartbeat lease; the broker moves the job when it lapses."
    ),
    checkpoints: str | None = typer.Option(None, help="Checkpoint store URL (default BROKER_CHECKPOINTS)."),
    runs: Path | None = typer.Option(None, help="Where job logs and events go (default $BROKER_HOME/runs)."),
    metrics_port: int = typer.Option(0, min=0, max=65535, help="Serve Prometheus metrics on this port (0: off)."),
    metrics_address: str = MetricsAddressOpt,
    token: str | None = typer.Option(
        None, envvar="BROKER_AGENT_TOKEN", help="Registration token (`broker agents token`)."
    ),
    token_file: Path | None = typer.Option(
        None,
        envvar="BROKER_TOKEN_FILE",
        help="Where to keep the token the broker renews for this agent, and read it when it restarts (the later "
        "of it and --token is used).",
    ),
    for_job: str | None = typer.Option(None, help="Run this job alone (`broker run` starts its agents so)."),
) -> None:
    """Run the agent of one instance: take assignments, run jobs, report, checkpoint on notices."""
    import redis

    from broker.agents.agent import Agent
    from broker.agents.checkpoints import CheckpointStore
    from broker.agents.notices import watcher

    settings = Settings.from_env()
    token = kept_token(token, token_file)
    CheckpointStore(checkpoints or settings.checkpoints).ensure_root()  # where its jobs will save, usable here
    try:
        # the newest prices and the hazard with every piece of evidence the store has; as a daemon it rides out a
        # Redis restart (an agent started while Redis was down for a few seconds used to exit at once)
        catalog = make_broker(live=True, daemon=True).catalog
    except redis.exceptions.NoPermissionError:  # an agent's ACL user reads no prices or jobs: the snapshot's offer
        catalog = make_broker(with_store=False).catalog
    try:
        source = watcher(notices, speedup)
    except ValueError as error:
        raise BrokerError(str(error)) from None
    from broker.app.metrics import AgentMetrics, serve

    metrics = AgentMetrics()
    if metrics_port:
        serve(metrics.registry, metrics_port, metrics_address)
    store = store_for(settings, daemon=True)
    from broker.agents.contract import newest_token

    token = newest_token(store, agent_id, token)  # the one it was given (a pool's boot data's, say) may have ended
    if for_job:
        job_to_serve(store, for_job, agent_id)
    worker = Agent(
        store.of_agent(agent_id),
        agent_id,
        catalog.offer(offer_id),
        checkpoints or settings.checkpoints,
        runs or settings.home / "runs",
        notices=source,
        lease_s=lease_s,
        metrics=metrics,
        token=token,
        for_job=for_job,
        token_file=token_file,
    )
    err.print(f"agent {agent_id} ended: {worker.run()}")


def kept_token(token: str | None, token_file: Path | None) -> str | None:
    """The token to register with: the one given, or the one the token file keeps where it admits longer."""
    from broker.agents.tokens import longest, read_file

    if token_file is None:
        return token
    try:
        return longest(token, read_file(token_file))
    except OSError as error:
        raise BrokerError(
            f"--token-file: cannot read {token_file}: {error.strerror}; give a file this user may read"
        ) from None


def job_to_serve(store, job_id: str, agent_id: str) -> None:
    """`--for-job`: a job that exists and has not ended, where this agent's user may read jobs (an agent's ACL user
    may not: then it is taken as given), and an agent id in the job's shard (another shard's server never saw the
    agent, and the job waited). A typo left an agent that took no job, for good."""
    import redis

    from broker.domain.errors import NotFoundError
    from broker.store.shards import agent_id_in, shard_of

    try:
        job = store.get_job(job_id)
    except redis.exceptions.NoPermissionError:
        return
    except NotFoundError:
        raise BrokerError(f"--for-job: no job {job_id!r}; `broker list` shows the ids") from None
    if job.state.terminal:
        raise BrokerError(f"--for-job: {job_id} is already {job.state.value}; nothing to run")
    count, shard = len(store.shards), store.shards.index(store.of_job(job_id))
    if shard_of(agent_id, count) != shard:
        raise BrokerError(
            f"--id: {agent_id} registers in shard {shard_of(agent_id, count)} of {count}, and {job_id} is planned in "
            f"shard {shard}; give --id {agent_id_in(agent_id, shard, count)}"
        )


@user_errors
@stop_signals_as_ctrl_c
def server(
    speedup: float = typer.Option(1.0, callback=above_zero, help="Clock compression (demos and tests)."),
    consumer: str = typer.Option(None, help="This replica's name (consumer group, planning lease); default host-pid."),
    metrics_port: int = typer.Option(9464, min=0, max=65535, help="Serve Prometheus metrics on this port (0: off)."),
    metrics_address: str = MetricsAddressOpt,
    policy: str = typer.Option(
        None, help="Planning policy (see `broker policies`); default BROKER_POLICY, else the servers' last, else hedge."
    ),
    leader_lease_s: float = typer.Option(
        5.0, min=0.1, max=3600.0, help="Planning lease: a standby replica takes over this long after the leader stops."
    ),
    keep_ended_days: float = typer.Option(
        0.0,
        min=0.0,
        max=3650.0,  # inf overflowed: an internal error
        envvar="BROKER_KEEP_ENDED_DAYS",
        help="Forget jobs that ended this many days ago, with their checkpoints (0: keep every job).",
    ),
) -> None:
    """Run the broker's control loop: apply agent reports, reclaim lost agents, dispatch. Run several for
    fail-over: one plans each shard (BROKER_SHARDS, default 1), the others stand by or plan other shards."""
    import os
    import socket
    from datetime import timedelta

    import redis

    from broker.app import wiring
    from broker.core.clock import ScaledClock
    from broker.store.policy import record_policy

    # it records how many shards the clients are to split the store into; its policy decides from its market model
    broker = make_broker(daemon=True, claim=True, policy=policy)
    was = record_policy(broker.store, broker.policy.name)  # the CLIs' quotes simulate the rule it runs
    if was and was != broker.policy.name:
        err.print(f"note: the servers planned with {was}; from now on with {broker.policy.name}", highlight=False)
    from broker.app.metrics import ServerMetrics, serve
    from broker.store.memory import Memory, eviction_problem

    try:
        if problem := eviction_problem(Memory.of(broker.store.redis)):
            err.print(f"[yellow]warning:[/] {problem}", highlight=False)
    except redis.ResponseError:  # a host that answers no INFO: its memory is its own to watch
        pass

    metrics = ServerMetrics(broker.store)
    if metrics_port:
        serve(metrics.registry, metrics_port, metrics_address)
    consumer = consumer or f"server-{socket.gethostname()}-{os.getpid()}"
    keep = timedelta(days=keep_ended_days) if keep_ended_days else None
    loop = wiring.make_replica(broker, consumer, None, ScaledClock(speedup), metrics, leader_lease_s, keep)
    err.print(f"broker server {consumer} running, planning with {broker.policy.name}; Ctrl-C stops it")
    try:
        loop.serve()
    except KeyboardInterrupt:
        loop.stop()  # the other replicas take its shards now, not after a lease
        err.print(f"broker server {consumer} stopped; its planning leases are given up")


@user_errors
def dashboard(
    port: int = typer.Option(8501, min=1, max=65535, help="Port to serve on."),
    address: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default)."),
    backtest_dir: Path | None = typer.Option(
        None, "--backtest", help="A `broker backtest --out` directory for the Backtest page."
    ),
) -> None:
    """Serve the Streamlit dashboard on the live store (read-only)."""
    import os
    import sys

    import broker

    app_path = Path(broker.__file__).resolve().parent.parent / "dashboards" / "app.py"
    if not app_path.exists():
        raise BrokerError(f"dashboard: {app_path} not found; run broker from its source checkout (pip install -e .)")
    if backtest_dir and not backtest_dir.is_dir():
        raise BrokerError(f"backtest: {backtest_dir} is not a directory; give a `broker backtest --out` directory")
    can_listen(address, port)
    settings = Settings.from_env()
    store_for(settings)  # a Redis that cannot be reached is one line here, not a traceback in every page
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
    err.file.flush()
    os.execve(sys.executable, argv, env)  # streamlit in this process: a SIGTERM to it stops the server, no orphan


def can_listen(address: str, port: int) -> None:
    """Bind and let go before Streamlit takes over the process: a port taken or an address not this machine's is
    the user's one-line error here, not Streamlit's traceback (or its "not available" and exit 0) after exec."""
    import socket

    try:
        family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
            probe.bind((address, port))
    except OSError as error:
        raise BrokerError(
            f"dashboard: cannot listen on {address}:{port} ({error.strerror}); "
            "pick a free port with --port, or an address of this machine with --address"
        ) from None
