"""Agents and the broker server over a real Redis: dispatch, preemption, migration, faults."""

import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from dispatch_system import System, l4_spec, quick_spec
from typer.testing import CliRunner

from broker import planning
from broker.app.cli.main import app
from broker.core.clock import ManualClock
from broker.core.guard import DeadlineGuard
from broker.domain.model import IfLate, JobState, Tier
from broker.models.risk import notice_loss_h
from broker.planning.option_table import PlanItem, work_unsaved
from broker.planning.uniform_progress import progress_of
from conftest import Switch, assert_same_weights, train_spec


def progressed(system, job_id, done):
    run = system.job(job_id).current_run
    return run is not None and run.progress_done >= done


def test_preempted_job_migrates_and_finishes_with_identical_weights(system, tmp_path, uninterrupted):
    notice = Switch()
    system.agent("spot-a", notices=notice)
    system.agent("ondemand-a")
    job = system.broker.submit(train_spec(OUTPUT=str(tmp_path / "final.pt"), STEP_SLEEP_S="0.03"))
    system.drive(lambda: progressed(system, job.id, 23))
    notice.fire()
    system.drive(lambda: system.job(job.id).state == JobState.done)
    done = system.job(job.id)
    assert [(r.agent, r.end_reason) for r in done.runs] == [("spot-a", "preempted"), ("ondemand-a", "finished")]
    first, second = done.runs
    assert first.checkpoint_step >= 23 and second.resume_from == first.checkpoint_url  # saved on the notice
    assert first.work_lost_s == 0 and done.migrations == 1
    assert [r.offer.tier.value for r in done.runs] == ["spot", "on_demand"]
    # the second run may report no progress only when it had none to make: a notice late under load saved step 60
    assert first.progress_points and (second.progress_points or first.checkpoint_step == 60)
    for run in done.runs:  # progress is on the server's clock, like the runs (the dashboard charts both)
        times = [at for at, _ in run.progress_points]
        assert all(run.started_at <= at <= run.ended_at for at in times) and times == sorted(times)
    assert done.cost_usd == pytest.approx(sum(r.offer.price_usd_per_h * r.hours(r.ended_at) for r in done.runs))
    assert_same_weights(torch.load(tmp_path / "final.pt"), uninterrupted)


SLOW_SAVE = """
import time
from broker import sdk
state = sdk.restore()
for step in range(state["step"] if state else 0, 150):
    sdk.progress(step + 1, 150)
    if sdk.should_stop():
        time.sleep(5)  # a large model's save, longer than the agent's lease (3 s)
        sdk.save({"step": step + 1}, step=step + 1)
        raise SystemExit(0)
    time.sleep(0.02)
"""


def test_a_noticed_job_whose_save_outlasts_the_lease_moves_from_that_save(system):
    """The agent renews its lease while the job saves. It did not, so the broker took the run for lost mid-save
    and moved the job from an older checkpoint (here none) while the save went on."""
    notice, ended = Switch(), []
    spot = system.agent("spot-a", notices=notice)
    system.agent("ondemand-a")
    job = system.broker.submit(l4_spec("slow-save", SLOW_SAVE))
    on_its_own = threading.Thread(target=lambda: ended.append(next(o for o in iter(spot.step, "") if o)))
    on_its_own.start()  # the agent turns in its own thread, as its own process would, while the server goes on
    system.drive(lambda: progressed(system, job.id, 20), silent=("spot-a",))
    notice.fire()
    system.drive(lambda: system.job(job.id).state == JobState.done, silent=("spot-a",))
    on_its_own.join(timeout=30)
    done = system.job(job.id)
    assert ended == ["preempted"]
    assert [(r.agent, r.end_reason) for r in done.runs] == [("spot-a", "preempted"), ("ondemand-a", "finished")]
    first, second = done.runs
    assert first.checkpoint_step >= 20 and second.resume_from == first.checkpoint_url


def test_a_job_whose_setup_outlasts_the_lease_runs_once(system):
    """The spec's setup (a pip install, a download) runs in the job's process, the agent turning meanwhile. It ran
    inside the agent's turn, so a setup longer than the lease (3 s) had the broker take each run for lost."""
    system.agent("spot-a")
    job = system.broker.submit(l4_spec("slow-setup", "print('ran')", setup="sleep 5 && echo set up"))
    system.drive(lambda: system.job(job.id).state.terminal, timeout_s=40)
    done = system.job(job.id)
    assert done.state == JobState.done and [(r.agent, r.end_reason) for r in done.runs] == [("spot-a", "finished")]
    assert system.store.read_log("spot-a", job.id, done.runs[0].fence)[1] == ["set up", "ran"]


