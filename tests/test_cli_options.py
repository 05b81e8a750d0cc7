"""Options and settings a command cannot use (a taken port, an address not this machine's, a speedup of 0, a
BROKER_HOME that cannot be made) are refused before it starts anything, in one line with exit 2, as a bad spec is;
a backtest's --out before its minutes."""

import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_cli import run


@pytest.fixture
def taken_port():
    """A port something else listens on, on loopback."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.fixture
def no_exec(monkeypatch):
    """`broker dashboard` ends by exec'ing Streamlit in its own process: here that would replace pytest's."""
    started = []

    def execve(path, argv, env):
        started.append(argv)
        raise SystemExit("streamlit would start here")

    monkeypatch.setattr(os, "execve", execve)
    return started


def installed(*args):
    """The installed command with a time limit (a regression would run a server or an agent for ever), its result
    read as CliRunner's."""
    broker = Path(sys.executable).parent / "broker"
    done = subprocess.run([str(broker), *map(str, args)], capture_output=True, text=True, timeout=60)
    return SimpleNamespace(exit_code=done.returncode, stderr=done.stderr, output=done.stdout + done.stderr)


def one_error_line(result, *words):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert all(word in lines[0] for word in words), lines[0]


def test_the_dashboard_on_a_taken_port_is_one_line_naming_the_option(env, taken_port, no_exec):
    one_error_line(run("dashboard", "--port", taken_port), f"127.0.0.1:{taken_port}", "in use", "--port")
    assert no_exec == []


def test_the_dashboard_on_an_address_not_this_machines_is_one_line(env, no_exec):
    one_error_line(run("dashboard", "--address", "192.0.2.7", "--port", 18_999), "192.0.2.7", "--address")
    one_error_line(run("dashboard", "--address", "no-such-host.invalid"), "no-such-host.invalid", "--address")
    assert no_exec == []


def test_the_dashboard_with_a_backtest_that_is_not_a_directory_is_one_line(env, tmp_path, no_exec):
    one_error_line(run("dashboard", "--backtest", tmp_path / "nowhere"), "nowhere", "broker backtest --out")
    assert no_exec == []


def test_the_dashboard_on_a_free_port_starts_streamlit_there(env, no_exec):
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    run("dashboard", "--port", port)
    assert len(no_exec) == 1 and no_exec[0][no_exec[0].index("--server.port") + 1] == str(port)


def test_a_server_whose_metrics_port_is_taken_is_one_line(env, taken_port):
    one_error_line(installed("server", "--metrics-port", taken_port), f"127.0.0.1:{taken_port}", "--metrics-port")


def test_metrics_on_an_address_not_this_machines_is_one_line_naming_the_option(env):
    """Metrics listened on loopback alone: a Prometheus on another host could not scrape them (--metrics-address)."""
    for command in (["server"], ["agent", "--id", "a1", "--offer", "aws/use1-az1/g6.xlarge/spot"]):
        said = installed(*command, "--metrics-address", "192.0.2.7", "--metrics-port", 19_464)
        one_error_line(said, "192.0.2.7:19464", "--metrics-address")


@pytest.mark.parametrize(
    "args",
    [
        ("dashboard", "--port", 70_000),
        ("server", "--metrics-port", 70_000),
        ("server", "--speedup", 0),
        ("demo", "--speedup", 0),
        ("demo", "--speedup", 50_000),  # its jobs' quotes then took days of its clock: refused for their deadlines
        ("demo", "--timeout", -1),
        ("agent", "--id", "a1", "--offer", "aws/use1-az1/g6.xlarge/spot", "--lease-s", 0),
        ("agent", "--id", "a1", "--offer", "aws/use1-az1/g6.xlarge/spot", "--speedup", -2),
        ("agent", "--offer", "aws/use1-az1/g6.xlarge/spot", "--id", "../../elsewhere"),  # names keys and files
        ("agents", "token", "--id", "an agent"),
        ("backtest", "--jobs", 1, "--seed", -1),  # numpy's generator refused it: an internal error, exit 1
        # inf and nan passed every option without an upper bound, and overflowed deep inside: internal errors, exit 1
        ("demo", "--timeout", "nan"),  # it gave up at once
        ("server", "--speedup", "inf"),
        ("server", "--leader-lease-s", "inf"),
        ("server", "--keep-ended-days", "inf"),
        ("agent", "--id", "a1", "--offer", "aws/use1-az1/g6.xlarge/spot", "--lease-s", "inf"),
        ("agents", "token", "--id", "a1", "--ttl-hours", "inf"),
        ("agents", "provision", "--token-ttl-hours", "inf"),
        ("backtest", "--arrival-hours", "inf"),
        ("backtest", "--single-job", "--stride-hours", "inf"),
        ("list", "--limit", 10**20),  # past Redis's 64-bit range: a ResponseError
        ("backtest", "--spot-instances", 10**12),  # it built as many simulated instances and never came back
    ],
    ids=lambda args: " ".join(map(str, args[:3])),
)
def test_an_option_out_of_its_range_is_refused_naming_it(env, args):
    result = installed(*args)
    assert result.exit_code == 2 and f"Invalid value for '{args[-2]}'" in result.stderr, result.stderr


