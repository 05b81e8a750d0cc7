"""The job contract: a job started by the runner, stopped by SIGTERM or killed, resumes exactly."""

import sys
import time
from pathlib import Path

import torch

from broker.agents.checkpoints import CheckpointStore
from broker.agents.runner import JobProcess, job_argv
from conftest import assert_same_weights, make_spec, run_to_end, train_spec


def wait_for(job, predicate, timeout_s=60):
    """Poll the job's events until one satisfies `predicate`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for event in job.events():
            if predicate(event):
                return event
        assert job.poll() is None, job.log_tail()
        time.sleep(0.02)
    raise AssertionError("timed out waiting for the job's event")


def test_preempted_job_resumes_with_identical_weights(tmp_path, uninterrupted):
    out = tmp_path / "final.pt"
    spec = train_spec(OUTPUT=str(out), STEP_SLEEP_S="0.03")
    root = tmp_path / "ckpt"
    first = JobProcess(spec, "train", f"{root}/train", tmp_path / "run1")
    first.start()
    reached = wait_for(first, lambda e: e["type"] == "progress" and e["done"] >= 23)["done"]
    assert first.stop(grace_s=30) == 0  # SIGTERM: it checkpoints and exits by itself
    events = first.events()
    stopped_at = max([reached] + [e["done"] for e in events if e["type"] == "progress"])
    latest, skipped = CheckpointStore(root).latest_verified("train")
    assert skipped == [] and latest.step == stopped_at >= 23  # saved on SIGTERM: no work lost
    assert [e["step"] for e in events if e["type"] == "checkpoint"][-1] == stopped_at

    run_to_end(spec, "train", root, tmp_path / "run2", resume_from=latest.url)
    assert_same_weights(torch.load(out), uninterrupted)


def test_a_checkpoint_request_is_saved_at_the_next_step_and_the_job_runs_on(tmp_path, uninterrupted):
    out = tmp_path / "final.pt"
    spec = train_spec(OUTPUT=str(out), STEP_SLEEP_S="0.03", CKPT_EVERY="1000")
    job = JobProcess(spec, "train", f"{tmp_path}/ckpt/train", tmp_path / "run")
    job.start()
    asked_at = wait_for(job, lambda e: e["type"] == "progress" and e["done"] >= 13)["done"]
    job.request_checkpoint()
    saved = wait_for(job, lambda e: e["type"] == "checkpoint")["step"]
    # the job reports step 13's progress before it asks should_save(): a request made between the two is saved at 13
    assert asked_at <= saved < asked_at + 10 and not job.checkpoint_request.exists()  # the save answered it
    assert job.wait(timeout=60) == 0 and [m.step for m in CheckpointStore(tmp_path / "ckpt").manifests("train")] == [
        saved
    ]  # one save: the request, not a periodic one, and the job went on to the end
    assert_same_weights(torch.load(out), uninterrupted)


def test_killed_job_resumes_from_its_last_checkpoint_losing_at_most_one_interval(tmp_path, uninterrupted):
    out = tmp_path / "final.pt"
    spec = train_spec(OUTPUT=str(out), STEP_SLEEP_S="0.03")
    root = tmp_path / "ckpt"
    first = JobProcess(spec, "train", f"{root}/train", tmp_path / "run1")
    first.start()
    reached = wait_for(first, lambda e: e["type"] == "progress" and e["done"] >= 27)["done"]
    first.kill()  # no notice: the instance vanished
    last_done = max([reached] + [e["done"] for e in first.events() if e["type"] == "progress"])
    latest, _ = CheckpointStore(root).latest_verified("train")
    # a save every 10 steps: at most one interval lost (on a busy machine the job may pass 30 before the kill lands)
    assert latest.step >= 20 and latest.step % 10 == 0 and last_done - latest.step <= 10

    resumed = run_to_end(spec, "train", root, tmp_path / "run2", resume_from=latest.url)
    assert {"type": "restored", "step": latest.step}.items() <= next(
        e for e in resumed.events() if e["type"] == "restored"
    ).items()
    assert_same_weights(torch.load(out), uninterrupted)


def test_a_corrupt_resume_checkpoint_falls_back_to_the_previous_one(tmp_path, uninterrupted):
    out = tmp_path / "final.pt"
    spec = train_spec(OUTPUT=str(out), STEPS="60")
    root = tmp_path / "ckpt"
    store = CheckpointStore(root)
    partial_spec = train_spec(OUTPUT=str(tmp_path / "unused.pt"), STEPS="30")  # same job, stopped at 30
    run_to_end(partial_spec, "train", root, tmp_path / "run1")
    newest = store.manifests("train")[0]
    assert newest.step == 30
    (Path(store.path(newest.url)) / "state.pt").write_bytes(b"garbage")
    resumed = run_to_end(spec, "train", root, tmp_path / "run2", resume_from=newest.url)
    kinds = {e["type"]: e for e in resumed.events()}
    assert kinds["checkpoint_skipped"]["url"] == newest.url and kinds["restored"]["step"] == 20
    assert_same_weights(torch.load(out), uninterrupted)


def test_job_sees_the_contract_environment(tmp_path):
    spec = make_spec(
        run=[
            sys.executable,
            "-c",
            "import os; print(os.environ['BROKER_JOB_ID'], os.environ['BROKER_RESUME_FROM'], os.environ['MY_VAR'])",
        ],
        env={"MY_VAR": "x"},
    )
    job = JobProcess(spec, "job-7", "/tmp/ckpt/job-7", tmp_path, resume_from="/tmp/ckpt/job-7/step-1")
    job.start()
    assert job.wait(timeout=30) == 0
    assert job.log_tail() == ["job-7 /tmp/ckpt/job-7/step-1 x"]


def test_a_job_run_by_hand_runs_to_its_end_saving_nothing_and_says_so_once(tmp_path):
    """A user tries their script before submitting it: its first save raised, since no agent set
    BROKER_CHECKPOINT_DIR, and the script died there."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env |= {"STEPS": "6", "CKPT_EVERY": "2", "OUTPUT": str(tmp_path / "final.pt")}
    script = Path(__file__).parents[1] / "examples" / "jobs" / "train_mlp.py"
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and (tmp_path / "final.pt").exists(), done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("broker: ")]
    assert said == [
        "broker: BROKER_CHECKPOINT_DIR is not set (an agent sets it; export it to keep them when run by "
        "hand): checkpoints are not saved"
    ]  # three saves, one note


