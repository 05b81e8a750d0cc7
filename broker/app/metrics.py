"""Prometheus metrics of the broker server and of each agent (prometheus-client).

Each process keeps its own CollectorRegistry (no module-level state): the server's holds
round and dispatch timings, preemption and migration counts, and a collector that reads
jobs by state, spend and savings from the store when scraped; an agent's holds checkpoint
save and restore times and the notices it received.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from broker.domain.model import JobState
from broker.models.accounting import on_demand_equivalent_usd, spend_usd
from broker.store.jobs import Store

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class StoreCollector:
    """Jobs by state, spend and savings, read from the store at scrape time. What it needs of a job that ended (its
    state, spend and on-demand equivalent) it keeps, so a scrape reads and parses only the jobs still under way and
    the new ones: a store keeps every job it ever ran (20,000 of them took 2 s of the server's CPU a scrape)."""

    def __init__(self, store: Store):
        self.store = store
        self._ended: dict[str, tuple[JobState, float, float]] = {}  # job -> (state, spend, on-demand equivalent)
        self._lock = threading.Lock()  # scrapes may come at once (the exporter serves each in a thread)

    def describe(self):
        return []

    def collect(self):
        with self._lock:
            jobs = self._jobs(datetime.now(UTC))
        by_state = GaugeMetricFamily("broker_jobs", "Jobs by state.", labels=["state"])
        for state in JobState:
            by_state.add_metric([state.value], sum(1 for s, _, _ in jobs if s == state))
        yield by_state
        spend = sum(cost for _, cost, _ in jobs)
        yield GaugeMetricFamily("broker_spend_usd", "Spend to date over all jobs (USD).", value=spend)
        savings = sum(base for _, _, base in jobs) - spend
        yield GaugeMetricFamily("broker_savings_usd", "Savings against on-demand (USD).", value=savings)
        yield GaugeMetricFamily(
            "broker_bubble_fill_share", "Share of bubble time filled (0 until bubbles are offered).", value=0.0
        )

    def _jobs(self, now: datetime) -> list[tuple[JobState, float, float]]:
        """Each job's state, spend and on-demand equivalent: the ended ones' as kept, the others' read now."""
        read = self.store.list_jobs(skip=self._ended)
        for job in read:
            if job.state.terminal and all(r.ended_at for r in job.runs):  # its last run's cost is in: final
                self._ended[job.id] = (job.state, spend_usd(job, now), on_demand_equivalent_usd(job, now))
        for gone in self._ended.keys() - self.store.job_ids():  # replaced (a demo's copies)
            del self._ended[gone]
        live = [(j.state, spend_usd(j, now), on_demand_equivalent_usd(j, now)) for j in read if j.id not in self._ended]
        return [*self._ended.values(), *live]


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
        self.registry.register(StoreCollector(store))


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
    start_http_server(port, addr=address, registry=registry)