def test_the_deadline_guard_moves_a_job_falling_behind_from_spot_to_on_demand(system, tmp_path, uninterrupted):
    system.agent("spot-a")
    system.agent("ondemand-a")
    job = system.broker.submit(
        train_spec(OUTPUT=str(tmp_path / "final.pt"), STEP_SLEEP_S="0.03").model_copy(
            update={"deadline": system.server.clock.now() + timedelta(hours=2), "if_late": IfLate.soonest}
        )
    )
    system.drive(lambda: progressed(system, job.id, 15))
    assert system.server.guard() == []  # on schedule: the guard leaves it on spot
    system.server.clock = ManualClock(job.submitted_at + timedelta(hours=1.85))  # R < C + 2d: the safety net
    assert system.server.guard() == [job.id]
    system.drive(lambda: system.job(job.id).state == JobState.done)
    done = system.job(job.id)
    assert [(r.agent, r.end_reason) for r in done.runs] == [("spot-a", "moved"), ("ondemand-a", "finished")]
    assert done.runs[1].resume_from == done.runs[0].checkpoint_url is not None  # checkpointed on the way out
    assert done.pinned_tier == Tier.on_demand and done.migrations == 1
    assert_same_weights(torch.load(tmp_path / "final.pt"), uninterrupted)


def test_near_its_net_the_guard_asks_a_spot_job_for_a_checkpoint_and_it_runs_on(system, tmp_path):
    """A job on spot with no checkpoint since it started: far from the safety net the guard leaves it be; where a
    preemption would put it past the net, it asks for a checkpoint. The agent passes the request to the job (a file
    the SDK reads), the job saves at its next step and runs on, and the checkpoint's report settles the request:
    one save, on the same run, which then finishes. Its checkpoint (8 GB declared: 32 s to write) does not fit in the
    notice of spot-a's cloud (GCE: 30 s), so a preemption would lose all the work since it started."""
    system.agent("spot-a")
    system.agent("ondemand-a")
    spec = train_spec(STEPS="600", CKPT_EVERY="100000", STEP_SLEEP_S="0.03", OUTPUT=str(tmp_path / "final.pt"))
    spec = spec.model_copy(
        update={
            "deadline": system.server.clock.now() + timedelta(hours=2),
            "if_late": IfLate.soonest,
            "checkpoint": spec.checkpoint.model_copy(update={"size_gb": 8.0}),
        }
    )
    job = system.broker.submit(spec)
    system.drive(lambda: progressed(system, job.id, 60))
    current = system.job(job.id)
    item = PlanItem.from_job(current)
    progress = progress_of(item, item.on_demand_h, current.submitted_at, current.submitted_at)
    unsaved_h = work_unsaved(current) * progress.total_h
    assert current.current_run.offer.cloud == "gcp" and notice_loss_h(spec, current.current_run.offer) is None
    # when the time left is the work left (with the reserve for a speed not yet measured) and 2 changeovers, were
    # the job to make no more progress
    assert progress.unsure_h > 0 and progress.elapsed_h == 0
    net_h = progress.slack_h()
    net_at = current.submitted_at + timedelta(hours=net_h)
    guard = DeadlineGuard(system.store, system.server.policy, system.server.consumer)
    assert guard.moves(net_at - timedelta(hours=unsaved_h + 0.2), []) == []
    assert system.job(job.id).current_run.checkpoint_requested_at is None  # the slack covers a preemption
    assert guard.moves(net_at - timedelta(hours=unsaved_h / 2), []) == []  # not moved: asked for a checkpoint
    asked = system.job(job.id)
    assert asked.current_run.checkpoint_requested_at is not None and not asked.move_requested
    system.drive(lambda: system.job(job.id).current_run.checkpoint_step is not None)
    saved = system.job(job.id).current_run
    assert saved.checkpoint_step >= 60 and saved.checkpoint_requested_at is None and saved.agent == "spot-a"
    assert saved.checkpoints_asked == 1  # its write is not counted against the job's measured pace
    system.drive(lambda: system.job(job.id).state == JobState.done)
    done = system.job(job.id)
    assert [(r.agent, r.end_reason) for r in done.runs] == [("spot-a", "finished")]
    assert len(system.reports("checkpoint")) == 1  # one request, one save: the agent passed it on once


