"""`broker run` stopped under way (Ctrl-C, `kill`, a closed terminal, a cancel, Redis gone) and its agent stopped
alone: the agent and the job stop too, the run is closed, and `broker run JOB` takes the job up again."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_run import processes_naming, runner, spec_file

from broker.app.cli.main import app
from broker.store.jobs import Store
from conftest import start_redis, stop_redis


@pytest.fixture
def env(env, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # as test_run.py's: the spec's workdir is taken from its own folder
    return env


def sleeping(tmp_path) -> str:
    """What the command line of running_under_run's job holds: nothing else on the machine does."""
    return f"time.sleep(300) {tmp_path}"


def what_ran(tmp_path, job_id: str, env: dict) -> str:
    """What became of a job `broker run` said runs: its runs as the store has them, the agent's log, each run's
    output (a failure of running_under_run says whether the job exited, was stopped, or was never started)."""
    home = Path(env.get("BROKER_HOME", tmp_path / "home"))
    store = Store(env.get("BROKER_REDIS_URL", os.environ["BROKER_REDIS_URL"]))
    said = [
        f"runs: {[(r.fence, r.agent, r.started_at, r.end_reason, r.exit_code) for r in store.get_job(job_id).runs]}"
    ]
    for _, report in store.redis.xrange(store.key("agent-events")):  # the pid each start reported, and its state
        if report.get("job") == job_id and report.get("type") == "started":
            pid = json.loads(report["data"]).get("pid")
            try:  # a zombie (exited, not yet reaped by its agent) has no command line to be found by
                state = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("State"))
            except OSError:
                state = "no such process"
            said.append(f"started pid {pid}: {state}")
    time.sleep(1)  # a process seen late, or one that ended meanwhile
    said.append(f"a second later, processes naming {tmp_path}: {processes_naming(str(tmp_path))}")
    for path in sorted((home / "runs").rglob("*.log")):
        said.append(f"{path.relative_to(home)}: {path.read_text(errors='replace')[-3000:]}")
    return "\n".join(said)


@contextlib.contextmanager
def running_under_run(tmp_path, program="import time; time.sleep(300)", **env):
    """`broker run` of a job that sleeps (its argv names tmp_path), once the job runs: (the command, its job id),
    killed on leaving. A command that has not got there in 120 s is killed, and the test fails rather than hangs."""
    path = spec_file(tmp_path, run=[sys.executable, "-c", program, str(tmp_path)])
    broker = Path(sys.executable).parent / "broker"
    command = subprocess.Popen(
        [str(broker), "run", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
    )
    job_id, stuck = None, threading.Timer(120, command.kill)
    stuck.start()
    try:
        for line in command.stdout:  # until the job runs on the agent it started
            job_id = job_id or (line.split()[1] if line.startswith("job ") else None)
            if "── running" in line:  # both run; a fresh clone twice saw one's command line missing at this
                deadline = time.monotonic() + 5  # instant and there a second later: looked for 5 s
                while not (processes_naming(f"local-{job_id}") and processes_naming(sleeping(tmp_path))):
                    assert time.monotonic() < deadline, what_ran(tmp_path, job_id, env)
                    time.sleep(0.1)
                stuck.cancel()
                yield command, job_id
                return
        pytest.fail(f"`broker run` ended (or was killed after 120 s) before its job ran: {command.stderr.read()}")
    finally:
        stuck.cancel()
        command.kill()
        command.wait()


def test_a_job_cancelled_under_run_has_its_run_closed_before_run_exits(env, store, tmp_path):
    """`broker run` ended as soon as its job did: the agent's exit, which closes the run with its cost and its
    checkpoint, came after and no server was left to fold it. The run stayed under way, its spend counting up, and a
    job the budget cap stopped could never be resumed ("still stopping"). This job takes 3 s to stop, as a save."""
    saves = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: (time.sleep(3), sys.exit(0)))"
    with running_under_run(tmp_path, program=f"{saves}; time.sleep(300)") as (command, job_id):
        assert runner.invoke(app, ["cancel", job_id]).exit_code == 0
        assert command.wait(timeout=90) == 2
        (ran,) = store.get_job(job_id).runs
        assert ran.ended_at is not None and ran.end_reason in ("fenced", "cancelled"), ran


