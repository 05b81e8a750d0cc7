"""Prometheus metrics of the broker server and of each agent (prometheus-client).

Each process keeps its own CollectorRegistry (no module-level state): the server's holds
round and dispatch timings, preemption and migration counts, finished jobs' cost and deadline
against their quotes, and a collector that reads jobs by state, the jobs past their deadline, spend and savings
from the store when scraped; an agent's holds checkpoint save and restore times and the notices it received.
"""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from broker.domain.errors import BrokerError
from broker.domain.figures import figures, spend_usd
from broker.domain.model import Job, JobState
from broker.store.jobs import Store
from broker.store.overdue import overdue

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
RATIOS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 3, 5)  # a finished job's cost over its quote's


class StoreCollector:
    """Jobs by state, those not ended past their deadline (an index: store/overdue.py), spend and savings, read from
    the store at scrape time: what the jobs without a run under way add up to, kept as counters beside them
    (store/totals.py), and the jobs with one, read as they are. A store keeps every job it ever ran and may hold a
    long queue, and the scrape runs in the exporter's thread, holding the GIL the server's rounds need."""

    def __init__(self, store: Store):
        self.store = store

    def describe(self):
        return []

    def collect(self):
        now = datetime.now(UTC)
        jobs, spend, on_demand, late = dict.fromkeys(JobState, 0), 0.0, 0.0, 0
        for shard in self.store.shards:
            late += overdue(shard, now)
            counted, running = shard.totals_and_running()
            for state, count in counted.jobs.items():
                jobs[state] += count
            for job in running:
                jobs[job.state] += 1
            spend += counted.spend_usd + sum(spend_usd(job, now) for job in running)
            on_demand += counted.on_demand_usd + sum(job.on_demand_usd(now) for job in running)
        by_state = GaugeMetricFamily("broker_jobs", "Jobs by state.", labels=["state"])
        for state, count in jobs.items():
            by_state.add_metric([state.value], count)
        yield by_state
        yield GaugeMetricFamily("broker_jobs_overdue", "Jobs not ended whose deadline has passed.", value=late)
        yield GaugeMetricFamily("broker_spend_usd", "Spend to date over all jobs (USD).", value=spend)
        savings = on_demand - spend
        yield GaugeMetricFamily("broker_savings_usd", "Savings against on-demand (USD).", value=savings)
        yield GaugeMetricFamily(
            "broker_bubble_fill_share", "Share of bubble time filled (0 until bubbles are offered).", value=0.0
        )


class ServerMetrics:
    def __init__(self, store: Store, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.round_seconds = Histogram(
            "broker_round_seconds", "Time of one planning round.", buckets=SECONDS, registry=self.registry
        )
        self.dispatch_latency = Histogram(
            "broker_dispatch_latency_seconds", "Dispatch to job start.", buckets=SECONDS, registry=self.registry
        )
        self.preemptions = Counter(
            "broker_preemptions", "Runs ended by preemption or a lost agent.", registry=self.registry
        )
        self.migrations = Counter(
            "broker_migrations", "Jobs dispatched again after a preemption.", registry=self.registry
        )
        self.forgotten = Counter(
            "broker_jobs_forgotten", "Ended jobs forgotten by retention (--keep-ended-days).", registry=self.registry
        )
        self.quote_cost_ratio = Histogram(
            "broker_quote_cost_ratio",
            "A finished job's cost over its quote's (1: as quoted), as `broker cost-report`'s quotes' record counts.",
            buckets=RATIOS,
            registry=self.registry,
        )
        self.quoted_deadlines = Counter(
            "broker_quoted_deadlines",
            "Finished jobs' deadlines their quotes gave odds of.",
            ["outcome"],
            registry=self.registry,
        )
        self.quoted_odds = Counter(
            "broker_quoted_deadline_odds",
            "The odds quoted of those deadlines, summed (over their count: the mean).",
            registry=self.registry,
        )
        self.registry.register(StoreCollector(store))

    def folded(self, job: Job, kinds: set[str], now: datetime) -> None:
        """What a job's reports of these kinds show, folded into it: a run started (its dispatch latency), one ended
        by preemption, the job finished (its cost and deadline against its quote, where the quotes' record counts
        them: domain/figures.figures)."""
        run = job.runs[-1]
        if "started" in kinds and run.started_at:
            self.dispatch_latency.observe((run.started_at - run.dispatched_at).total_seconds())
        if "exited" in kinds and run.end_reason == "preempted":
            self.preemptions.inc()
        if "exited" not in kinds or job.state != JobState.done:
            return
        kept = figures(job, now)
        if kept.quoted_usd:
            self.quote_cost_ratio.observe(kept.spend_usd / kept.quoted_usd)
        if kept.quoted_p_meet is not None:
            self.quoted_deadlines.labels("met" if kept.met_deadline(now) else "missed").inc()
            self.quoted_odds.inc(kept.quoted_p_meet)


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.checkpoint_save = Histogram(
            "broker_checkpoint_save_seconds", "Checkpoint save time.", buckets=SECONDS, registry=self.registry
        )
        self.checkpoint_restore = Histogram(
            "broker_checkpoint_restore_seconds", "Checkpoint restore time.", buckets=SECONDS, registry=self.registry
        )
        self.notices = Counter("broker_preemption_notices", "Preemption notices received.", registry=self.registry)


def serve(registry: CollectorRegistry, port: int, address: str = "127.0.0.1") -> None:
    """Expose the registry at http://address:port/metrics (a daemon thread)."""
    try:
        start_http_server(port, addr=address, registry=registry)
    except OSError as error:  # taken, or not an address of this machine: the user's to change
        raise BrokerError(
            f"metrics: cannot serve on {address}:{port} ({error.strerror}); pick a free port with --metrics-port "
            "(0: off), and an address of this machine with --metrics-address"
        ) from None