def test_an_agent_killed_mid_job_loses_its_lease_and_the_job_resumes_elsewhere(system, tmp_path, uninterrupted):
    spot = system.agent("spot-a")
    system.agent("ondemand-a")
    job = system.broker.submit(train_spec(OUTPUT=str(tmp_path / "final.pt"), STEP_SLEEP_S="0.03"))
    system.drive(lambda: progressed(system, job.id, 27))
    spot.job.kill()  # the instance vanished with its processes: no notice, no exit report
    system.drive(lambda: system.job(job.id).state == JobState.done, silent={"spot-a"})
    done = system.job(job.id)
    assert [(r.agent, r.end_reason) for r in done.runs] == [("spot-a", "lost"), ("ondemand-a", "finished")]
    lost = done.runs[0]
    resumed_step = int(done.runs[1].resume_from.rsplit("-", 1)[1])  # the newest verified one in the store
    assert resumed_step >= lost.checkpoint_step >= 20 and resumed_step in (20, 30)
    steps_per_s = lost.progress_done / (lost.last_progress_at - lost.started_at).total_seconds()
    assert lost.work_lost_s <= 10 / steps_per_s + 0.5  # at most one checkpoint interval (10 steps)
    assert system.store.get_agent("spot-a") is None  # forgotten once its lease lapsed
    assert_same_weights(torch.load(tmp_path / "final.pt"), uninterrupted)


def test_a_round_goes_on_while_the_checkpoint_to_resume_from_is_hashed(system, tmp_path, monkeypatch):
    """The round hashed that checkpoint inline, about 1 s a GB on a local disk: a large one held every dispatch."""
    spot = system.agent("spot-a")
    job = system.broker.submit(train_spec(OUTPUT=str(tmp_path / "final.pt"), STEP_SLEEP_S="0.03"))
    system.drive(lambda: progressed(system, job.id, 15))
    spot.job.kill()  # the instance vanished: the job goes back, to resume from its checkpoint at step 10 or later
    system.drive(lambda: system.job(job.id).pending and not system.store.agents(), silent={"spot-a"})
    hashed, verify = threading.Event(), system.server.checkpoints.verify
    monkeypatch.setattr(system.server.checkpoints, "verify", lambda manifest: (hashed.wait(), verify(manifest))[1])
    system.agent("ondemand-a")
    dispatching = threading.Thread(target=system.server.dispatch)
    dispatching.start()
    dispatching.join(timeout=20)
    hashed.set()
    assert not dispatching.is_alive() and system.job(job.id).pending  # it waits, the round does not
    system.drive(lambda: system.job(job.id).state == JobState.done, silent={"spot-a"})
    resumed = system.job(job.id).runs[-1]
    assert resumed.agent == "ondemand-a" and resumed.resume_from.endswith(("step-000000000010", "step-000000000020"))


def test_a_failing_job_is_retried_then_failed_with_its_last_lines(system):
    system.agent("spot-a")
    spec = l4_spec("crash", "print('loading'); print('boom: bad input'); raise SystemExit(3)", max_restarts=1)
    job = system.broker.submit(spec)
    system.drive(lambda: system.job(job.id).state.terminal)
    failed = system.job(job.id)
    assert failed.state == JobState.failed and failed.restarts == 2
    assert [(r.end_reason, r.exit_code) for r in failed.runs] == [("failed", 3), ("failed", 3)]
    assert failed.log_tail[-2:] == ["loading", "boom: bad input"]


def test_cancelling_a_running_job_stops_it_and_frees_the_agent(system):
    system.agent("spot-a")
    job = system.broker.submit(l4_spec("long", "import time; time.sleep(60)"))
    system.drive(lambda: system.job(job.id).state == JobState.running)
    system.broker.cancel(job.id)
    system.drive(lambda: system.job(job.id).current_run is None, timeout_s=20)
    cancelled = system.job(job.id)
    assert cancelled.state == JobState.cancelled and cancelled.runs[0].end_reason == "fenced"
    assert system.store.get_agent("spot-a").job is None


