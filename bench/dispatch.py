"""Dispatch benchmark: submit-to-start latency and throughput of the real store, server and agents on loopback.

Agents are the real `Agent` class, one thread and one Redis connection pool each, spread
over `--hosts` processes; the server runs in its own process; all against a private
redis-server (AOF, appendfsync always, as the embedded default runs). Jobs run `true`.
Every job is quoted once up front and stored pre-quoted, so the figures are those of the
dispatch path: store -> server round -> assignment stream -> agent start -> started report.

    python bench/dispatch.py --agents 100 --jobs 5000 --rate 1000 --json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from broker import planning
from broker.agents.agent import Agent
from broker.agents.checkpoints import CheckpointStore
from broker.core.clock import SystemClock
from broker.core.server import BrokerServer
from broker.domain.model import Job, Offer, Tier
from broker.domain.specfile import validate_spec
from broker.pricing.catalog import PriceCatalog
from broker.store import embedded
from broker.store.jobs import Store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=1000.0, help="target submits per second")
    parser.add_argument("--hosts", type=int, default=4, help="processes the agents are spread over")
    parser.add_argument("--submitters", type=int, default=1, help="processes submitting (users), each rate/N")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="broker-bench-"))
    server_info = embedded.ensure(home)
    try:
        print(json.dumps(run(server_info.url, home, args)) if args.json else run(server_info.url, home, args))
    finally:
        embedded.stop(home)


def run(url: str, home: Path, args) -> dict:
    store = Store(url)
    catalog = PriceCatalog.from_snapshot()
    offer = min(
        (o for o in catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1 and o.tier == Tier.on_demand),
        key=lambda o: o.price_usd_per_h,
    )
    clock = SystemClock()
    spec = validate_spec(
        {"name": "bench", "run": ["true"], "resources": {"accelerators": ["L4:1"]}, "work": {"gpu_hours": 0.01}},
        clock.now(),
    )
    quote = planning.get().quote(spec, [offer], clock.now())

    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    ids = [f"a{i:04d}" for i in range(args.agents)]
    hosts = [
        ctx.Process(target=agent_host, args=(url, str(home), offer.model_dump_json(), ids[h :: args.hosts], stop))
        for h in range(args.hosts)
    ]
    hosts.append(ctx.Process(target=server_host, args=(url, str(home), stop)))
    for proc in hosts:
        proc.start()
    deadline = time.time() + 120
    while not all(store.lease_alive(i) for i in ids):
        if time.time() > deadline:
            raise SystemExit("agents did not register within 120 s")
        time.sleep(0.2)

    t0 = time.time() + 1.0  # the submitters start together, after they are spawned
    submitters = [
        ctx.Process(target=submit_host, args=(url, spec.model_dump_json(), quote.model_dump_json(), n, args, t0))
        for n in range(args.submitters)
    ]
    for proc in submitters:
        proc.start()
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("submitting", total=args.jobs)
        while any(p.is_alive() for p in submitters):
            bar.update(task, completed=store.redis.zcard("broker:jobs"))
            time.sleep(0.2)
        submit_s = float(store.redis.get("bench:submit-end")) - t0
        task = bar.add_task("waiting for every job to start", total=args.jobs)
        started: dict[str, float] = {}
        last_id, deadline = "0", time.time() + args.timeout
        while len(started) < args.jobs and time.time() < deadline:
            for entry_id, fields in store.redis.xrange(
                "broker:agent-events", min=f"({last_id}" if last_id != "0" else "-", count=5000
            ):
                last_id = entry_id
                if fields["type"] == "started":
                    started.setdefault(fields["job"], json.loads(fields["data"])["at"])
            bar.update(task, completed=len(started))
            time.sleep(0.2)
    all_started_s = max(started.values()) - t0 if started else None
    stop.set()
    for proc in hosts:
        proc.join(timeout=10)
        if proc.exitcode is None:
            proc.kill()

    submitted = {j.id: j.submitted_at.timestamp() for j in store.list_jobs()}
    latencies = sorted((started[j] - submitted[j]) * 1000 for j in started)
    return {
        "agents": args.agents,
        "jobs": args.jobs,
        "submits_per_s": round(args.jobs / submit_s, 1),
        "p50_ms": round(statistics.median(latencies), 1) if latencies else None,
        "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))], 1) if latencies else None,
        "started": len(started),
        "starts_per_s": round(len(started) / all_started_s, 1) if all_started_s else None,
        "hosts": args.hosts,
        "submitters": args.submitters,
        "replicas": 1,  # one server plans (replicas stand by; planning is not sharded yet)
        "cluster_nodes": 0,  # a single redis-server, not a Redis Cluster
    }


def submit_host(url: str, spec_json: str, quote_json: str, n: int, args, t0: float) -> None:
    """One user's client: submits jobs n, n + N, ... of the run at rate/N, each stored pre-quoted."""
    from broker.domain.model import JobSpec, Quote

    store, spec, quote = Store(url), JobSpec.model_validate_json(spec_json), Quote.model_validate_json(quote_json)
    rate = args.rate / args.submitters
    for k, i in enumerate(range(n, args.jobs, args.submitters)):
        if (wait := t0 + k / rate - time.time()) > 0:
            time.sleep(wait)
        now = datetime.now(UTC)
        store.add_job(Job(id=f"bench-{i:06d}", spec=spec, submitted_at=now, updated_at=now, quote=quote))
    store.redis.set("bench:submit-end", repr(time.time()))  # the last submitter to finish writes last


def agent_host(url: str, home: str, offer_json: str, ids: list[str], stop) -> None:
    """One machine's worth of agents: a thread and a store connection each."""
    offer = Offer.model_validate_json(offer_json)

    def loop(agent: Agent) -> None:
        agent.register()
        while not stop.is_set():
            agent.step(block_ms=50)

    agents = [
        Agent(Store(url), i, offer, f"{home}/ckpt", Path(home) / "runs", heartbeat_s=1.0, lease_s=30.0) for i in ids
    ]
    threads = [threading.Thread(target=loop, args=(a,), daemon=True) for a in agents]
    for t in threads:
        t.start()
    stop.wait()


def server_host(url: str, home: str, stop) -> None:
    """The broker server's control loop."""
    server = BrokerServer(Store(url), planning.get(), SystemClock(), CheckpointStore(f"{home}/ckpt"), lease_s=30.0)
    while not stop.is_set():
        server.round(block_ms=5)


if __name__ == "__main__":
    sys.exit(main())
