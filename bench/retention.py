"""Retention benchmark: how much Redis memory an ended job holds, and how fast `broker server --keep-ended-days`
forgets ended jobs (core/retention.py), on a private redis-server (AOF, appendfsync always, as the embedded default).

One job is submitted through the broker (its quote with the market model's forecast, as a real submit stores it) and
finished with two runs (a preemption, then the rest, with progress points); `--jobs` copies of it are stored with
their own ids, submitted over the last `--days` days. Then the retention passes run as a server's replica runs them
(a pass each round while pages come full) with `--keep-days`, and the bench prints the memory before and after, the
bytes each forgotten job held, and the jobs forgotten a second.

    python bench/retention.py --json [--jobs 20000 --days 10 --keep-days 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime, timedelta

from rich.console import Console
from rich.progress import Progress

from broker import planning
from broker.agents.checkpoints import CheckpointStore
from broker.app.wiring import market_model
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.core.retention import Retention
from broker.domain.model import JobState, Run
from broker.domain.specfile import validate_spec
from broker.pricing.catalog import PriceCatalog
from broker.store import embedded
from broker.store.jobs import Store
from broker.store.memory import Memory


def finished_job(store: Store, now: datetime):
    """A job as the broker stores one that ran: submitted with its quote, then two runs and their progress."""
    catalog = PriceCatalog.from_snapshot()
    spec = validate_spec(
        {
            "name": "bench",
            "run": ["python", "train.py"],
            "resources": {"accelerators": ["L4:1"]},
            "work": {"gpu_hours": 4},
        },
        now,
    )
    job = Broker(store, catalog, planning.get(), SystemClock(), market_model).submit(spec)
    offer = job.quote.chosen.offer
    runs = []
    for fence, (hours, reason) in enumerate([(1.5, "preempted"), (3.0, "finished")], start=1):
        start = now + timedelta(hours=sum(r.hours(now) for r in runs))
        run = Run(fence=fence, agent=f"spot-{fence}", offer=offer, dispatched_at=start, started_at=start)
        for step in range(60):  # a progress point a few minutes, as the agents report them (thinned to 64 kept)
            run.record_progress(start + timedelta(hours=hours * step / 60), step / 60)
        run.ended_at, run.end_reason, run.cost_usd = (
            start + timedelta(hours=hours),
            reason,
            offer.price_usd_per_h * hours,
        )
        runs.append(run)
    store.clear_namespace()
    return job.model_copy(update={"state": JobState.done, "runs": runs, "fence": 2, "updated_at": runs[-1].ended_at})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--days", type=float, default=10.0, help="the jobs were submitted over this many days")
    parser.add_argument("--keep-days", type=float, default=5.0, help="--keep-ended-days")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    now = datetime.now(UTC)
    with embedded.scratch() as url:
        store = Store(url)
        store.redis.config_set("appendonly", "yes")
        store.redis.config_set("appendfsync", "always")
        template = finished_job(store, now)
        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("storing ended jobs", total=args.jobs)
            for i in range(args.jobs):
                age = timedelta(days=args.days * (1 - i / args.jobs))
                shift = (now - age) - template.submitted_at
                runs = [
                    r.model_copy(
                        update={
                            "dispatched_at": r.dispatched_at + shift,
                            "started_at": r.started_at + shift,
                            "ended_at": r.ended_at + shift,
                            "progress_points": [(at + shift, done) for at, done in r.progress_points],
                        }
                    )
                    for r in template.runs
                ]
                store.add_job(
                    template.model_copy(
                        update={
                            "id": f"bench-{i:07d}",
                            "submitted_at": template.submitted_at + shift,
                            "updated_at": template.updated_at + shift,
                            "runs": runs,
                        }
                    )
                )
                bar.update(task, advance=1)
        before = Memory.of(store.redis)[0].used_bytes
        record_bytes = store.redis.strlen(store.key("job", "bench-0000000"))
        retention = Retention(timedelta(days=args.keep_days), CheckpointStore(f"memory://bench-retention/{now:%s}"))
        forgotten, passes, began = 0, 0, time.perf_counter()
        while retention.due():  # as a replica: a pass each round while pages come full, then a minute's wait
            forgotten += len(retention.forget_ended(store, now))
            passes += 1
        took_s = time.perf_counter() - began
        retention.wait()
        after = Memory.of(store.redis)[0].used_bytes
        result = {
            "jobs": args.jobs,
            "job_record_bytes": record_bytes,
            "forgotten": forgotten,
            "kept": store.job_count(),
            "passes": passes,
            "forget_s": round(took_s, 2),
            "forgotten_per_s": round(forgotten / took_s) if took_s else None,
            "used_mb_before": round(before / 2**20, 1),
            "used_mb_after": round(after / 2**20, 1),
            "bytes_per_forgotten_job": round((before - after) / forgotten) if forgotten else None,
        }
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    sys.exit(main())
