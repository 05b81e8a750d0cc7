"""`broker run`: a job end to end on one command, and `broker status` saying what a queued job waits for."""

import contextlib
import json
import os
import queue
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
from conftest import EXAMPLES, NOW

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
    assert store.planner() is None  # it planned (no server did) and gave the lease up: a server now plans at once


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
    submitted = json.loads(runner.invoke(app, ["submit", str(spec_file(tmp_path)), "--json"]).stdout)
    job_id = submitted["job"]
    assert "no broker server is running" in submitted["waiting_for"]  # submit says it too: it said nothing of it
    shown = runner.invoke(app, ["submit", str(spec_file(tmp_path))]).stdout
    assert "\nwaiting: no broker server is running: start `broker server` (or `broker run " in shown

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
            store.set_agent_job(pipe, store.get_agent("small"), job, 1)
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
