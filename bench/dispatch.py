"""Dispatch benchmark: submit-to-start latency and throughput of the real store, server and agents on loopback.

Agents are the real `Agent` class, one thread and one Redis connection pool each, spread
over `--hosts` processes; each server replica runs in its own process; all against a private
redis-server (AOF, appendfsync always, as the embedded default runs), or with `--cluster-nodes N`
a private Redis Cluster of N primaries (the same AOF settings). With `--shards S` jobs and agents
are split over S shards (store/shards.py) and `--replicas R` servers share out their planning
(core/replica.py); agent ids are picked so each shard has the same number of agents. Jobs run `true`.
The servers run `broker server`'s own loop (Replica.serve: rounds back to back, an idle one waiting for reports).
Every job is quoted once up front and stored pre-quoted, so the figures are those of the
dispatch path: store -> server round -> assignment stream -> agent start -> started report.
The `cycle_*` keys split an agent's cycle (means, from the streams' ids): with jobs that end at once a queue drains
at about agents / their sum, so they say whether the agents or the servers' rounds bound a drain. The `*_cpu_ms_per_job`
keys say whose CPU a job costs: the server replicas' (their processes' CPU time while serving) and Redis's (INFO cpu
over the timed span, every node, all clients): a replica whose CPU is a small part of its wall time waits on Redis,
and `--fsync everysec` (Redis's AOF written each second, not fsynced at every write) says how much of that is the disk.

    python bench/dispatch.py --agents 100 --jobs 5000 --rate 1000 --json
    python bench/dispatch.py --cluster-nodes 3 --shards 6 --replicas 3 --submitters 3 --json
    python bench/dispatch.py --backlog --jobs 4000 --json   # how fast one replica drains a full queue
    python bench/dispatch.py --backlog --jobs 4000 --fsync everysec --json   # the same without an fsync a write
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from redis.cluster import RedisCluster
from rich.console import Console
from rich.progress import Progress

from broker import planning
from broker.agents.agent import Agent
from broker.app import wiring
from broker.core.clock import SystemClock
from broker.domain.model import Job, Tier
from broker.domain.offer import Offer
from broker.domain.specfile import validate_spec
from broker.pricing.catalog import PriceCatalog
from broker.store import embedded
from broker.store.shards import ShardedStore, connect, shard_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=1000.0, help="target submits per second")
    parser.add_argument("--hosts", type=int, default=4, help="processes the agents are spread over")
    parser.add_argument("--submitters", type=int, default=1, help="processes submitting (users), each rate/N")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--shards", type=int, default=1, help="shards jobs and agents are split over")
    parser.add_argument("--replicas", type=int, default=1, help="server processes sharing out the shards")
    parser.add_argument("--cluster-nodes", type=int, default=0, help="primaries of a Redis Cluster (0: one server)")
    parser.add_argument("--policy", default=planning.DEFAULT_POLICY, help="the servers' planning policy")
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="submit every job before the servers start: starts_per_s is then how fast the replicas drain a queue",
    )
    parser.add_argument(
        "--fsync",
        choices=("always", "everysec"),
        default="always",
        help="Redis's appendfsync (the embedded default's: always)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="broker-bench-"))
    if args.cluster_nodes:
        with embedded.cluster(args.cluster_nodes, "--appendonly", "yes", "--appendfsync", args.fsync) as url:
            result = run(url, home, args)
    else:
        try:
            url = embedded.ensure(home).url
            connect(url).config_set("appendfsync", args.fsync)
            result = run(url, home, args)
        finally:
            embedded.stop(home)
    print(json.dumps(result) if args.json else result)


def run(url: str, home: Path, args) -> dict:
    store = ShardedStore(url, count=args.shards)
    offer, spec, quote = quoted_job("bench", 0.01, SystemClock().now(), args.policy)

    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    ids = balanced_ids(args.agents, args.shards)
    hosts = [
        ctx.Process(target=agent_host, args=(url, str(home), offer.model_dump_json(), ids[h :: args.hosts], stop, args))
        for h in range(args.hosts)
    ]
    servers = [ctx.Process(target=server_host, args=(url, str(home), stop, r, args)) for r in range(args.replicas)]
    for proc in hosts + ([] if args.backlog else servers):
        proc.start()
    deadline = time.time() + 120
    while not all(store.lease_alive(i) for i in ids):
        if time.time() > deadline:
            raise SystemExit("agents did not register within 120 s")
        time.sleep(0.2)

    t0 = time.time() + 1.0  # the submitters start together, after they are spawned
    redis_cpu = -redis_cpu_s(store)
    submitters = [
        ctx.Process(target=submit_host, args=(url, spec.model_dump_json(), quote.model_dump_json(), n, args, t0))
        for n in range(args.submitters)
    ]
    for proc in submitters:
        proc.start()
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("submitting", total=args.jobs)
        while any(p.is_alive() for p in submitters):
            bar.update(task, completed=sum(store.redis.zcard(s.key("jobs")) for s in store.shards))
            time.sleep(0.2)
        submit_s = float(store.redis.get("bench:submit-end")) - t0
        if args.backlog:
            for proc in servers:
                proc.start()
        task = bar.add_task("waiting for every job to start", total=args.jobs)
        started: dict[str, float] = {}
        stamps: dict[tuple[str, str, str], int] = {}  # (type, job, agent) -> the report's stream id (ms)
        last_ids, deadline = ["-"] * args.shards, time.time() + args.timeout
        while len(started) < args.jobs and time.time() < deadline:
            for index, shard in enumerate(store.shards):
                for entry_id, fields in store.redis.xrange(shard.key("agent-events"), min=last_ids[index], count=5000):
                    last_ids[index] = f"({entry_id}"
                    if fields["type"] in ("started", "exited"):
                        stamps[fields["type"], fields["job"], fields["agent"]] = int(entry_id.split("-")[0])
                    if fields["type"] == "started":
                        started.setdefault(fields["job"], json.loads(fields["data"])["at"])
            bar.update(task, completed=len(started))
            time.sleep(0.2)
    redis_cpu += redis_cpu_s(store)
    cycle = agent_cycle(store, ids, stamps)
    first = min(started.values()) if args.backlog and started else t0
    all_started_s = max(started.values()) - first if started else None
    stop.set()
    for proc in hosts + servers:
        proc.join(timeout=10)
        if proc.exitcode is None:
            proc.kill()

    server_cpu = sum(float(f.read_text()) for f in home.glob("server-*.cpu"))
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
        "replicas": args.replicas,
        "shards": args.shards,
        "cluster_nodes": args.cluster_nodes,  # 0: a single redis-server
        "policy": args.policy,
        "backlog": args.backlog,  # True: the jobs waited for the servers, so p50/p99 are the queue's, not dispatch's
        # an agent's cycle, mean ms: with jobs that end at once, agents / its sum bounds starts_per_s
        "cycle_to_start_ms": cycle[0],  # dispatch -> the agent's started report
        "cycle_running_ms": cycle[1],  # started -> exited report
        "cycle_to_next_dispatch_ms": cycle[2],  # exited -> next dispatch: rounds (draining), or no job
        "fsync": args.fsync,
        # whose CPU a started job cost: the replicas' while they served; Redis's over the timed span (all clients)
        "server_cpu_ms_per_job": round(1000 * server_cpu / len(started), 3) if started else None,
        "redis_cpu_ms_per_job": round(1000 * redis_cpu / len(started), 3) if started else None,
    }


def redis_cpu_s(store: ShardedStore) -> float:
    """The CPU seconds Redis has used (INFO cpu: user and system), summed over a cluster's nodes."""
    if isinstance(store.redis, RedisCluster):
        infos = list(store.redis.info("cpu", target_nodes=RedisCluster.ALL_NODES).values())
    else:
        infos = [store.redis.info("cpu")]
    return sum(i["used_cpu_sys"] + i["used_cpu_user"] for i in infos)


