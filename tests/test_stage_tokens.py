"""A broker with BROKER_AGENT_SECRET set admits a training job's pipeline stages with one pool token for the main job
(`broker agents token --pool MAIN_JOB`, passed to attach() or as BROKER_AGENT_TOKEN); before, stages registered with
no token, every one was refused round after round, and the bubbles were never filled. A stage refused says why once
and training goes on without its bubbles offered."""

import logging
import time
from datetime import UTC, datetime, timedelta

from typer.testing import CliRunner

from broker import planning
from broker.agents.checkpoints import CheckpointStore
from broker.agents.tokens import refusal
from broker.app.cli.main import app
from broker.bubbles.agent import FillAgent
from broker.bubbles.capacity import bubble_offer
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.core.server import BrokerServer
from broker.domain.bubbles import BubbleProfile, WindowStats
from conftest import make_spec

SECRET = "a-secret-of-24-characters"


def stage(main_job: str, index: int) -> BubbleProfile:
    window = WindowStats(kind="fill-drain", median_s=0.035, p10_s=0.035, free_bytes=4 * 10**9, count=50)
    return BubbleProfile(
        main_job=main_job, stage=index, device="cpu", iteration_s=0.06, measured_at=datetime.now(UTC), windows=[window]
    )


def test_a_pool_token_admits_every_stage_of_its_main_job_and_no_other_agent(monkeypatch):
    monkeypatch.setenv("BROKER_AGENT_SECRET", SECRET)
    runner = CliRunner()
    token = runner.invoke(app, ["agents", "token", "--pool", "llm-7b", "--ttl-hours", "720"]).stdout.strip()
    now = datetime.now(UTC)
    assert all(refusal(SECRET, f"llm-7b.stage{s}", token, now) is None for s in range(4))
    assert refusal(SECRET, "llm-7b.stage0", token, now + timedelta(hours=721)) is not None
    for other in ("llm-7b-stage0", "llm-70b.stage0", "spot-a"):
        assert "pool 'llm-7b'" in refusal(SECRET, other, token, now)
    for args in ([], ["--id", "a", "--pool", "b"]):
        result = runner.invoke(app, ["agents", "token", *args])
        assert result.exit_code == 2 and "--id/--pool: give one" in result.output


def test_a_stage_with_the_pool_token_is_admitted_and_one_without_is_refused_once(store, catalog, tmp_path, caplog):
    from broker.agents.tokens import issue_pool

    token = issue_pool(SECRET, "llm", datetime.now(UTC) + timedelta(hours=1))
    agents = []
    for index, given in ((0, token), (1, None)):
        profile = stage("llm", index)
        offer = bubble_offer(profile, "local", "local", "T4", min_window_s=0.01)
        agents.append(FillAgent(store, CheckpointStore(str(tmp_path / "ckpt")), profile, offer, 1.0, token=given))
    admitted, refused = agents
    server = BrokerServer(store, planning.get(), SystemClock(), CheckpointStore(str(tmp_path)), agent_secret=SECRET)
    try:
        for agent in agents:
            agent.start()
        assert admitted.id == "llm.stage0" and refused.id == "llm.stage1"
        with caplog.at_level(logging.WARNING):
            Broker(store, catalog, planning.get(), SystemClock()).submit(make_spec())  # not a fill job: no stage fits
            assert server.dispatch() == []  # and the stages are checked for it
            deadline = time.monotonic() + 10
            while not refused._left.is_set():
                assert time.monotonic() < deadline, "the refused stage went on registering"
                time.sleep(0.05)
            time.sleep(1.5)  # a lease and more: it does not register again
        assert store.get_agent("llm.stage1") is None and store.lease_alive("llm.stage0")
        assert not refused._beating.is_alive()  # no renewals for the rest of the training
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert errors == [
            "agent=llm.stage1 refused: no registration token; this stage offers no bubbles: pass attach(..., token=) "
            "or BROKER_AGENT_TOKEN (`broker agents token --pool llm`)"
        ], errors
    finally:
        for agent in agents:
            agent.stop()


def test_a_restarted_training_job_s_stages_register_with_the_pool_s_renewed_token(redis_url, tmp_path):
    """A pretraining run lasts weeks and restarts from its checkpoints: its stages' processes started again with the
    token it was launched with, ended by then, were refused, and its bubbles went unoffered for the rest of it."""
    from broker.agents.tokens import issue_pool
    from broker.bubbles.agent import serve_stage
    from broker.bubbles.recorder import BubbleRecorder
    from broker.store.renewals import put_pool_token
    from broker.store.shards import ShardedStore

    store, now, at = ShardedStore(redis_url, "broker:", 1), datetime.now(UTC), time.monotonic()
    launched = issue_pool(SECRET, "llm", now - timedelta(hours=1))
    renewed = issue_pool(SECRET, "llm", now + timedelta(days=6))  # by the server, while the job's stages ran
    put_pool_token(store.shards[0], "llm", renewed, now + timedelta(days=6))
    recorder = BubbleRecorder()
    recorder.windows = [("fill-drain", at + 0.06 * i, at + 0.06 * i + 0.035, 4 * 10**9) for i in range(50)]
    iterations = [(at + 0.06 * i, at + 0.06 * (i + 1)) for i in range(50)]
    checkpoints = CheckpointStore(str(tmp_path))
    server = BrokerServer(store.shards[0], planning.get(), SystemClock(), checkpoints, agent_secret=SECRET)
    agent = serve_stage(store, checkpoints, "llm", 0, recorder, iterations, "T4", 0.01, launched)
    try:
        assert agent is not None and agent.token == renewed
        server.step()
        assert store.shards[0].refusal(agent.id) is None and store.shards[0].lease_alive(agent.id)
    finally:
        agent.stop()
