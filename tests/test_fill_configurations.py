"""A fill agent times a fill job's micro-step configurations in its real windows and runs on in the one that does
the most work there (PipeFill's Algorithm 1 choosing), or hands the job back when none fits the windows' time or
free memory. The windows come from a thread that signals them as an engine would; the job comes through the
broker's own streams."""

import sys
import threading
import time
from datetime import UTC, datetime

import pytest

from broker import planning
from broker.agents.checkpoints import CheckpointStore
from broker.bubbles.agent import MIN_SPEED, FillAgent
from broker.bubbles.capacity import bubble_offer
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.core.server import BrokerServer
from broker.domain.bubbles import BubbleProfile, WindowStats
from broker.domain.model import Tier
from broker.domain.specfile import load_spec
from conftest import EXAMPLES

FILL = EXAMPLES / "bubbles" / "fill_mlp.py"
MB = 10**6


@pytest.fixture(autouse=True)
def importable(monkeypatch):
    monkeypatch.syspath_prepend(str(FILL.parent))  # the spawned child imports fill_mlp by name


def stage_profile(free_bytes: int, stage: int = 0) -> BubbleProfile:
    """A stage of main job "llm" with 35 ms windows every 60 ms, `free_bytes` free in them."""
    return BubbleProfile(
        main_job="llm",
        stage=stage,
        device="cpu",
        iteration_s=0.06,
        measured_at=datetime.now(UTC),
        windows=[WindowStats(kind="fill-drain", median_s=0.035, p10_s=0.035, free_bytes=free_bytes, count=50)],
    )


def serve_fill_job(store, catalog, tmp_path, free_bytes: int, env: dict, until, late_s: float = 0.0):
    """A stage with 35 ms windows every 60 ms serves the example fill job until `until(agent, job)` holds; with
    `late_s` each window reaches the agent that late (its serving thread busy elsewhere)."""
    profile = stage_profile(free_bytes)
    root = str(tmp_path / "ckpt")
    agent = FillAgent(
        store, CheckpointStore(root), profile, bubble_offer(profile, "local", "local", "T4", min_window_s=0.01)
    )
    agent.start()
    engine_runs = threading.Event()
    engine_runs.set()

    def engine():
        while engine_runs.is_set():
            agent.signals.put(("fill-drain", time.monotonic() - late_s))  # as agent.signal, `late_s` ago
            time.sleep(0.06)

    threading.Thread(target=engine, daemon=True).start()
    clock, policy = SystemClock(), planning.get()
    spec = load_spec(EXAMPLES / "bubbles" / "fill-mlp.yaml", clock.now())
    spec = spec.model_copy(update={"run": [sys.executable, str(FILL)], "env": {"STEPS": "4000", **env}})
    job = Broker(store, catalog, policy, clock).submit(spec)
    assert job.quote.chosen.offer.tier == Tier.bubble
    server = BrokerServer(store, policy, clock, CheckpointStore(root))
    try:
        deadline = time.monotonic() + 120
        while not until(agent, store.get_job(job.id)):
            assert time.monotonic() < deadline, f"agent: probe {agent.probe}, job {store.get_job(job.id).runs}"
            server.round(block_ms=20)
            time.sleep(0.05)
    finally:
        engine_runs.clear()
        agent.stop()  # training ends: the running job is handed back with its checkpoint
    while store.get_job(job.id).runs[-1].end_reason is None:
        assert time.monotonic() < deadline + 30, "the agent's exit report never reached the broker"
        server.round(block_ms=20)
    return agent, store.get_job(job.id)


def test_a_step_longer_than_the_windows_runs_split_into_micro_steps_that_fit(store, catalog, tmp_path):
    chosen = []

    def split_and_advancing(agent, job):
        if agent.probe is None and agent.executor is not None and not chosen:
            chosen.append(agent.executor.micro_steps)
        return chosen and job.runs and job.runs[-1].progress_done >= 5

    # 2.5 ms a row: a step of 16 rows takes 40 ms as submitted, longer than the 31.5 ms the agent uses of a window
    agent, job = serve_fill_job(store, catalog, tmp_path, 4 * 10**9, {"extra_row_s": "0.0025"}, split_and_advancing)
    assert chosen[0] > 1  # it runs on in a split of the batch, not as submitted (which no window fits)
    assert job.runs[-1].agent == agent.id and agent.executor is None  # handed back when the stage stopped
    assert job.runs[-1].checkpoint_step >= 5  # its steps in the chosen split are kept


