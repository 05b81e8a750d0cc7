"""A compromised agent's checkpoint reports cannot point the broker at another job's files or outside the store
(generated hostile messages of every kind: tests/test_fuzz.py)."""

from datetime import UTC, datetime

from broker import planning
from broker.agents.checkpoints import CheckpointStore
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.core.server import BrokerServer
from broker.domain.model import AgentInfo
from broker.store.jobs import Store
from conftest import make_spec


def test_checkpoint_urls_outside_the_jobs_own_directory_are_refused(redis_url, catalog, tmp_path):
    store = Store(redis_url)
    offer = next(o for o in catalog.offers if o.accelerator == "A100" and o.accelerator_count == 1)
    broker = Broker(store, catalog, planning.get(), SystemClock())
    checkpoints = CheckpointStore(str(tmp_path / "ckpt"))
    server = BrokerServer(store, planning.get(), SystemClock(), checkpoints, consumer="urls")
    store.register_agent(AgentInfo(id="a", offer=offer, host="h", pid=1, registered_at=datetime.now(UTC)), 60_000)
    job = broker.submit(make_spec(name="own"))
    assert server.dispatch() == [(job.id, "a")]
    other = broker.submit(make_spec(name="other"))
    hostile = [
        "file:///etc/passwd",
        "/etc/shadow",
        f"{tmp_path}/ckpt/{other.id}/step-000000000001",
        f"{tmp_path}/ckpt/{job.id}/../{other.id}/step-1",
        "s3://other-bucket/x",
        "memory://x",
    ]
    for url in hostile:
        store.report("a", job.id, 1, "checkpoint", url=url, step=1)
        server.round(block_ms=1)
        assert store.get_job(job.id).runs[-1].checkpoint_url is None, url
    good = f"{tmp_path}/ckpt/{job.id}/step-000000000010"
    store.report("a", job.id, 1, "checkpoint", url=good, step=10)
    server.round(block_ms=1)
    assert store.get_job(job.id).runs[-1].checkpoint_url == good