def agent_cycle(store: ShardedStore, ids: list[str], stamps: dict) -> tuple[float | None, ...]:
    """The mean of each part of an agent's cycle, from the stream ids (Redis's clock, ms) of the assignments and of
    the started and exited reports."""
    parts: tuple[list[int], ...] = ([], [], [])
    for agent in ids:
        sent = [
            (int(e.split("-")[0]), f["job"]) for e, f in store.redis.xrange(store.of_agent(agent).key("assign", agent))
        ]
        for (at, job), following in zip(sent, sent[1:] + [None]):
            began, ended = stamps.get(("started", job, agent)), stamps.get(("exited", job, agent))
            if began is not None:
                parts[0].append(began - at)
            if began is not None and ended is not None:
                parts[1].append(ended - began)
            if ended is not None and following is not None:
                parts[2].append(following[0] - ended)
    return tuple(round(statistics.mean(p), 1) if p else None for p in parts)


def quoted_job(name: str, gpu_hours: float, at: datetime, policy: str = planning.DEFAULT_POLICY):
    """A job that runs `true` on one L4, quoted once on the cheapest L4 on-demand offer: (offer, spec, quote). Benches
    store it pre-quoted, so what they time is the store's and the server's work, not the quote's."""
    offer = min(
        (
            o
            for o in PriceCatalog.from_snapshot().offers
            if o.accelerator == "L4" and o.accelerator_count == 1 and o.tier == Tier.on_demand
        ),
        key=lambda o: o.price_usd_per_h,
    )
    work = {"gpu_hours": gpu_hours}
    spec = validate_spec({"name": name, "run": ["true"], "resources": {"accelerators": ["L4:1"]}, "work": work}, at)
    return offer, spec, planning.get(policy).quote(spec, [offer], at)


