"""Prometheus metrics: the server's and an agent's endpoints, scraped over HTTP after a real preempted job."""

import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker import planning
from broker.agents.agent import Agent
from broker.agents.checkpoints import CheckpointStore
from broker.app.demo import pick_agents
from broker.app.metrics import AgentMetrics, ServerMetrics, serve
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.core.server import BrokerServer
from broker.domain.model import JobState
from broker.store.jobs import Store
from conftest import Switch, free_port, train_spec


def scrape(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_server_and_agent_metrics_count_what_happened(redis_url, tmp_path, catalog):
    store = Store(redis_url)
    root = str(tmp_path / "ckpt")
    offers = {name: offer for name, offer, _ in pick_agents(catalog)}
    server_metrics, agent_metrics = ServerMetrics(store), AgentMetrics()
    server_port, agent_port = free_port(), free_port()
    serve(server_metrics.registry, server_port)
    serve(agent_metrics.registry, agent_port)
    server = BrokerServer(
        store, planning.get(), SystemClock(), CheckpointStore(root), lease_s=3.0, metrics=server_metrics
    )
    notice = Switch()
    agents = [
        Agent(
            store,
            name,
            offers[name],
            root,
            tmp_path / "runs",
            notices=n,
            heartbeat_s=0.2,
            lease_s=3.0,
            metrics=agent_metrics,
        )
        for name, n in (("spot-a", notice), ("ondemand-a", None))
    ]
    for agent in agents:
        agent.register()
    job = Broker(store, catalog, planning.get(), SystemClock()).submit(
        train_spec(OUTPUT=str(tmp_path / "out.pt"), STEP_SLEEP_S="0.03")
    )

    deadline = time.monotonic() + 90
    while store.get_job(job.id).state != JobState.done:
        assert time.monotonic() < deadline
        for agent in list(agents):
            if agent.step(block_ms=10):
                agents.remove(agent)
        server.round(block_ms=10)
        run = store.get_job(job.id).current_run
        if run and run.agent == "spot-a" and run.progress_done >= 15 and notice.fired is None:
            notice.fire()

    served = scrape(server_port)
    assert served[("broker_jobs", (("state", "done"),))] == 1.0
    assert served[("broker_preemptions_total", ())] == 1.0 and served[("broker_migrations_total", ())] == 1.0
    assert served[("broker_dispatch_latency_seconds_count", ())] == 2.0  # two runs started
    assert served[("broker_quote_cost_ratio_count", ())] == 0  # its agents were local stand-ins: no verdict
    assert served[("broker_round_seconds_count", ())] > 10
    done = store.get_job(job.id)
    assert served[("broker_spend_usd", ())] == pytest.approx(sum(r.cost_usd for r in done.runs))  # a Redis counter
    agent_side = scrape(agent_port)
    saves = sum(1 for r in done.runs if r.checkpoint_step)  # at least one save per run
    assert agent_side[("broker_checkpoint_save_seconds_count", ())] >= saves
    assert agent_side[("broker_checkpoint_restore_seconds_count", ())] == 1.0
    assert agent_side[("broker_preemption_notices_total", ())] == 1.0


def test_finished_jobs_are_set_against_their_quotes_as_the_quotes_record_counts_them(store, catalog):
    """A job finished on the clouds' instances: its cost over its quote's, and its deadline met or missed with the
    odds quoted, for a dashboard over many replicas (accounting.quote_record, on the store, reads every job)."""
    from datetime import UTC, datetime

    from seeded_jobs import seed_jobs

    jobs = seed_jobs(store, catalog)["jobs"]
    metrics, now = ServerMetrics(store), datetime.now(UTC)
    for job in jobs:
        if job.runs:  # a report is of a run
            metrics.folded(job, {"exited"}, now)
    sample = metrics.registry.get_sample_value
    done = [j for j in jobs if j.state == JobState.done]  # "migrated" on time, "late" after its deadline
    assert sample("broker_quote_cost_ratio_count") == 2
    ratios = sum(sum(r.cost_usd for r in j.runs) / j.quote.cost_usd for j in done)
    assert sample("broker_quote_cost_ratio_sum") == pytest.approx(ratios)
    met, missed = (sample("broker_quoted_deadlines_total", {"outcome": o}) for o in ("met", "missed"))
    assert (met, missed) == (1, 1)
    assert sample("broker_quoted_deadline_odds_total") == pytest.approx(sum(j.quote.p_meet_deadline for j in done))
    metrics.folded(done[0], {"started"}, now)  # not its end: nothing more counted
    assert sample("broker_quote_cost_ratio_count") == 2


def test_jobs_past_their_deadline_that_have_not_ended_are_counted_as_overdue(store, catalog):
    """The quotes' record counts a missed deadline at the job's end; a job stuck in the queue or running late was
    counted nowhere until it ended. The count reads no job, and a store from before its index is indexed once."""
    from datetime import UTC, datetime, timedelta

    from seeded_jobs import offer, seed_jobs

    from broker.domain.model import Job, Run, Tier
    from conftest import make_spec

    seed_jobs(store, catalog)  # one done after its deadline ("late"), one waiting whose deadline is ahead
    now, spot = datetime.now(UTC), offer(catalog, Tier.spot)
    running = Run(fence=1, agent="a1", offer=spot, dispatched_at=now, started_at=now)
    for name, deadline, runs in (("queued-late", "+4h", []), ("running-late", "+5h", [running]), ("open", None, [])):
        given = {"deadline": deadline} if deadline else {}
        spec = make_spec(
            name=name,
            now=now - timedelta(hours=6),
            resources={"accelerators": ["L4:1"]},
            work={"gpu_hours": 1},
            **given,
        )
        state = JobState.running if runs else JobState.queued
        quote = planning.get().quote(spec, [spot, offer(catalog, Tier.on_demand)], now - timedelta(hours=6))
        job = Job(id=name, spec=spec, state=state, submitted_at=now, updated_at=now, quote=quote, runs=runs)
        assert store.add_job(job.model_copy(update={"fence": len(runs)}))
    overdue = ServerMetrics(store).registry.get_sample_value
    assert overdue("broker_jobs_overdue") == 2
    store.set_state("queued-late", JobState.cancelled, now)  # it ended: the quotes' record's, if anyone's
    assert overdue("broker_jobs_overdue") == 1
    store.redis.delete(store.key("due"), store.key("due-indexed"))  # a store written before the index
    assert overdue("broker_jobs_overdue") == 1 and store.redis.exists(store.key("due-indexed"))
