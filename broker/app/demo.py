"""`broker demo`: the product end to end on one machine, on a compressed clock.

Local agents stand for three instances: the cheapest L4 spot offer (its trace loses the
instance a few seconds into its first job), a second L4 spot offer and an L4 on-demand one. Two real jobs
(a torch training job and a batch-inference job, both through broker.sdk) are submitted,
dispatched, one is preempted, checkpoints, migrates and finishes; the summary prices every
run against running the same work on on-demand.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from broker.agents.checkpoints import CheckpointStore
from broker.agents.provision import LocalProvisioner
from broker.app import render
from broker.app.run import wait_for_agents
from broker.core.broker import Broker
from broker.core.clock import ScaledClock
from broker.core.server import BrokerServer
from broker.domain.errors import InfeasibleError
from broker.domain.model import DEMO_TAG, Job, Tier
from broker.domain.specfile import load_spec
from broker.models.accounting import savings_pct
from broker.pricing.availability import MarketModel
from broker.pricing.catalog import PriceCatalog
from broker.store.jobs import Store
from broker.store.shards import ShardedStore

PREFIX = "broker-demo:"
TRACE = "traces/aws-04-22-2023_us-east-1f_v100_1.json"
LOSES_SOON_TICK = 430  # 18 ticks (9.6 trace minutes) before this trace's first lost tick (448), from the first job
STAYS_TICK = 1000  # the next loss is 1,941 ticks (17 trace hours) away


def pick_agents(catalog: PriceCatalog, examples: Path = Path("examples")) -> list[tuple[str, object, str]]:
    """(agent id, offer, notices spec) for the demo pool: two L4 spot offers in different clouds, each replaying
    `examples`' trace, and one on-demand."""
    l4 = [o for o in catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1]
    spot = sorted((o for o in l4 if o.tier == Tier.spot), key=lambda o: o.price_usd_per_h)
    on_demand = min((o for o in l4 if o.tier == Tier.on_demand), key=lambda o: o.price_usd_per_h)
    second = next(o for o in spot if o.cloud != spot[0].cloud)
    return [
        ("spot-a", spot[0], f"trace={examples / TRACE}@{LOSES_SOON_TICK}@job"),
        ("spot-b", second, f"trace={examples / TRACE}@{STAYS_TICK}"),
        ("ondemand-a", on_demand, "none"),
    ]


def quote_examples(broker: Broker, files: list[Path]) -> list[dict]:
    """Each example spec's quote (as `broker submit --json` gives it) or why it is refused."""
    quotes = []
    for path in files:
        spec = load_spec(path, broker.clock.now())
        try:
            quotes.append({"file": str(path), **render.quote_dict(broker.quote(spec), None, False)})
        except InfeasibleError as refusal:
            quotes.append({"file": str(path), "refused": str(refusal)})
    return quotes


def start_clean(redis_url: str, prefix: str, work: Path) -> tuple[Store, Path, str]:
    """A demo's own store namespace and work directory, emptied; (store, work dir, checkpoint root)."""
    store = ShardedStore(redis_url, prefix).shards[0]  # one shard: untagged keys unless on a cluster
    store.clear_namespace()
    shutil.rmtree(work, ignore_errors=True)
    return store, work, f"{work}/checkpoints"


def job_summary(job: Job) -> dict:
    """Tiers, cost, what the same work costs on on-demand, migrations and work lost."""
    on_demand = job.on_demand_usd(job.updated_at)
    return {
        "name": job.spec.name,
        "id": job.id,
        "state": job.state.value,
        "reason": job.reason,
        "tiers": [r.offer.tier.value for r in job.runs],
        "agents": [r.agent for r in job.runs],
        "cost_usd": round(job.cost_usd, 4),
        "on_demand_cost_usd": round(on_demand, 4),
        "migrations": job.migrations,
        "work_lost_s": round(sum(r.work_lost_s for r in job.runs), 1),
    }


def totals(rows: list[dict]) -> dict:
    """Spend against on-demand; savings only when every job finished (a failed job's spend saves nothing)."""
    cost = sum(r["cost_usd"] for r in rows)
    base = sum(r["on_demand_cost_usd"] for r in rows)
    unfinished = [r["id"] for r in rows if r["state"] != "done"]
    return {
        "cost_usd": round(cost, 4),
        "on_demand_cost_usd": round(base, 4),
        "savings_pct": None if unfinished or not base else round(savings_pct(cost, base), 1),
        "unfinished": unfinished,
    }


def run_demo(
    redis_url: str,
    home: Path,
    examples: Path,
    catalog: PriceCatalog,
    policy,
    speedup: float,
    timeout_s: float,
    progress=None,
    show_in: ShardedStore | None = None,
    market: MarketModel | None = None,
) -> dict:
    """Run the demo jobs to the end (or the timeout) and return the summary; their ended jobs are copied, tagged
    demo, to the store `show_in` (the user's), where `broker list` and the dashboard look. With the `market` model
    their quotes carry a forecast, as a submit's do."""
    store, work, checkpoints = start_clean(redis_url, PREFIX, home / "demo")
    clock = ScaledClock(speedup)
    broker = Broker(store, catalog, policy, clock, market, explained=market is not None)
    server = BrokerServer(store, policy, clock, CheckpointStore(checkpoints), lease_s=3.0)
    provisioner = LocalProvisioner(redis_url, checkpoints, work / "runs", speedup=speedup, lease_s=3.0, prefix=PREFIX)
    pool = pick_agents(catalog, examples)
    try:
        for agent_id, offer, notices in pool:
            provisioner.start(agent_id, offer, notices)
        wait_for_agents(store, [a for a, _, _ in pool], 60, provisioner.run_root)
        specs = [load_spec(p, clock.now()) for p in sorted((examples / "demo").glob("*.yaml"))]
        jobs = [broker.submit(spec) for spec in specs]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            server.round(block_ms=50)
            current = [store.get_job(j.id) for j in jobs]
            if progress:
                progress(current)
            if all(j.state.terminal for j in current):
                break
        rows = [job_summary(store.get_job(j.id)) for j in jobs]
    finally:
        provisioner.stop_all()
    if show_in is not None:
        show_in.publish_jobs(store, [j.id for j in jobs], tag=DEMO_TAG)
    return {
        "speedup": speedup,
        "agents": [{"id": a, "offer": o.id, "price_usd_per_h": o.price_usd_per_h} for a, o, _ in pool],
        "jobs": rows,
        **totals(rows),
    }
