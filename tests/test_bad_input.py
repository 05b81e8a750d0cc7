"""A corpus of bad job specs (tests/data/bad_specs.yaml) and the CLI's error contract: every bad input is exit 2
with one line naming the field, stores nothing, and with --json stdout holds one JSON document, the error."""

import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
import yaml
from test_cli import run

from broker.app import render

CORPUS = yaml.safe_load((Path(__file__).parent / "data" / "bad_specs.yaml").read_text())


def test_the_corpus_is_fifty_distinct_cases():
    assert len(CORPUS) >= 50
    assert len({c["why"] for c in CORPUS}) == len({c["spec"] for c in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("case", CORPUS, ids=[c["why"] for c in CORPUS])
def test_a_bad_spec_is_one_line_naming_its_field_exit_2_and_stores_nothing(env, tmp_path, case):
    path = tmp_path / "job.yaml"
    path.write_text(case["spec"])
    result = run("submit", path, "--json")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and case["expect"] in lines[0], lines
    error = json.loads(result.stdout)["error"]
    assert error["exit_code"] == 2 and error["lines"] == [lines[0].removeprefix("error: ")]
    assert redis.Redis.from_url(env).keys("broker:*") == []


def test_a_missing_job_with_json_is_a_json_error(env):
    result = run("status", "no-such-job", "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"]["kind"] == "NotFoundError"
    assert "no job 'no-such-job'" in result.stderr


@pytest.mark.parametrize(
    "args, expect",
    [
        (["list", "--limit", "-3"], "Invalid value for '--limit'"),
        (["status", "--no-such-flag"], "No such option: --no-such-flag"),
        (["submit"], "Missing argument"),
    ],
)
def test_a_usage_error_with_json_is_a_json_error_too(env, args, expect):
    """Typer finds these before any command runs: the installed command still writes the error as JSON."""
    broker = Path(sys.executable).parent / "broker"
    result = subprocess.run([str(broker), *args, "--json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    error = json.loads(result.stdout)["error"]
    assert error["exit_code"] == 2 and expect in error["message"] and error["lines"] == [error["message"]]
    assert expect in result.stderr  # shown as before


def test_debug_after_the_command_is_taken_as_the_hint_says(env):
    """ "rerun with --debug" is read as `broker list --debug`: typer refused it (no such option: it is broker's own)."""
    broker = Path(sys.executable).parent / "broker"
    for argv in (["list", "--debug"], ["--debug", "list"], ["list", "--debug", "--json"]):
        result = subprocess.run([str(broker), *argv], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and "No such option" not in result.stderr, (argv, result.stderr)


def test_an_internal_error_with_json_is_a_json_error_with_exit_1(env, monkeypatch):
    from broker.store.jobs import Store

    def broken(self):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(Store, "job_count", broken)  # `broker list` asks how many jobs there are
    result = run("list", "--json")
    assert result.exit_code == 1
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "InternalError" and "RuntimeError: disk on fire" in error["message"]


def test_an_agent_refused_by_the_broker_exits_3_with_json_saying_so(env, monkeypatch):
    """A service manager restarts an agent that exits 2 (a Redis outage may end it so) and not one that exits 3."""
    from broker.domain.errors import RefusedError
    from broker.store.jobs import Store

    def refused(self):
        raise RefusedError("token: the broker refused agent a1: no registration token")

    monkeypatch.setattr(Store, "job_count", refused)
    result = run("list", "--json")
    assert result.exit_code == 3 and json.loads(result.stdout)["error"]["exit_code"] == 3


def test_times_are_said_relative_to_now():
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    assert render.relative(now - timedelta(minutes=3), now) == "3 min ago"
    assert render.relative(now + timedelta(hours=16.2), now) == "in 16.2 h"
    assert render.relative(now + timedelta(seconds=20), now) == "now"
    assert render.moment(now + timedelta(hours=2), now) == "2026-11-23 14:00 UTC (in 2.0 h)"


def test_status_says_when_the_job_came_its_deadline_and_spend_in_human_terms(env, tmp_path):
    path = tmp_path / "job.yaml"
    spec = {"name": "t", "run": ["true"], "resources": {"accelerators": ["L4:1"]}, "work": {"gpu_hours": 1}}
    path.write_text(yaml.safe_dump({**spec, "deadline": "+24h", "budget_usd": 20}))
    job_id = json.loads(run("submit", path, "--json").stdout)["job"]
    result = run("status", job_id)
    assert result.exit_code == 0, result.output
    times = next(line for line in result.stdout.splitlines() if line.startswith("submitted"))
    assert "(now)" in times and re.search(r"\(in 2[34]\.\d h\)", times) and "spent $0.0000 of $20.00" in times
    event = next(line for line in result.stdout.splitlines() if "submitted" in line and "queued" in line)
    assert "+00:00" not in event and "(now)" in event


@pytest.mark.parametrize("root", ["nosuch://bucket/ckpt", "{tmp}/a-file/ckpt"], ids=["unknown scheme", "not a folder"])
def test_run_with_checkpoints_it_cannot_use_says_so_before_it_stores_the_job(env, tmp_path, monkeypatch, root):
    """`broker run` submitted the job, then failed on the checkpoint store: the job stayed queued, its id unsaid."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("BROKER_CHECKPOINTS", root.format(tmp=tmp_path))
    path = tmp_path / "job.yaml"
    spec = {"name": "j", "run": "true", "resources": {"accelerators": ["L4:1"]}, "work": {"gpu_hours": 1}}
    path.write_text(yaml.safe_dump(spec))
    result = run("run", path)
    assert result.exit_code == 2 and result.stderr.startswith("error: checkpoints: "), result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert redis.Redis.from_url(env).keys("broker:job*") == []
