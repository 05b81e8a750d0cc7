"""Agents and a broker server over a real Redis, turned by hand (the `system` fixture, conftest.py)."""

import sys
import threading
import time

from broker import planning
from broker.agents.agent import Agent
from broker.agents.checkpoints import CheckpointStore
from broker.app.demo import pick_agents
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.core.server import BrokerServer
from broker.store.jobs import Store
from conftest import make_spec


class System:
    def __init__(self, redis_url, tmp_path, catalog):
        self.store = Store(redis_url)
        self.root = str(tmp_path / "ckpt")
        self.runs = tmp_path / "runs"
        policy = planning.get()
        self.broker = Broker(self.store, catalog, policy, SystemClock())
        self.server = BrokerServer(self.store, policy, SystemClock(), CheckpointStore(self.root), lease_s=1.0)
        self.offers = {name: offer for name, offer, _ in pick_agents(catalog)}  # spot-a is the cheapest
        self.agents: dict[str, Agent] = {}

    def agent(self, name, notices=None, offer=None, for_job=None, store=None):
        """A registered agent the rounds step, on the offer of its name (or `offer`'s); `for_job`: that job's alone;
        `store`: its own (another process's: its own report key)."""
        agent = Agent(
            store or self.store,
            name,
            self.offers[offer or name],
            self.root,
            self.runs,
            notices=notices,
            heartbeat_s=0.2,
            lease_s=3.0,
            grace_s=10,
            for_job=for_job,
        )
        agent.register()
        self.agents[name] = agent
        return agent

    def drive(self, until, timeout_s=90, silent=()):
        """Turn the server until `until()` holds, each live agent (but the `silent`) meanwhile in its own thread, as
        its own process would: one agent's long turn (its job's save on a stop, up to its grace) starved the others'
        lease renewals when one loop turned them all, and on a busy machine a bystander was taken for lost."""
        stop, failed = threading.Event(), []

        def turn(name, agent):
            try:
                while not stop.is_set():
                    if agent.step(block_ms=10):
                        del self.agents[name]  # the agent ended (preempted, stopped)
                        return
            except Exception as err:  # noqa: BLE001 - raised in the test's thread below
                failed.append(err)

        turning = [
            threading.Thread(target=turn, args=(name, agent), daemon=True)
            for name, agent in self.agents.items()
            if name not in silent
        ]
        for thread in turning:
            thread.start()
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and not failed:
                self.server.round(block_ms=10)
                if until():
                    return
        finally:
            stop.set()
            for thread in turning:
                thread.join(timeout=60)
            if failed:
                raise failed[0]
        jobs = [
            (j.id, j.state.value, j.reason, [(r.agent, r.end_reason) for r in j.runs]) for j in self.store.list_jobs()
        ]
        raise AssertionError(f"timed out; jobs: {jobs}; agents: {[(a.id, a.job) for a in self.store.agents()]}")

    def job(self, job_id):
        return self.store.get_job(job_id)

    def reports(self, kind):
        return [f for _, f in self.store.redis.xrange("broker:agent-events") if f["type"] == kind]


def l4_spec(name, code, **fields):
    """A small python job for the L4 agents."""
    return make_spec(name=name, run=[sys.executable, "-c", code], resources={"accelerators": ["L4:1"]}, **fields)


def quick_spec():
    return l4_spec("quick", "import time; time.sleep(0.3)")