def balanced_ids(count: int, shards: int) -> list[str]:
    """`count` agent ids, the same number in each shard (round robin over the shards)."""
    by_shard = [[] for _ in range(shards)]
    for name in (f"a{i:05d}" for i in range(100 * count)):
        group = by_shard[shard_of(name, shards)]
        if len(group) < -(-count // shards):
            group.append(name)
    return [name for group in zip(*by_shard) for name in group][:count]


def submit_host(url: str, spec_json: str, quote_json: str, n: int, args, t0: float) -> None:
    """One user's client: submits jobs n, n + N, ... of the run at rate/N, each stored pre-quoted."""
    from broker.domain.model import JobSpec, Quote

    store = ShardedStore(url, count=args.shards)
    spec, quote = JobSpec.model_validate_json(spec_json), Quote.model_validate_json(quote_json)
    rate = float("inf") if args.backlog else args.rate / args.submitters
    for k, i in enumerate(range(n, args.jobs, args.submitters)):
        if (wait := t0 + k / rate - time.time()) > 0:
            time.sleep(wait)
        now = datetime.now(UTC)
        store.add_job(Job(id=f"bench-{i:06d}", spec=spec, submitted_at=now, updated_at=now, quote=quote))
    store.redis.set("bench:submit-end", repr(time.time()))  # the last submitter to finish writes last


def agent_host(url: str, home: str, offer_json: str, ids: list[str], stop, args) -> None:
    """One machine's worth of agents: a thread and a store connection each."""
    offer = Offer.model_validate_json(offer_json)

    def loop(agent: Agent) -> None:
        agent.register()
        while not stop.is_set():
            agent.step()  # as Agent.run turns (its default wait for an assignment)

    runs = Path(home) / "runs"
    agents = [
        Agent(ShardedStore(url, count=args.shards).of_agent(i), i, offer, f"{home}/ckpt", runs, lease_s=30.0)
        for i in ids
    ]
    threads = [threading.Thread(target=loop, args=(a,), daemon=True) for a in agents]
    for t in threads:
        t.start()
    stop.wait()


def server_host(url: str, home: str, stop, index: int, args) -> None:
    """One `broker server` replica over the shards it owns, wired as the command wires it: its policy deciding from
    the market model, at the live prices (before 2026-12-01 it planned with a policy made apart, which for hedge was
    Uniform Progress without the market's view: lighter than what a server runs)."""
    shards = str(args.shards)
    os.environ.update(BROKER_REDIS_URL=url, BROKER_HOME=home, BROKER_CHECKPOINTS=f"{home}/ckpt", BROKER_SHARDS=shards)
    broker = wiring.make_broker(daemon=True, claim=True, policy=args.policy)
    replica = wiring.make_replica(broker, f"server-{index}")
    cpu = time.process_time()  # the serving, not the start (imports, the market model's fit)
    replica.serve(until=stop.is_set)
    Path(home, f"server-{index}.cpu").write_text(str(time.process_time() - cpu))


if __name__ == "__main__":
    sys.exit(main())