def test_a_real_agent_process_killed_with_sigkill_hands_its_job_to_another(system, tmp_path, uninterrupted, redis_url):
    import os
    import signal

    from broker.agents.provision import LocalProvisioner

    # the provisioner's own 5 s lease: with 2 s, a fresh clone's run beside a benchmark (load 5 on 2 cores) saw the
    # agent miss its renewal ("lease lapsed; re-registering"), its run lost and the job run again before the kill
    provisioner = LocalProvisioner(redis_url, system.root, tmp_path / "agents")
    victim = provisioner.start("spot-a", system.offers["spot-a"])
    try:
        deadline = time.monotonic() + 60
        while not system.store.lease_alive("spot-a"):
            assert time.monotonic() < deadline and victim.poll() is None, (
                tmp_path / "agents" / "agent-spot-a.log"
            ).read_text()
            time.sleep(0.1)
        job = system.broker.submit(train_spec(OUTPUT=str(tmp_path / "final.pt"), STEP_SLEEP_S="0.03"))
        system.drive(lambda: progressed(system, job.id, 25))
        pid = json.loads(system.reports("started")[0]["data"])["pid"]
        os.kill(victim.pid, signal.SIGKILL)  # the instance dies: agent and job with it
        os.killpg(pid, signal.SIGKILL)
        system.agent("ondemand-a")
        system.drive(lambda: system.job(job.id).state == JobState.done)
    finally:
        provisioner.stop_all()
    done = system.job(job.id)
    assert [(r.agent, r.end_reason) for r in done.runs] == [("spot-a", "lost"), ("ondemand-a", "finished")]
    assert_same_weights(torch.load(tmp_path / "final.pt"), uninterrupted)


def test_a_failed_save_is_kept_on_the_run_until_a_good_one(system):
    system.agent("spot-a")
    job = system.broker.submit(quick_spec())
    system.server.dispatch()
    report = {"agent": "spot-a", "job": job.id, "fence": 1}
    system.server.apply(
        [{**report, "type": "checkpoint_failed", "data": {"step": 7, "reason": "[Errno 28] No space left on device"}}]
    )
    assert system.job(job.id).current_run.checkpoint_error == "step 7: [Errno 28] No space left on device"
    url = f"{system.root}/{job.id}/step-000000000008"
    system.server.apply([{**report, "type": "checkpoint", "data": {"step": 8, "url": url}}])
    run = system.job(job.id).current_run
    assert run.checkpoint_error is None and run.checkpoint_step == 8


def test_the_round_budget_limits_what_the_server_dispatches(redis_url, tmp_path, catalog):
    system = System(redis_url, tmp_path, catalog)
    for name in system.offers:
        system.agent(name)
    jobs = [system.broker.submit(train_spec()) for _ in range(2)]
    one_job_usd = max(j.quote.chosen.expected_cost_usd for j in jobs)
    system.server.policy = planning.get("costslo", budget_usd=1.5 * one_job_usd)  # room for one job, not two
    dispatched = system.server.dispatch()
    assert len(dispatched) == 1
    waiting = next(j for j in jobs if j.id not in {job for job, _ in dispatched})
    assert system.store.get_job(waiting.id).state == JobState.queued


def test_dispatch_plans_agents_at_the_newest_prices_not_those_they_registered_with(redis_url, tmp_path, catalog):
    system = System(redis_url, tmp_path, catalog)
    system.server.policy = planning.get("cheapest")
    for name in ("spot-a", "spot-b"):
        system.agent(name)
    cheap, dear = system.offers["spot-a"], system.offers["spot-b"]
    assert cheap.price_usd_per_h < dear.price_usd_per_h  # as the agents registered
    repriced = cheap.model_copy(update={"price_usd_per_h": dear.price_usd_per_h * 3})  # since then: spot-a's price rose
    system.server.prices = lambda: [repriced, dear]
    job = system.broker.submit(train_spec())
    assert system.server.dispatch() == [(job.id, "spot-b")]


