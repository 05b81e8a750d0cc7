"""An agent that is going away while Redis is away leaves at once: its store rides out an outage of
BROKER_REDIS_OUTAGE_S (120 s by default) inside each command, and a stopped or noticed agent used to wait it out."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.store.shards import ShardedStore
from conftest import start_redis, stop_redis

OFFER = "aws/use1-az1/g6.xlarge/spot"


def agent_under_outage(tmp_path, *options: str) -> subprocess.Popen:
    """`broker agent` (the default outage patience) registered on a scratch Redis, which is then stopped."""
    proc, port = start_redis(tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    env = {**os.environ, "BROKER_REDIS_URL": url, "BROKER_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    env.pop("BROKER_REDIS_OUTAGE_S", None)
    command = [str(Path(sys.executable).parent / "broker"), "agent", "--id", "a1", "--offer", OFFER, *options]
    agent = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        store, deadline = ShardedStore(url), time.monotonic() + 60
        while not store.agents() and time.monotonic() < deadline and agent.poll() is None:
            time.sleep(0.1)
        assert store.agents(), f"the agent did not register: {agent.stderr.read() if agent.poll() is not None else ''}"
    finally:
        stop_redis(proc, port)
    time.sleep(1.5)  # the agent's next command finds Redis gone and starts waiting for it
    return agent


def ended(agent: subprocess.Popen, within_s: float) -> str:
    """The agent's last words, once it exits within `within_s` (it is killed, and the test fails, past that)."""
    try:
        agent.wait(timeout=within_s)
    except subprocess.TimeoutExpired:
        agent.kill()
        pytest.fail(f"the agent was still waiting for Redis {within_s} s later")
    return agent.stderr.read().strip().splitlines()[-1]


def test_an_agent_stopped_while_redis_is_away_leaves_at_once(tmp_path):
    agent = agent_under_outage(tmp_path)
    began = time.monotonic()
    agent.send_signal(signal.SIGTERM)
    assert ended(agent, within_s=15) == "agent a1 ended: stopped"
    assert time.monotonic() - began < 15


def test_an_agent_noticed_while_redis_is_away_leaves_within_the_notice(tmp_path):
    """The notice comes 6 s after the agent starts (a trace at 60x: capacity for 8 minutes, 2 minutes' lead)."""
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [1] * 8 + [0]}))
    began = time.monotonic()
    agent = agent_under_outage(tmp_path, "--notices", f"trace={trace}", "--speedup", "60")
    assert ended(agent, within_s=30) == "agent a1 ended: preempted"
    assert time.monotonic() - began < 30


def test_an_agent_stopped_while_it_registers_with_redis_away_leaves_stopped(store, catalog, tmp_path, monkeypatch):
    """Its registration's transaction landed (the agent is listed) and Redis went before the assignment stream's
    group was made: the error escaped `run`, and a stopped agent ended with "redis: lost the connection" (a fresh
    clone's test above saw it on a loaded machine)."""
    import redis

    from broker.agents.agent import Agent

    offer = next(o for o in catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1)
    agent = Agent(store, "a1", offer, str(tmp_path / "ckpt"), tmp_path / "runs")

    def gone(*_, **__):
        agent._stopping = True  # its SIGTERM, while the store waited for Redis
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1. Connection refused.")

    monkeypatch.setattr(store.redis, "xgroup_create", gone)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        assert agent.run() == "stopped"
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