def test_a_fill_job_that_needs_more_memory_than_the_windows_have_is_handed_back(store, catalog, tmp_path):
    seen = []

    def handed_back_and_left_alone(agent, job):  # and not sent back to the stage in the 3 s of rounds after
        if job.runs and job.runs[-1].end_reason is not None and not seen:
            seen.extend([time.monotonic(), store.get_agent(agent.id).offer.speed_factor])
        return seen and time.monotonic() > seen[0] + 3

    # the fill process holds hundreds of MB (torch) and the windows have 50 MB free
    agent, job = serve_fill_job(store, catalog, tmp_path, 50 * MB, {}, handed_back_and_left_alone)
    assert job.runs[-1].end_reason == "unfit" and job.pending and len(job.runs) == 1
    assert job.runs[-1].checkpoint_step > 0  # the steps it ran while timed are kept
    assert seen[1] == MIN_SPEED  # what the stage offers once no configuration of the job fit it


def test_windows_gone_before_the_agent_was_free_count_as_bubble_time_left_unfilled(store, catalog, tmp_path):
    """The share of bubble time filled (the dashboard's) counts the windows the agent missed while busy (a start, a
    checkpoint); before, it left them out, and a busy agent's share read higher than what it filled."""

    def missed_a_few(agent, job):
        return agent.stats.missed >= 5

    agent, _ = serve_fill_job(store, catalog, tmp_path, 4 * 10**9, {}, missed_a_few, late_s=0.05)
    assert agent.stats.fill_s == 0  # every window was over (35 ms) before it reached the agent
    assert agent.stats.bubble_s == pytest.approx(0.035 * agent.stats.missed)
    assert agent.stats.fill_share() == 0


def test_the_lease_outlives_a_blocked_serving_thread_and_a_lapsed_one_registers_again(store, tmp_path):
    """Starting a fill process (a torch import) can outlast the lease on a busy machine: the heartbeat has its own
    thread. A lease lost anyway (a long pause: the server then removes the agent) is registered afresh, as an
    ordinary agent does; before, the stage's executor was gone from the broker for good."""
    profile = stage_profile(4 * 10**9, stage=1)
    offer = bubble_offer(profile, "local", "local", "T4", min_window_s=0.01)
    agent = FillAgent(store, CheckpointStore(str(tmp_path / "ckpt")), profile, offer, lease_s=2.0)
    blocked = threading.Event()
    agent._take_assignment = lambda: blocked.wait(6.0)  # the serving thread stuck for 3 leases
    agent.start()
    try:
        time.sleep(4.0)  # renewed every half second: a pause of the heartbeat's thread under 1.5 s changes nothing
        assert store.lease_alive(agent.id)  # renewed while the serving thread waits
        blocked.set()
        store.remove_agent(agent.id)  # what the server does to a lapsed agent
        deadline = time.monotonic() + 10
        while store.get_agent(agent.id) is None:
            assert time.monotonic() < deadline, "the fill agent did not register again"
            time.sleep(0.1)
        assert store.lease_alive(agent.id)
    finally:
        agent.stop()
    assert store.leases([agent.id]) == {agent.id: "leaving"}  # stopping marks it leaving: no new work
    time.sleep(2.5)  # a lease and more
    assert not store.lease_alive(agent.id)  # it lapses (the server then removes it): no heartbeat brings it back


def test_a_hung_serving_thread_lets_the_lease_lapse(store, tmp_path, monkeypatch):
    """The heartbeat's own thread keeps the lease through a slow start, not through a hang: past the time a fill
    process may take to start, the lease lapses and the broker moves the job."""
    from broker.bubbles import agent as fill_agent

    monkeypatch.setattr(fill_agent, "START_TIMEOUT_S", 0.5)
    profile = stage_profile(4 * 10**9, stage=2)
    offer = bubble_offer(profile, "local", "local", "T4", min_window_s=0.01)
    agent = FillAgent(store, CheckpointStore(str(tmp_path / "ckpt")), profile, offer, lease_s=1.0)
    hung = threading.Event()
    agent._take_assignment = lambda: hung.wait(10.0)
    agent.start()
    try:
        time.sleep(3.5)  # 0.5 s allowed to start, then one lease
        assert not store.lease_alive(agent.id)
    finally:
        hung.set()
        agent.stop()
