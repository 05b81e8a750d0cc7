"""An agent that dies of an error stops its job first: the job runs in a session of its own, and was left running
unreported (writing checkpoints under the job's directory) while the broker gave the job to another agent."""

import signal
import sys
import time

import pytest

from broker import planning
from broker.agents.agent import Agent
from broker.agents.checkpoints import CheckpointStore
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.core.server import BrokerServer
from conftest import make_spec


def test_an_agent_failing_with_an_error_stops_its_job_before_it_exits(store, catalog, tmp_path, monkeypatch):
    offer = next(o for o in catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1)
    agent = Agent(store, "a1", offer, str(tmp_path / "ckpt"), tmp_path / "runs", heartbeat_s=0.0, grace_s=5.0)
    agent.register()
    server = BrokerServer(store, planning.get(), SystemClock(), CheckpointStore(str(tmp_path / "ckpt")))
    spec = make_spec(run=[sys.executable, "-c", "import time; time.sleep(120)"], resources={"accelerators": ["L4:1"]})
    Broker(store, catalog, planning.get(), SystemClock()).submit(spec)
    deadline = time.monotonic() + 30
    while agent.job is None and time.monotonic() < deadline:
        server.dispatch()
        agent.step(block_ms=10)
    job = agent.job
    assert job is not None and job.poll() is None

    def broken(*_):
        raise RuntimeError("a bug in the agent")

    monkeypatch.setattr(agent.contract, "verdict", broken)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        with pytest.raises(RuntimeError, match="a bug"):
            agent.run()  # it takes the stop signals: this process's own are given back after
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert job.poll() is not None  # stopped, not left running in its own session
