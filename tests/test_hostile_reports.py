"""Malformed or hostile agent reports must not crash the broker server or touch another job."""

import json
from datetime import datetime, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import policies
from broker.agents.checkpoints import CheckpointStore
from broker.clock import SystemClock
from broker.server import BrokerServer
from broker.service import Broker
from broker.model import AgentInfo
from broker.store import Store
from conftest import make_spec

TEXT = st.one_of(
    st.text(max_size=20), st.sampled_from(["started", "progress", "checkpoint", "exited", "notice", "victim", "own", "mallory", "1", ""])
)
DATA = st.one_of(
    st.dictionaries(st.sampled_from(["at", "done", "total", "url", "step", "reason", "code"]),
                    st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.text(max_size=10), st.lists(st.integers(), max_size=2)), max_size=5),
    st.integers(), st.text(max_size=10), st.none(),
)  # fmt: skip
FIELDS = st.fixed_dictionaries(
    {},
    optional={"agent": TEXT, "job": TEXT, "fence": st.one_of(TEXT, st.integers(-2, 3).map(str)), "type": TEXT,
              "data": st.one_of(DATA.map(json.dumps), st.text(max_size=15))},
)  # fmt: skip
# Reports that pass the fence and agent checks for mallory's own job, with arbitrary data.
TARGETED = st.fixed_dictionaries(
    {"agent": st.just("mallory"), "job": st.just("own"), "fence": st.just("1"),
     "type": st.sampled_from(["started", "progress", "checkpoint", "exited", "notice"]), "data": DATA.map(json.dumps)}
)  # fmt: skip


def test_hostile_reports_never_crash_the_server_nor_change_other_jobs(redis_url, catalog, tmp_path):
    """Agent "mallory" is compromised: it runs job "own" and sends anything; "victim" runs on another agent."""
    store = Store(redis_url)
    offer = next(o for o in catalog.offers if o.accelerator == "A100" and o.accelerator_count == 1)
    broker = Broker(store, catalog, policies.get(), SystemClock())
    server = BrokerServer(store, policies.get(), SystemClock(), CheckpointStore(str(tmp_path)), consumer="fuzz")
    ids = {}
    for name, agent in (("victim", "honest"), ("own", "mallory")):
        store.register_agent(AgentInfo(id=agent, offer=offer, host="h", pid=1, registered_at=datetime.now(timezone.utc)), 60_000)
        ids[name] = broker.submit(make_spec(name=name)).id
        assert server.dispatch() == [(ids[name], agent)]
    victim = store.get_job(ids["victim"])
    before = victim
    cases = []

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(batch=st.lists(st.one_of(FIELDS, TARGETED), min_size=1, max_size=4))
    def fuzz(batch):
        for fields in batch:
            fields = dict(fields)
            if fields.get("job") in ids:
                fields["job"] = ids[fields["job"]]  # aim at a real job, with whatever else the fuzzer chose
            store.redis.xadd("broker:agent-events", fields or {"junk": "1"})
        cases.append(len(batch))
        server.round(block_ms=1)

    fuzz()
    assert len(cases) >= 100
    own = store.get_job(ids["own"])
    assert own.runs[0].started_at is not None or own.state != before.state  # the fuzz reached the fold itself
    after = store.get_job(victim.id)
    assert after.state == before.state and after.runs == before.runs and after.fence == before.fence
    assert store.redis.xpending("broker:agent-events", "broker")["pending"] == 0  # every message handled or dropped


def test_checkpoint_urls_outside_the_jobs_own_directory_are_refused(redis_url, catalog, tmp_path):
    store = Store(redis_url)
    offer = next(o for o in catalog.offers if o.accelerator == "A100" and o.accelerator_count == 1)
    broker = Broker(store, catalog, policies.get(), SystemClock())
    checkpoints = CheckpointStore(str(tmp_path / "ckpt"))
    server = BrokerServer(store, policies.get(), SystemClock(), checkpoints, consumer="urls")
    store.register_agent(AgentInfo(id="a", offer=offer, host="h", pid=1, registered_at=datetime.now(timezone.utc)), 60_000)
    job = broker.submit(make_spec(name="own"))
    assert server.dispatch() == [(job.id, "a")]
    other = broker.submit(make_spec(name="other"))
    hostile = ["file:///etc/passwd", "/etc/shadow", f"{tmp_path}/ckpt/{other.id}/step-000000000001",
               f"{tmp_path}/ckpt/{job.id}/../{other.id}/step-1", "s3://other-bucket/x", "memory://x"]  # fmt: skip
    for url in hostile:
        store.report("a", job.id, 1, "checkpoint", url=url, step=1)
        server.round(block_ms=1)
        assert store.get_job(job.id).runs[-1].checkpoint_url is None, url
    good = f"{tmp_path}/ckpt/{job.id}/step-000000000010"
    store.report("a", job.id, 1, "checkpoint", url=good, step=10)
    server.round(block_ms=1)
    assert store.get_job(job.id).runs[-1].checkpoint_url == good
