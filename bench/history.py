"""A store with a long history: what the read paths cost when the store keeps every job it ever ran.

Fills an embedded store with `--jobs` pre-quoted jobs (as bench/dispatch.py submits them), all but `--live` of them
done with one finished run, then times what a user and a scraper wait for: `broker list`, `broker cost-report` and
`broker submit` (each a fresh process, as a user runs them; `--limit 0` for every job; two cost reports and two
submits: the first after the fill), the server's Prometheus collector (its first scrape and the next), and the
dashboard's Overview (its first run and the next: it refreshes every few seconds) and Jobs pages (streamlit.testing).
Prints one JSON object of seconds.

    python bench/history.py --jobs 20000 --json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dispatch import quoted_job
from rich.console import Console
from rich.progress import track

from broker.app.metrics import StoreCollector
from broker.domain.model import Job, JobState, Run
from broker.store import embedded
from broker.store.jobs import Store

ROOT = Path(__file__).resolve().parent.parent
BROKER = [sys.executable, "-m", "broker"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--live", type=int, default=50, help="jobs still queued; the others are done")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="broker-history-"))
    try:
        url = embedded.ensure(home).url
        fill(Store(url), args.jobs, args.live)
        result = {"jobs": args.jobs, "live": args.live, **measure(url, home)}
    finally:
        embedded.stop(home)
    print(json.dumps(result) if args.json else result)


def fill(store: Store, count: int, live: int) -> None:
    """`count` jobs of one small spec, the oldest `count - live` done after an hour's run on on-demand."""
    start = datetime.now(UTC) - timedelta(days=30)
    offer, spec, quote = quoted_job("history", 1.0, start)
    for i in track(range(count), description="filling the store", console=Console(stderr=True), transient=True):
        at = start + timedelta(minutes=2 * i)
        job = Job(id=f"history-{i:06d}", spec=spec, submitted_at=at, updated_at=at, quote=quote)
        if i < count - live:
            ran = Run(
                fence=1, agent="a", offer=offer, dispatched_at=at, started_at=at, ended_at=at + timedelta(hours=1)
            )
            job = job.model_copy(
                update={"state": JobState.done, "runs": [ran.model_copy(update={"end_reason": "finished"})]}
            )
        store.add_job(job)


def measure(url: str, home: Path) -> dict:
    env = {**os.environ, "BROKER_HOME": str(home), "BROKER_REDIS_URL": url}
    submit = ["submit", str(ROOT / "examples" / "finetune-lora.yaml")]  # prices with our agents' evidence
    commands = {
        "list_s": ["list"],
        "list_all_s": ["list", "--limit", "0"],
        "list_queued_s": ["list", "--state", "queued"],
        "list_done_s": ["list", "--state", "done"],
        "cost_report_first_s": ["cost-report"],  # the first reader after an upgrade keeps the ended jobs' figures
        "cost_report_s": ["cost-report"],
        "submit_first_s": submit,
        "submit_next_s": submit,
    }
    figures = {name: timed_command(command, env) for name, command in commands.items()}
    collector = StoreCollector(Store(url))
    for scrape in ("first", "next"):
        started = time.perf_counter()
        list(collector.collect())
        figures[f"metrics_scrape_{scrape}_s"] = round(time.perf_counter() - started, 3)
    os.environ["BROKER_REDIS_URL"] = url  # the dashboard reads the store the environment names
    from streamlit.testing.v1 import AppTest

    app = AppTest.from_file(str(ROOT / "dashboards" / "app.py"), default_timeout=300)
    for run in ("first", "next"):  # the Overview opens the dashboard, and refreshes every few seconds
        started = time.perf_counter()
        app.run()
        figures[f"dashboard_overview_{run}_s"] = round(time.perf_counter() - started, 2)
    started = time.perf_counter()
    app.sidebar.radio[0].set_value("Jobs").run()
    figures["dashboard_jobs_s"] = round(time.perf_counter() - started, 2)
    return figures


def timed_command(args: list[str], env: dict) -> float | None:
    """Seconds the command took; None when it failed (an option a version before it lacks)."""
    started = time.perf_counter()
    done = subprocess.run([*BROKER, *args], env=env, capture_output=True, check=False)
    return round(time.perf_counter() - started, 2) if done.returncode == 0 else None


if __name__ == "__main__":
    sys.exit(main())
