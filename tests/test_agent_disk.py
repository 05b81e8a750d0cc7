"""An agent keeps the directories of its newest ended runs only: one serving jobs for weeks filled its instance's
disk with their output and events (`broker logs` reads the output from Redis)."""

import sys
import time

from broker import planning
from broker.agents import agent as agent_module
from broker.agents.agent import Agent
from broker.agents.checkpoints import CheckpointStore
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.core.server import BrokerServer
from broker.domain.model import JobState
from conftest import make_spec


def test_an_agent_keeps_its_newest_ended_runs_directories_and_removes_older_ones(store, catalog, tmp_path, monkeypatch):
    monkeypatch.setattr(agent_module, "KEPT_RUN_DIRS", 2)
    offer = next(o for o in catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1)
    runs = tmp_path / "runs"
    other = runs / "another-agents-job" / "r1"  # the root may be shared: another agent's run stays
    other.mkdir(parents=True)
    agent = Agent(store, "a1", offer, str(tmp_path / "ckpt"), runs, heartbeat_s=0.0)
    agent.register()
    server = BrokerServer(store, planning.get(), SystemClock(), CheckpointStore(str(tmp_path / "ckpt")))
    broker = Broker(store, catalog, planning.get(), SystemClock())
    spec = make_spec(run=[sys.executable, "-c", "print('out')"], resources={"accelerators": ["L4:1"]})
    jobs = []
    for _ in range(3):
        jobs.append(broker.submit(spec).id)
        deadline = time.monotonic() + 30
        while store.get_job(jobs[-1]).state != JobState.done and time.monotonic() < deadline:
            server.round(block_ms=10)
            agent.step(block_ms=10)
    assert [store.get_job(j).state for j in jobs] == [JobState.done] * 3
    assert not (runs / jobs[0]).exists()  # the oldest run's directory, and its job's once empty
    assert (runs / jobs[1] / "r1" / "output.log").read_text().strip() == "out" and (runs / jobs[2] / "r1").is_dir()
    assert other.is_dir()