def test_a_backtest_whose_options_cannot_work_is_refused_before_it_runs(env, tmp_path, monkeypatch):
    from broker.sim import backtest

    ran = []
    monkeypatch.setattr(backtest, "run", lambda *args, **kwargs: ran.append(args))
    a_file = tmp_path / "results.csv"
    a_file.write_text("")
    one_error_line(run("backtest", "--jobs", 2, "--out", a_file), "is a file", "directory")
    one_error_line(run("backtest", "--jobs", 2, "--out", a_file / "below"), "cannot make", "directory you can write")
    one_error_line(run("backtest", "--single-job", "--out", tmp_path / "x"), "--single-job writes no files")
    one_error_line(run("backtest", "--single-job", "--warm"), "warm: --single-job plays one job alone")
    (tmp_path / "empty").mkdir()
    one_error_line(run("backtest", "--fit-traces", tmp_path / "empty"), "fit-traces:", "has no trace files")
    assert ran == []


def test_the_dashboard_on_a_redis_that_cannot_be_reached_is_one_line(monkeypatch, tmp_path, no_exec):
    from conftest import free_port

    monkeypatch.setenv("BROKER_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    monkeypatch.setenv("BROKER_HOME", str(tmp_path))
    one_error_line(run("dashboard"), "redis: cannot reach", "BROKER_REDIS_URL")
    assert no_exec == []  # every page would have shown it


@pytest.mark.parametrize("url", ["localhost:6379", "redis://127.0.0.1:99999/0", "redis://[::1/0"])
def test_a_redis_url_redis_py_cannot_read_is_one_line(monkeypatch, tmp_path, url):
    """redis-py raised ValueError at the first command: an internal error, exit 1."""
    monkeypatch.setenv("BROKER_REDIS_URL", url)
    monkeypatch.setenv("BROKER_HOME", str(tmp_path))
    for command in (["list"], ["acl", "upgrade"]):
        one_error_line(run(*command), "BROKER_REDIS_URL: not a Redis URL", "redis://")


@pytest.mark.parametrize("name", ["BROKER_REDIS_OUTAGE_S", "BROKER_ROUND_BUDGET_USD"])
def test_a_setting_of_infinite_seconds_or_dollars_is_one_line(env, monkeypatch, name):
    """BROKER_REDIS_OUTAGE_S=inf overflowed in the store's retries: an internal error, exit 1."""
    monkeypatch.setenv(name, "inf")
    one_error_line(run("list"), f"{name}: 'inf' is not a positive number", "or unset it")


def test_a_broker_home_that_cannot_be_made_is_one_line(monkeypatch, tmp_path):
    """Every command that starts the private redis-server ended in an internal error (FileNotFoundError)."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.delenv("BROKER_REDIS_URL", raising=False)
    monkeypatch.setenv("BROKER_HOME", str(tmp_path / "a-file" / "home"))
    one_error_line(run("list"), "BROKER_HOME: cannot make", "a folder you can write")


def test_a_prices_dir_without_the_snapshots_is_one_line(env, monkeypatch, tmp_path):
    monkeypatch.setenv("BROKER_PRICES_DIR", str(tmp_path))
    one_error_line(run("prices"), f"BROKER_PRICES_DIR: {tmp_path} lacks aws_gpu_vms.csv", "or unset it")
