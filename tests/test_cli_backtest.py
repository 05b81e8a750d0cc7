"""`broker backtest` as a user runs it: its JSON and files, its options (measured bubble profiles, a warm broker),
one-line refusals of bad input, and a kill that stops its scratch redis-server."""

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from subprocess import DEVNULL

import pytest
from typer.testing import CliRunner

from broker.app.cli.main import app
from broker.sim import backtest

START = datetime(2023, 2, 15, tzinfo=UTC)


def test_cli_backtest_json_and_output_directory(tmp_path):
    out = tmp_path / "bt"
    result = CliRunner().invoke(
        app,
        [
            "backtest",
            "--jobs",
            "3",
            "--seed",
            "2",
            "--tick-minutes",
            "30",
            "--policies",
            "uniform-progress,costslo+bubbles,omniscient",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    names = [row["policy"] for row in body["policies"]]
    assert names == ["uniform-progress", "costslo+bubbles", "omniscient", backtest.JOINT, backtest.SCHEDULE]
    for row in body["policies"]:
        assert {
            "policy",
            "cost_usd",
            "savings_pct",
            "deadline_misses",
            "cost_vs_omniscient",
            "migrations",
            "work_lost_h",
            "median_abs_cost_error_pct",
            "p90_abs_cost_error_pct",
            "brier",
        } <= row.keys()
        assert row["cost_usd"] > 0 and not math.isnan(row["cost_usd"])
    for name in (
        "policies.csv",
        "jobs.csv",
        "spend.csv",
        "summary.json",
        "cost_by_policy.png",
        "spend_over_time.png",
        "tier_mix.png",
    ):
        assert (out / name).stat().st_size > 0, name
    assert (out / "cost_by_policy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_backtest_warm_starts_each_broker_with_measured_jobs_that_are_not_its_own():
    args = ["backtest", "--jobs", "3", "--tick-minutes", "30", "--policies", "on-demand,costslo", "--json"]
    cold, warm = (json.loads(CliRunner().invoke(app, args + extra).stdout) for extra in ([], ["--warm"]))
    assert (cold["warm"], warm["warm"]) == (False, True)
    rows = {body["warm"]: {r["policy"]: r for r in body["policies"]} for body in (cold, warm)}
    cold_od, warm_od = rows[False]["on-demand"], rows[True]["on-demand"]
    assert warm_od["cost_usd"] == cold_od["cost_usd"]  # the same 3 jobs, none of the history's
    assert warm_od["p90_abs_cost_error_pct"] != cold_od["p90_abs_cost_error_pct"]  # quoted at the measured spread


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policies", "cheapest,nope"], "policies: unknown policy 'nope'"),
        (["--traces", "/nonexistent/traces"], "traces: /nonexistent/traces is not a directory"),
        (["--jobs", "0"], "Invalid value for '--jobs'"),
    ],
)
def test_cli_backtest_refuses_bad_input_with_one_line(args, message):
    result = CliRunner().invoke(app, ["backtest", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_cli_backtest_takes_measured_bubble_profiles_and_refuses_a_bad_file(tmp_path):
    from broker.bubbles.profiler import forecast

    def bubble_hours(free_gb):
        measured = forecast("measured", "gpipe", 4, 4, [0.25] * 4, [0.5] * 4, [int(free_gb * 1e9)] * 4, "V100", START)
        path = tmp_path / "profiles.json"
        path.write_text(json.dumps([p.model_dump(mode="json") for p in measured]))
        result = CliRunner().invoke(
            app,
            [
                "backtest",
                "--jobs",
                "4",
                "--seed",
                "1",
                "--tick-minutes",
                "30",
                "--policies",
                "costslo+bubbles",
                "--profiles",
                str(path),
                "--json",
            ],
        )
        assert result.exit_code == 0, result.output
        (row,) = json.loads(result.stdout)["policies"]
        return row["bubble_h"]

    assert bubble_hours(12) > 0
    assert bubble_hours(1) == 0  # no fill job fits in 1 GB: the measured profiles, not the defaults, were used
    (tmp_path / "bad.json").write_text('[{"stage": 1}]')
    bad = CliRunner().invoke(app, ["backtest", "--profiles", str(tmp_path / "bad.json")])
    assert bad.exit_code == 2 and "profiles: " in bad.output and "is not a JSON list of bubble profiles" in bad.output


def scratch_servers() -> dict[int, int]:
    """The running redis-servers of backtests (embedded.scratch: each in a broker-redis- temporary folder): pid ->
    parent pid."""
    found = {}
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        with contextlib.suppress(OSError):
            if cwd.readlink().name.startswith("broker-redis-"):
                found[int(cwd.parent.name)] = int((cwd.parent / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return found


def test_a_killed_backtest_stops_its_scratch_redis_server(tmp_path):
    """A `kill` ended the backtest at once: its scratch redis-server ran on, its parent gone. A backtest that does
    not stop within a minute is aborted, and the failure shows where each of its threads was (faulthandler): a loaded
    full run once saw it run on."""
    broker = Path(sys.executable).parent / "broker"
    stderr = (tmp_path / "stderr").open("w+")
    env = os.environ | {"PYTHONFAULTHANDLER": "1"}
    command = subprocess.Popen([str(broker), "backtest", "--jobs", "40"], stdout=DEVNULL, stderr=stderr, env=env)
    deadline, its_own = time.monotonic() + 60, set()
    try:
        while not its_own:  # the backtest's own (other backtests may run beside this test)
            assert time.monotonic() < deadline and command.poll() is None, "the backtest started no redis-server"
            its_own = {pid for pid, parent in scratch_servers().items() if parent == command.pid}
            time.sleep(0.1)
        command.send_signal(signal.SIGTERM)
        try:
            code = command.wait(timeout=60)
        except subprocess.TimeoutExpired:
            command.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack
            command.wait(timeout=30)
            stderr.seek(0)
            pytest.fail("the backtest ran on a minute after SIGTERM:\n" + stderr.read()[-6000:])
        assert code == 130  # as on Ctrl-C, wherever the signal lands (pydantic's serializer too)
        assert its_own & set(scratch_servers()) == set()
    finally:
        command.kill()
        command.wait()
        stderr.close()
        for pid in its_own & set(scratch_servers()):  # a failed run's: not left to the next tests
            os.kill(pid, signal.SIGKILL)