def test_argv_is_not_run_through_a_shell_unless_asked(tmp_path):
    plain = JobProcess(make_spec(run=["echo", "$HOME", "a;b"]), "j", "/tmp/c/j", tmp_path / "a")
    plain.start()
    plain.wait(timeout=10)
    assert plain.log_tail() == ["$HOME a;b"]
    shell = JobProcess(make_spec(run="echo one; echo two", shell=True), "j", "/tmp/c/j", tmp_path / "b")
    assert job_argv(shell.spec) == ["bash", "-c", "echo one; echo two"]
    shell.start()
    shell.wait(timeout=10)
    assert shell.log_tail() == ["one", "two"]


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    spec = make_spec(run="trap '' TERM; echo trapped; sleep 30 & wait; sleep 30", shell=True)
    job = JobProcess(spec, "stubborn", "/tmp/c/s", tmp_path)
    job.start()
    deadline = time.monotonic() + 30
    while job.log_tail() != ["trapped"] and time.monotonic() < deadline:  # a busy machine: bash may take a while
        time.sleep(0.05)
    started = time.monotonic()
    assert job.stop(grace_s=0.5) == -9
    assert time.monotonic() - started < 5


def test_a_failed_setup_ends_the_job_with_its_code_and_says_so(tmp_path):
    job = JobProcess(make_spec(run=["echo", "ran"], setup="echo installing; exit 3"), "j", "/tmp/c/j", tmp_path)
    job.start()
    assert job.wait(timeout=10) == 3
    assert job.log_tail() == ["installing", "broker: setup exited with 3"]  # the job itself never ran


def test_the_setup_runs_where_the_job_does_with_its_env_then_the_job_with_its_argv(tmp_path):
    spec = make_spec(run=["echo", "$HOME", "a;b"], setup='echo "setup in $PWD with $GREETING"', workdir=str(tmp_path))
    job = JobProcess(spec.model_copy(update={"env": {"GREETING": "hi"}}), "j", "/tmp/c/j", tmp_path / "run")
    job.start()
    assert job.wait(timeout=10) == 0
    assert job.log_tail() == [f"setup in {tmp_path} with hi", "$HOME a;b"]


def test_the_agents_own_broker_settings_never_reach_the_job(tmp_path, monkeypatch):
    monkeypatch.setenv("BROKER_REDIS_URL", "rediss://agent:s3cret@redis.example:6380/0")
    code = "import os; print(sorted(k for k in os.environ if k.startswith('BROKER_')))"
    job = JobProcess(make_spec(run=[sys.executable, "-c", code]), "j", "/tmp/c/j", tmp_path)
    job.start()
    job.wait(timeout=30)
    assert job.log_tail() == [
        "['BROKER_CHECKPOINT_DIR', 'BROKER_CHECKPOINT_REQUEST', 'BROKER_EVENTS_FILE', 'BROKER_JOB_ID', "
        "'BROKER_RESUME_FROM']"
    ]


def test_a_workdir_under_home_is_this_machines_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "project").mkdir()
    spec = make_spec(run=[sys.executable, "-c", "import os; print(os.getcwd())"], workdir="~/project")
    job = JobProcess(spec, "j", "/tmp/c/j", tmp_path / "runs")
    job.start()
    assert job.wait(timeout=30) == 0
    assert job.log_tail() == [str(tmp_path / "project")]
