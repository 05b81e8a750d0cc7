"""`broker run`: a job end to end on one command, and `broker status` saying what a queued job waits for."""

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from broker.agents.contract import Contract
from broker.app.cli.main import app
from broker.domain.model import JobState
from broker.store.jobs import Store
from conftest import EXAMPLES, NOW, start_redis, stop_redis

runner = CliRunner()


@pytest.fixture
def env(env, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # started elsewhere: the spec's workdir is taken from its own folder
    return env


def spec_file(tmp_path, **fields):
    data = {
        "name": "run-job",
        "run": [sys.executable, "-c", "print('hello from the job')"],
        "resources": {"accelerators": ["L4:1"]},
        "work": {"gpu_hours": 1},
        "deadline": "+24h",
        "budget_usd": 20,
        "max_restarts": 0,
    }
    data.update(fields)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_run_sees_the_example_fine_tune_through_on_a_local_agent(env, store):
    result = runner.invoke(app, ["run", str(EXAMPLES / "finetune-lora.yaml")])
    assert result.exit_code == 0, result.output
    (job,) = store.list_jobs()
    assert job.state.value == "done" and job.runs[0].agent == f"local-{job.id}"
    assert job.runs[0].offer.id == job.quote.chosen.offer.id  # the local agent stands for the quote's choice
    for shown in ("started local agent", "running", "step 400/400", "fine-tune done", f"{job.id} done: $"):
        assert shown in result.stdout
    assert store.agents_with_leases() == []  # the agent it started has stopped, and is not listed as lapsed


def test_run_sees_the_example_batch_inference_through_from_its_checkpointed_cursor(env, store):
    """The example's `run` is a real scorer (it named a script that was not there: four failed runs)."""
    result = runner.invoke(app, ["run", str(EXAMPLES / "batch-inference.yaml")])
    assert result.exit_code == 0, result.output
    (job,) = store.list_jobs()
    assert job.state.value == "done" and job.runs[0].progress_done == 400000
    assert "scored 400000/400000 documents (checkpoint saved)" in result.stdout and "documents scored" in result.stdout


def test_a_job_that_fails_under_run_says_so_and_exits_2(env, store, tmp_path):
    path = spec_file(tmp_path, run=[sys.executable, "-c", "print('bad input'); raise SystemExit(3)"])
    result = runner.invoke(app, ["run", str(path)])
    assert result.exit_code == 2, result.output
    (job,) = store.list_jobs()
    assert job.state.value == "failed" and "bad input" in result.stdout
    assert f"{job.id} failed: failed once (exit code 3)" in result.stderr and f"broker logs {job.id}" in result.stderr
    assert "below" not in result.stderr  # the error line is the last thing it prints
    shown = runner.invoke(app, ["status", job.id, "--no-outlook"]).stdout
    assert "last output:\n  | bad input" in shown  # where the job's last lines are


def test_a_job_whose_program_is_missing_is_told_it_could_not_start_and_why(env, store, tmp_path):
    result = runner.invoke(app, ["run", str(spec_file(tmp_path, run=["no-such-program", "--x"]))])
    assert result.exit_code == 2, result.output
    (job,) = store.list_jobs()
    assert job.state.value == "failed" and job.runs[0].exit_code is None
    assert "could not start: [Errno 2] No such file or directory: 'no-such-program'" in " ".join(result.stderr.split())
    assert "exit code None" not in result.output


def test_status_says_what_a_queued_job_waits_for(env, store, catalog, tmp_path):
    job_id = json.loads(runner.invoke(app, ["submit", str(spec_file(tmp_path)), "--json"]).stdout)["job"]

    def waiting():
        return json.loads(runner.invoke(app, ["status", job_id, "--json"]).stdout)["waiting_for"]

    assert "no broker server is running" in waiting()
    from broker.core.waiting import waiting_for

    here = waiting_for(store, store.get_job(job_id), planning_here=True)  # `broker run` plans: it waits for no server
    assert "no agent is registered" in here
    store.lead("another-replica", 60_000)
    assert "no agent is registered" in waiting()
    h100 = next(o for o in catalog.offers if o.accelerator == "H100")
    Contract(store, "big").register(h100, 60_000, host="h", pid=1, at=NOW)
    n = h100.accelerator_count
    assert waiting() == f"no registered agent fits it: big ({h100.id}): H100:{n} is not among its accelerators (L4:1)"
    l4 = next(o for o in catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1)
    Contract(store, "small").register(l4, 60_000, host="h", pid=1, at=NOW)
    assert waiting() == "the next planning round"

    def small_holds(job: str | None) -> None:
        with store.redis.pipeline() as pipe:
            store.put_agent(pipe, store.get_agent("small").model_copy(update={"job": job, "fence": 1}))
            pipe.execute()

    small_holds(job_id)  # dispatched to it, and its start not reported yet
    assert waiting() == "starting on small"
    small_holds("another")
    assert waiting() == "every agent that fits it is busy"
    small_holds(None)
    shown = runner.invoke(app, ["status", job_id]).stdout
    assert "waiting: the next planning round" in shown


def test_run_says_the_end_after_the_jobs_last_output(env, store, tmp_path):
    result = runner.invoke(app, ["run", str(spec_file(tmp_path))])
    assert result.exit_code == 0, result.output
    assert result.stdout.index("── done") > result.stdout.index("hello from the job")


def test_run_given_a_submitted_jobs_id_sees_that_job_through(env, store, tmp_path):
    """A job submitted with no server and no agent (or left by a `broker run` stopped with Ctrl-C, or resumed by
    `broker amend --budget`) is taken up by `broker run JOB`: no second job, its own run and output."""
    job_id = json.loads(runner.invoke(app, ["submit", str(spec_file(tmp_path)), "--json"]).stdout)["job"]
    refused = runner.invoke(app, ["run", job_id, "--budget", "30"])
    assert (
        refused.exit_code == 2 and f"--budget: {job_id} is submitted already; `broker amend {job_id}`" in refused.stderr
    )
    result = runner.invoke(app, ["run", job_id[:-3]])  # its start, as other commands take it
    assert result.exit_code == 0, result.output
    assert f"seeing {job_id} through: queued" in result.stdout and "hello from the job" in result.stdout
    assert [j.id for j in store.list_jobs()] == [job_id] and store.get_job(job_id).state == JobState.done
    again = runner.invoke(app, ["run", job_id])
    assert again.exit_code == 2 and f"job: {job_id} is already done; nothing to run" in again.stderr
    missing = runner.invoke(app, ["run", str(tmp_path / "nothing.yaml")])
    assert missing.exit_code == 2 and "nothing.yaml" in missing.stderr  # neither a file nor a job: the file's error


def processes_naming(word: str) -> dict[int, str]:
    """This machine's processes whose command lines hold `word`: pid -> command line."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if word in (line := cmdline.read_bytes().replace(b"\0", b" ").decode()):
                found[int(cmdline.parent.name)] = line
    return found


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


def running_under_run(tmp_path, program="import time; time.sleep(300)", **env) -> tuple[subprocess.Popen, str]:
    """`broker run` of a job that sleeps (its argv names tmp_path), once the job runs: (the command, its job id).
    A command that has not got there in 120 s is killed, and the test fails rather than hangs."""
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
            if "── running" in line:
                both = processes_naming(f"local-{job_id}") and processes_naming(sleeping(tmp_path))
                assert both, what_ran(tmp_path, job_id, env)  # both run
                return command, job_id
    finally:
        stuck.cancel()
    command.kill()
    pytest.fail(f"`broker run` ended (or was killed after 120 s) before its job ran: {command.stderr.read()}")


def test_a_job_cancelled_under_run_has_its_run_closed_before_run_exits(env, store, tmp_path):
    """`broker run` ended as soon as its job did: the agent's exit, which closes the run with its cost and its
    checkpoint, came after and no server was left to fold it. The run stayed under way, its spend counting up, and a
    job the budget cap stopped could never be resumed ("still stopping"). This job takes 3 s to stop, as a save."""
    saves = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: (time.sleep(3), sys.exit(0)))"
    command, job_id = running_under_run(tmp_path, program=f"{saves}; time.sleep(300)")
    try:
        assert runner.invoke(app, ["cancel", job_id]).exit_code == 0
        assert command.wait(timeout=90) == 2
        (ran,) = store.get_job(job_id).runs
        assert ran.ended_at is not None and ran.end_reason in ("fenced", "cancelled"), ran
    finally:
        command.kill()


def test_run_of_a_job_running_already_follows_it_without_starting_an_agent(env, store, tmp_path):
    command, job_id = running_under_run(tmp_path)
    broker = Path(sys.executable).parent / "broker"
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
        command.kill()


def test_a_job_left_by_ctrl_c_is_taken_up_by_run_with_its_id_without_its_earlier_output(env, store, tmp_path):
    command, job_id = running_under_run(tmp_path, program="print('hello', flush=True); import time; time.sleep(300)")
    broker = Path(sys.executable).parent / "broker"
    try:
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
    finally:
        command.kill()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=lambda signum: signum.name)
def test_run_killed_stops_the_agent_it_started_as_ctrl_c_does(env, tmp_path, signum):
    """`kill` (SIGTERM) or a closed terminal (SIGHUP) ended `broker run` at once: its local agent ran on, orphaned."""
    command, job_id = running_under_run(tmp_path)
    try:
        command.send_signal(signum)
        assert command.wait(timeout=60) == 2
        assert f"stopped following {job_id}" in command.stderr.read()
        assert processes_naming(f"local-{job_id}") == {} and processes_naming(sleeping(tmp_path)) == {}
    finally:
        command.kill()


def test_an_agent_stopped_while_redis_is_away_still_stops_its_job(tmp_path):
    """Redis gone mid-run: `broker run` fails and stops its agent, which cannot report but still stops its job (it
    waited for Redis, and was killed 10 s later with its job running on, orphaned)."""
    proc, port = start_redis(tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        command, job_id = running_under_run(
            tmp_path, BROKER_REDIS_URL=url, BROKER_HOME=str(tmp_path / "home"), BROKER_REDIS_OUTAGE_S="2"
        )
    finally:
        stop_redis(proc, port)
    try:
        assert command.wait(timeout=60) == 2
        assert "error: redis: lost the connection" in command.stderr.read()  # not an internal error
        assert processes_naming(f"local-{job_id}") == {} and processes_naming(sleeping(tmp_path)) == {}
    finally:
        command.kill()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP], ids=lambda signum: signum.name)
def test_an_agent_stopped_by_ctrl_c_or_a_closed_terminal_leaves_as_on_sigterm(env, tmp_path, signum):
    """The job runs in a session of its own: an agent that ended at once on these left it running, orphaned."""
    command, job_id = running_under_run(tmp_path)
    try:
        job, agent = sleeping(tmp_path), f"--id local-{job_id}"
        ((pid, _),) = processes_naming(agent).items()
        os.kill(pid, signum)
        deadline = time.monotonic() + 30
        while (processes_naming(job) or processes_naming(agent)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_naming(job) == {} and processes_naming(agent) == {}  # the job checkpointed, stopped
    finally:
        command.kill()
        command.wait()


def test_logs_follow_of_a_queued_job_says_what_it_waits_for_and_ends_with_it(env, tmp_path):
    """It printed nothing while the job waited (no server here), so a user could not tell a wait from a hang."""
    job_id = json.loads(runner.invoke(app, ["submit", str(spec_file(tmp_path)), "--json"]).stdout)["job"]
    broker = Path(sys.executable).parent / "broker"
    follow = subprocess.Popen(
        [str(broker), "logs", job_id, "--follow"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in follow.stdout], daemon=True).start()
    try:
        assert [lines.get(timeout=30), lines.get(timeout=30)] == [
            "── queued\n",
            f"── waiting: no broker server is running: start `broker server` (or `broker run {job_id}`)\n",
        ]
        assert runner.invoke(app, ["cancel", job_id]).exit_code == 0
        assert follow.wait(timeout=30) == 0
        assert lines.get(timeout=5).startswith("── cancelled") and "it never ran" in lines.get(timeout=5)
    finally:
        follow.kill()


def test_run_starts_a_local_agent_unless_an_idle_one_fits_the_job(env, store, catalog):
    from broker import planning
    from broker.app.run import idle_agent_fits
    from broker.domain.model import AgentInfo, Job
    from conftest import make_spec

    spec = make_spec(name="l4", resources={"accelerators": ["L4:1"]})
    quote = planning.get().quote(spec, catalog.offers, NOW)
    job = Job(id="l4-1", spec=spec, submitted_at=NOW, updated_at=NOW, quote=quote)
    assert not idle_agent_fits(store, job, job.spec)  # none registered

    def idle(agent_id, accelerator):
        offer = next(o for o in catalog.offers if o.accelerator == accelerator and o.accelerator_count == 1)
        store.register_agent(AgentInfo(id=agent_id, offer=offer, host="h", pid=1, registered_at=NOW), 60_000)

    idle("a100-1", "A100")
    assert not idle_agent_fits(store, job, job.spec)  # idle, but the job asks for an L4
    idle("l4-agent", "L4")
    assert idle_agent_fits(store, job, job.spec)


def test_run_of_a_waiting_job_whose_agent_another_run_starts_starts_none(env, store, tmp_path):
    """Two `broker run JOB` of one waiting job both started agent local-JOB: the second's record took the first's
    report key, and the agent running the job had its reports refused. The first to claim the id starts it."""
    job_id = json.loads(runner.invoke(app, ["submit", str(spec_file(tmp_path)), "--json"]).stdout)["job"]
    agent = f"local-{job_id}"
    assert store.claim_agent_start(agent, 60_000)  # another `broker run` is starting it
    assert not store.claim_agent_start(agent, 60_000)
    broker = Path(sys.executable).parent / "broker"
    second = subprocess.Popen(
        [str(broker), "run", job_id], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        lines = [second.stdout.readline() for _ in range(2)]
        assert lines[1] == f"── waiting: another `broker run` starts agent {agent} for it\n", lines
        time.sleep(2)  # rounds go on: it still starts none
        assert processes_naming(f"--id {agent}") == {}
        store.release_agent_start(agent)  # that start failed: this one starts it
        assert second.wait(timeout=120) == 0
        rest = second.stdout.read()
        assert f"started local agent {agent}" in rest and "hello from the job" in rest
        assert store.get_job(job_id).state == JobState.done and store.claim_agent_start(agent, 1)  # released
    finally:
        second.kill()


def test_run_runs_its_job_on_the_agent_it_starts_not_a_job_queued_before(env, store, tmp_path):
    """The agent `broker run` started was planned like any other: a more urgent queued job took it first, and the
    user's job waited behind it ("every agent that fits it is busy"), for as long as that one ran."""
    first = spec_file(tmp_path, name="queued-first", priority=5)
    other = json.loads(runner.invoke(app, ["submit", str(first), "--json"]).stdout)["job"]
    result = runner.invoke(app, ["run", str(spec_file(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "hello from the job" in result.stdout and "busy" not in result.stdout
    assert store.get_job(other).state == JobState.queued  # left to a server and agents of its own


def test_run_of_a_job_the_guard_moved_to_on_demand_starts_an_on_demand_agent(env, store, tmp_path):
    """`broker run` started one agent, for the quote's spot choice: a job the guard then pinned to on-demand went back
    to it (and was moved again), or, planned like any, waited for an on-demand agent no one would start."""
    from broker.domain.model import Tier

    job_id = json.loads(runner.invoke(app, ["submit", str(spec_file(tmp_path)), "--json"]).stdout)["job"]
    assert store.get_job(job_id).quote.chosen.offer.tier == Tier.spot
    store.update_job(job_id, lambda j: j.model_copy(update={"pinned_tier": Tier.on_demand}))  # as the guard does
    result = runner.invoke(app, ["run", job_id])
    assert result.exit_code == 0, result.output
    (ran,) = store.get_job(job_id).runs
    assert ran.offer.tier == Tier.on_demand and ran.agent == f"local-{job_id}" and "hello from the job" in result.stdout
