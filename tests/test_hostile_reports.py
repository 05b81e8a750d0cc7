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
        run = store.get_job(job.id).runs[-1]
        assert run.checkpoint_url is None, url
        assert "outside the job's directory in this broker's checkpoint store" in run.checkpoint_error, url
    good = f"{tmp_path}/ckpt/{job.id}/step-000000000010"
    store.report("a", job.id, 1, "checkpoint", url=good, step=10)
    server.round(block_ms=1)
    assert store.get_job(job.id).runs[-1].checkpoint_url == good
    assert store.get_job(job.id).runs[-1].checkpoint_error is None


def test_a_checkpoint_saved_in_another_store_is_shown_with_the_fix(env, catalog, tmp_path):
    """Agents saving to s3:// beside a server whose BROKER_CHECKPOINTS is its local default: every save was dropped
    with a warning in the server's log, and each run after a preemption started over from nothing, unsaid."""
    from typer.testing import CliRunner

    from broker.app.cli.main import app

    store = Store(env)
    offer = next(o for o in catalog.offers if o.accelerator == "A100" and o.accelerator_count == 1)
    server = BrokerServer(store, planning.get(), SystemClock(), CheckpointStore(str(tmp_path / "ckpt")))
    store.register_agent(AgentInfo(id="a", offer=offer, host="h", pid=1, registered_at=datetime.now(UTC)), 60_000)
    job = Broker(store, catalog, planning.get(), SystemClock()).submit(make_spec(name="saved-elsewhere"))
    assert server.dispatch() == [(job.id, "a")]
    store.report("a", job.id, 1, "checkpoint", url=f"s3://team-bucket/ckpt/{job.id}/step-000000000040", step=40)
    server.round(block_ms=1)
    shown = CliRunner().invoke(app, ["status", job.id]).stdout
    assert "last save failed: step 40: saved at 's3://team-bucket/ckpt/" in shown
    assert "give the server and its agents the same BROKER_CHECKPOINTS" in " ".join(shown.split())