def test_broker_logs_prints_each_runs_output_and_follows_a_running_job(system, redis_url, monkeypatch):
    """The job's output reaches the store from the agent (its log stream), not only the agent's disk."""
    system.agent("spot-a")
    code = "import time\nfor i in range(40):\n    print(f'line {i}', flush=True)\n    time.sleep(0.05)"
    job = system.broker.submit(l4_spec("talk", code))
    system.drive(lambda: system.job(job.id).state == JobState.running)
    env = {**os.environ, "BROKER_REDIS_URL": redis_url}
    broker = Path(sys.executable).parent / "broker"
    follower = subprocess.Popen(
        [str(broker), "logs", job.id, "--follow"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    system.drive(lambda: system.job(job.id).state == JobState.done)
    assert system.job(job.id).runs[0].on_cloud is False  # run by a local agent (no cloud's notices): no evidence
    followed, errors = follower.communicate(timeout=60)  # it ends by itself once the job has ended
    assert follower.returncode == 0, errors
    expected = [f"line {i}" for i in range(40)]
    assert [line for line in followed.splitlines() if line.startswith("line ")] == expected
    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    shown = CliRunner().invoke(app, ["logs", job.id])
    assert shown.exit_code == 0 and "run 1 on spot-a (spot" in shown.stdout
    assert [line for line in shown.stdout.splitlines() if line.startswith("line ")] == expected
    assert "no output" in CliRunner().invoke(app, ["logs", system.broker.submit(quick_spec()).id]).stdout


def test_an_agent_started_for_one_job_runs_that_job_and_no_other(redis_url, tmp_path, catalog):
    """`broker run JOB` starts its local agent for JOB: planned like any agent, it went to a more urgent queued job,
    and JOB waited behind it (for hours, behind a long one)."""
    from broker.agents.contract import Contract
    from broker.core.waiting import waiting_for

    system = System(redis_url, tmp_path, catalog)
    system.server.policy = planning.get("cheapest")
    other = system.broker.submit(l4_spec("other", "pass", priority=5))  # first in the queue
    mine = system.broker.submit(l4_spec("mine", "pass"))
    Contract(system.store, "for-mine").register(system.offers["spot-a"], 60_000, for_job=mine.id)
    assert system.server.dispatch() == [(mine.id, "for-mine")]
    Contract(system.store, "for-gone").register(system.offers["spot-a"], 60_000, for_job="a-job-not-waiting")
    assert system.server.dispatch() == []  # `other` still waits: that agent takes no other job
    said = waiting_for(system.store, system.store.get_job(other.id))
    assert said == "the agents that fit it were started for other jobs (`broker run`), and take no other"
    Contract(system.store, "anyone").register(system.offers["spot-a"], 60_000)
    assert system.server.dispatch() == [(other.id, "anyone")]


def test_an_agent_started_for_a_job_the_guard_pinned_elsewhere_waits_for_one_that_fits(redis_url, tmp_path, catalog):
    """A job the guard moved to on-demand is not given back to the spot agent started for it (it went there at
    once, and the guard moved it again): an on-demand agent started for it takes it. Its wait says so."""
    from broker.agents.contract import Contract
    from broker.core.waiting import waiting_for

    system = System(redis_url, tmp_path, catalog)
    job = system.broker.submit(l4_spec("pinned", "pass"))
    system.store.update_job(job.id, lambda j: j.model_copy(update={"pinned_tier": Tier.on_demand}))
    Contract(system.store, "spot-for-it").register(system.offers["spot-a"], 60_000, for_job=job.id)
    assert system.server.dispatch() == []
    said = waiting_for(system.store, system.store.get_job(job.id))
    assert said == "an agent on on_demand, where the deadline guard moved it: none that fits it is registered"
    Contract(system.store, "od-for-it").register(system.offers["ondemand-a"], 60_000, for_job=job.id)
    assert system.server.dispatch() == [(job.id, "od-for-it")]


def test_an_agent_started_for_one_job_leaves_once_that_job_has_ended(redis_url, tmp_path, catalog):
    """It takes no other job: with its starter gone (`broker run` killed with SIGKILL), it waited for good."""
    system = System(redis_url, tmp_path, catalog)
    job = system.broker.submit(quick_spec())
    system.agent("for-it", offer="spot-a", for_job=job.id)
    system.agent("spot-b")  # an agent for any job stays
    system.drive(lambda: system.job(job.id).state == JobState.done)
    system.drive(lambda: "for-it" not in system.agents, timeout_s=10)  # it ended (System.drive drops it)
    leases = system.store.leases(["for-it", "spot-b"])
    assert leases["for-it"] == "leaving" and leases["spot-b"] not in (None, "leaving")


def test_an_agent_started_for_a_job_cancelled_before_it_ran_leaves(redis_url, tmp_path, catalog):
    """It had no view of a job it was never given, so it did not learn the job ended: it waited for good."""
    system = System(redis_url, tmp_path, catalog)
    job = system.broker.submit(quick_spec())
    system.agent("for-it", offer="spot-a", for_job=job.id)
    system.broker.cancel(job.id)  # before any round gave it the agent
    system.drive(lambda: "for-it" not in system.agents, timeout_s=10)  # it ended (System.drive drops it)
    assert system.store.leases(["for-it"])["for-it"] == "leaving" and system.job(job.id).runs == []
