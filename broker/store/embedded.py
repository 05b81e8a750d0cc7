"""The embedded default: a private redis-server on loopback, started by broker when no URL is set.

It keeps its data (AOF, fsync on every write) under `$BROKER_HOME/redis`, is reused by
every later broker command while it runs, and is stopped by `broker stop`.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from broker.domain.errors import StoreUnavailableError
from broker.domain.stops import stops_held

START_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class EmbeddedRedis:
    url: str
    port: int
    pid: int
    data_dir: Path
    started: bool  # True when this call started it, False when it was already running


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cluster_port() -> int:
    """A free port whose cluster bus port (10,000 higher, so the port is at most 55,535) is free too."""
    while True:
        port = _free_port()
        if port <= 55_535:
            try:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + 10_000))
                return port
            except OSError:
                continue


def _client(port: int) -> redis.Redis:
    """A client for probing and stopping: no retries, so a dead server answers at once."""
    return redis.Redis(port=port, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))


def _alive(port: int) -> bool:
    try:
        return bool(_client(port).ping())
    except redis.RedisError:
        return False


@contextmanager
def _locked(data_dir: Path):
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # BROKER_HOME somewhere this user cannot write
        raise StoreUnavailableError(
            f"BROKER_HOME: cannot make {data_dir} for the private redis-server ({error.strerror}); set BROKER_HOME "
            "to a folder you can write, or BROKER_REDIS_URL to a Redis"
        ) from None
    with open(data_dir / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two commands starting at once start one server
        yield


def _state_file(home: Path) -> Path:
    return home / "redis" / "state.json"


def _running(home: Path) -> dict | None:
    try:
        state = json.loads(_state_file(home).read_text())
    except (OSError, ValueError):
        return None
    return state if _alive(state["port"]) else None


def _previous_port(home: Path) -> int | None:
    """The port the stopped server had, if it is free now."""
    try:
        port = int(json.loads(_state_file(home).read_text())["port"])
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as redis-server binds: closed connections
            s.bind(("127.0.0.1", port))  # in TIME_WAIT do not hold the port
        return port
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise StoreUnavailableError(
            "redis-server: not installed; run `apt-get install redis-server` (make setup does) or set BROKER_REDIS_URL"
        )
    return binary


@contextmanager
def scratch():
    """A throwaway redis-server for work that is recomputed rather than kept (the backtest): a temporary
    directory, no snapshots; stopped and removed on exit. Yields its URL."""
    with tempfile.TemporaryDirectory(prefix="broker-redis-") as data_dir:
        port, process = _free_port(), None
        argv = [_binary(), "--bind", "127.0.0.1", "--port", str(port), "--dir", data_dir]
        argv += ["--save", "", "--appendonly", "no"]
        try:
            with stops_held():  # a stop now would leave it running, not yet ours to stop (domain/stops.py)
                process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _alive(port):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise StoreUnavailableError(f"redis-server: a scratch server did not start on port {port}")
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            if process is not None:
                process.terminate()
                process.wait(timeout=START_TIMEOUT_S)


@contextmanager
def cluster(nodes: int = 3, *options: str):
    """A throwaway Redis Cluster on loopback (the tests and bench/dispatch.py): `nodes` primaries with cluster
    mode on and `options` (AOF settings, say), joined by `redis-cli --cluster create`; stopped and removed on
    exit. Yields the URL of its first node (a cluster client finds the others)."""
    with tempfile.TemporaryDirectory(prefix="broker-cluster-") as root:
        ports, processes = [_cluster_port() for _ in range(nodes)], []
        try:
            for port in ports:
                data = Path(root) / str(port)
                data.mkdir()
                argv = [_binary(), "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data), "--save", ""]
                argv += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", *options]
                with stops_held():
                    processes.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            deadline = time.monotonic() + START_TIMEOUT_S
            while not all(map(_alive, ports)):
                if time.monotonic() > deadline:
                    raise StoreUnavailableError(f"redis-server: cluster nodes on {ports} did not start")
                time.sleep(0.05)
            create = [shutil.which("redis-cli") or "redis-cli", "--cluster", "create"]
            create += [f"127.0.0.1:{port}" for port in ports] + ["--cluster-replicas", "0", "--cluster-yes"]
            subprocess.run(create, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
            while not all(_client(p).cluster("info")["cluster_state"] == "ok" for p in ports):
                if time.monotonic() > deadline + 60:
                    raise StoreUnavailableError(f"redis-server: the cluster on {ports} did not become ok")
                time.sleep(0.1)
            yield f"redis://127.0.0.1:{ports[0]}/0"
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=START_TIMEOUT_S)
                except subprocess.TimeoutExpired:  # busy writing its files: it is thrown away anyway
                    process.kill()
                    process.wait()


def ensure(home: Path) -> EmbeddedRedis:
    """The private redis-server for `home`: the running one, or a new one."""
    data_dir = home / "redis"
    with _locked(data_dir):
        state = _running(home)
        if state:
            return EmbeddedRedis(f"redis://127.0.0.1:{state['port']}/0", state["port"], state["pid"], data_dir, False)
        binary = _binary()
        port = _previous_port(home) or _free_port()  # the same port again: agents and servers reconnect to it
        pidfile = data_dir / "redis.pid"
        pidfile.unlink(missing_ok=True)
        subprocess.run(
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--dir",
                str(data_dir),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--daemonize",
                "yes",
                "--pidfile",
                str(pidfile),
                "--logfile",
                str(data_dir / "redis.log"),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (_alive(port) and pidfile.exists()):
            if time.monotonic() > deadline:
                raise StoreUnavailableError(f"redis-server: did not start on port {port}; see {data_dir / 'redis.log'}")
            time.sleep(0.05)
        pid = int(pidfile.read_text().strip())
        _state_file(home).write_text(json.dumps({"port": port, "pid": pid}))
        return EmbeddedRedis(f"redis://127.0.0.1:{port}/0", port, pid, data_dir, True)


def stop(home: Path) -> bool:
    """Stop the private redis-server (its AOF stays on disk); False if none was running."""
    data_dir = home / "redis"
    with _locked(data_dir):
        state = _running(home)
        if state is None:
            return False
        try:
            _client(state["port"]).shutdown()
        except redis.ConnectionError:
            pass  # the server closes the connection as it exits
        deadline = time.monotonic() + START_TIMEOUT_S
        # redis removes its pid file after the final AOF fsync, just before it exits
        while ((data_dir / "redis.pid").exists() or _alive(state["port"])) and time.monotonic() < deadline:
            time.sleep(0.02)
        return True  # the state file stays: the next start takes the same port
