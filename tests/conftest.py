"""Fixtures for real services: a redis-server per test session, the real price catalog, a manual clock."""

from __future__ import annotations

import os

# The CLI prints 200 columns wide when its output is not a terminal; pytest-xdist's workers set COLUMNS=80, which
# would wrap the lines the tests read. Set before broker's console is imported, and inherited by the CLIs tests spawn.
os.environ["COLUMNS"] = "200"

import shutil
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from redis.backoff import NoBackoff
from redis.retry import Retry

from broker.agents.notices import Notice
from broker.agents.runner import JobProcess
from broker.core.clock import ManualClock
from broker.domain.errors import BrokerError
from broker.domain.specfile import validate_spec
from broker.pricing.catalog import PriceCatalog
from broker.store.jobs import Store

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SHARED_DATA = ROOT.parent / "shared" / "data"
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_redis(proc: subprocess.Popen, port: int) -> None:
    """Stop a test redis-server: SHUTDOWN, and kill it if it refuses (it does while writing its first AOF)."""
    try:
        redis.Redis(port=port, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)).shutdown(nosave=True)
    except redis.RedisError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def start_redis(data_dir, *options: str, password: str | None = None) -> tuple[subprocess.Popen, int]:
    """A real redis-server on a free loopback port, answering pings; (process, port)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: run `make test` (it installs it) or apt-get install redis-server")
    port = free_port()
    auth = ["--requirepass", password] if password else []
    proc = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data_dir), "--save", "", *auth, *options],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, password=password)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return proc, port
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail(f"redis-server did not start on port {port}")
            time.sleep(0.05)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A real redis-server on a free loopback port, AOF on, for the whole session."""
    proc, port = start_redis(tmp_path_factory.mktemp("redis"), "--appendonly", "yes")
    yield f"redis://127.0.0.1:{port}/0"
    stop_redis(proc, port)


@pytest.fixture
def redis_url(redis_server):
    """The session's redis-server, emptied for this test."""
    redis.Redis.from_url(redis_server).flushall()
    return redis_server


@pytest.fixture
def env(redis_url, monkeypatch, tmp_path):
    """The CLI's environment for one test: this test's Redis, and a broker home of its own."""
    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    monkeypatch.setenv("BROKER_HOME", str(tmp_path / "home"))
    return redis_url


@pytest.fixture
def store(redis_url) -> Store:
    return Store(redis_url)


@pytest.fixture(scope="session")
def catalog() -> PriceCatalog:
    return PriceCatalog.from_snapshot()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


def make_spec(now: datetime = NOW, **fields):
    """A valid job spec with `fields` replacing the defaults."""
    data = {
        "name": "test-job",
        "run": ["python", "train.py"],
        "resources": {"accelerators": ["A100:1"]},
        "work": {"gpu_hours": 4},
    }
    data.update(fields)
    return validate_spec(data, now)


TRAIN = EXAMPLES / "jobs" / "train_mlp.py"


def train_spec(**env):
    """The deterministic torch training job of examples/jobs, 60 steps, a checkpoint every 10."""
    return make_spec(
        name="train",
        run=[sys.executable, str(TRAIN)],
        env={"STEPS": "60", "CKPT_EVERY": "10", **env},
        resources={"accelerators": ["L4:1"]},
        work={"gpu_hours": 0.1},
    )


def run_to_end(spec, job_id, store_root, run_dir, resume_from=None):
    job = JobProcess(spec, job_id, f"{store_root}/{job_id}", run_dir, resume_from=resume_from)
    job.start()
    assert job.wait(timeout=120) == 0, job.log_tail()
    return job


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory):
    """Final weights of the training job run start to finish."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    out = tmp / "final.pt"
    run_to_end(train_spec(OUTPUT=str(out)), "train", tmp / "ckpt", tmp / "run")
    return torch.load(out)


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


class Switch:
    """A notice source the test fires by hand, as a cloud would."""

    def __init__(self):
        self.fired = None

    def fire(self, lead_s=10.0):
        self.fired = Notice("test", "terminate", datetime.now(UTC) + timedelta(seconds=lead_s))

    def check(self):
        return self.fired


@pytest.fixture(scope="session")
def redis_cluster():
    """A real 3-node Redis Cluster on loopback (AOF on), for the whole session; the URL of its first node."""
    from broker.store import embedded

    with embedded.cluster(3, "--appendonly", "yes") as url:
        yield url


@pytest.fixture
def cluster_url(redis_cluster):
    """The session's cluster, emptied for this test."""
    from redis.cluster import RedisCluster

    RedisCluster.from_url(redis_cluster).flushall()
    return redis_cluster


@pytest.fixture
def system(redis_url, tmp_path, catalog):
    """Agents and a server over a real Redis, turned by hand (dispatch_system.System)."""
    from dispatch_system import System

    return System(redis_url, tmp_path, catalog)


@pytest.fixture
def seeded(store, catalog):
    """Five jobs in every state, with known runs, stored; with the numbers the overview must show (seeded_jobs.py)."""
    from seeded_jobs import seed_jobs

    return seed_jobs(store, catalog)


class Users:
    """What the users of every lifecycle machine do alike (tests/test_lifecycle.py, tests/test_move_lifecycle.py): a
    machine keeps the ids it submitted in `jobs` and its Broker in `broker`."""

    @precondition(lambda self: self.jobs)
    @rule(pick=st.integers(0, 50))
    def cancel(self, pick):
        try:
            self.broker.cancel(self.jobs[pick % len(self.jobs)])
        except BrokerError:  # ended already
            pass


def run_machine(machine, examples: int = 200) -> None:
    """A stateful test (its steps on a real Redis: no deadline), `examples` derandomized examples of 30 steps; to hunt
    for defects, BROKER_HUNT=3000 draws that many random examples instead."""
    from hypothesis.stateful import run_state_machine_as_test

    hunt = int(os.environ.get("BROKER_HUNT", 0))
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=hunt or examples,
            stateful_step_count=30,
            derandomize=not hunt,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