def test_run_of_a_job_running_already_follows_it_without_starting_an_agent(env, store, tmp_path):
    broker = Path(sys.executable).parent / "broker"
    with running_under_run(tmp_path) as (command, job_id):
        follower = subprocess.Popen(
            [str(broker), "run", job_id], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        try:
            assert follower.stdout.readline().startswith(f"seeing {job_id} through: running")
            assert runner.invoke(app, ["cancel", job_id]).exit_code == 0
            assert follower.wait(timeout=90) == 2 and command.wait(timeout=90) == 2
            assert "started local agent" not in follower.stdout.read()
            assert [a.id for a in store.agents()] == []  # the one agent, `broker run`'s first, stopped and unregistered
        finally:
            follower.kill()


def test_a_job_left_by_ctrl_c_is_taken_up_by_run_with_its_id_without_its_earlier_output(env, store, tmp_path):
    broker = Path(sys.executable).parent / "broker"
    hello = "print('hello', flush=True); import time; time.sleep(300)"
    with running_under_run(tmp_path, program=hello) as (command, job_id):
        command.send_signal(signal.SIGINT)
        assert command.wait(timeout=60) == 2 and f"`broker run {job_id}` takes it up" in command.stderr.read()
        assert store.get_job(job_id).pending  # its agent's exit folded: back in the queue, not running on no agent
        again = subprocess.Popen(
            [str(broker), "run", job_id], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        seen = []
        for line in again.stdout:
            seen.append(line)
            if line.startswith("hello"):
                break
        assert runner.invoke(app, ["cancel", job_id]).exit_code == 0
        assert again.wait(timeout=90) == 2
        said = "".join(seen)
        assert f"1 earlier run(s) ended: `broker logs {job_id}` has their output" in said
        assert said.count("hello") == 1 and "── run 2 on" in said and "── run 1 on" not in said
        assert [r.fence for r in store.get_job(job_id).runs] == [1, 2]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=lambda signum: signum.name)
def test_run_killed_stops_the_agent_it_started_as_ctrl_c_does(env, tmp_path, signum):
    """`kill` (SIGTERM) or a closed terminal (SIGHUP) ended `broker run` at once: its local agent ran on, orphaned."""
    with running_under_run(tmp_path) as (command, job_id):
        command.send_signal(signum)
        assert command.wait(timeout=60) == 2
        assert f"stopped following {job_id}" in command.stderr.read()
        assert processes_naming(f"local-{job_id}") == {} and processes_naming(sleeping(tmp_path)) == {}


def test_an_agent_stopped_while_redis_is_away_still_stops_its_job(tmp_path):
    """Redis gone mid-run: `broker run` fails and stops its agent, which cannot report but still stops its job (it
    waited for Redis, and was killed 10 s later with its job running on, orphaned)."""
    proc, port = start_redis(tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    env = {"BROKER_REDIS_URL": url, "BROKER_HOME": str(tmp_path / "home"), "BROKER_REDIS_OUTAGE_S": "2"}
    try:
        with running_under_run(tmp_path, **env) as (command, job_id):
            stop_redis(proc, port)
            assert command.wait(timeout=60) == 2
            assert "error: redis: lost the connection" in command.stderr.read()  # not an internal error
            assert processes_naming(f"local-{job_id}") == {} and processes_naming(sleeping(tmp_path)) == {}
    finally:
        stop_redis(proc, port)  # had the job not got to run


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP], ids=lambda signum: signum.name)
def test_an_agent_stopped_by_ctrl_c_or_a_closed_terminal_leaves_as_on_sigterm(env, tmp_path, signum):
    """The job runs in a session of its own: an agent that ended at once on these left it running, orphaned."""
    with running_under_run(tmp_path) as (command, job_id):
        job, agent = sleeping(tmp_path), f"--id local-{job_id}"
        ((pid, _),) = processes_naming(agent).items()
        os.kill(pid, signum)
        deadline = time.monotonic() + 30
        while (processes_naming(job) or processes_naming(agent)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_naming(job) == {} and processes_naming(agent) == {}  # the job checkpointed, stopped
