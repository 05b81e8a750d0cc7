"""`broker amend`: another deadline or budget for a job that has not ended, validated as `submit` validates them,
recorded as an event; the planner, the guard and the budget cap read the new ones."""

import json
from datetime import timedelta

from test_cli import job_file, run

from broker import planning
from broker.core.broker import Broker
from broker.core.clock import ManualClock
from broker.domain.model import JobState, Run
from conftest import NOW, make_spec


def test_amend_gives_a_queued_job_another_budget_and_deadline_and_says_so_in_its_events(env, store, tmp_path):
    job_id = json.loads(run("submit", job_file(tmp_path), "--json").stdout)["job"]
    before = store.get_job(job_id)
    result = run("amend", job_id[:-2], "--budget", "35", "--deadline", "+30h")  # its start, as other commands
    assert result.exit_code == 0, result.output
    after = store.get_job(job_id)
    assert after.spec.budget_usd == 35 and after.spec.deadline > before.spec.deadline + timedelta(hours=5)
    assert after.spec.model_copy(update={"budget_usd": 20, "deadline": before.spec.deadline}) == before.spec
    assert after.quote == before.quote and after.state == before.state  # its quote stays the one made at submit
    assert "spent $0.0000 of $35.00" in result.stdout
    (amended,) = [e for e in store.events(job_id) if e["reason"].startswith("amended")]
    assert amended["reason"] == f"amended: deadline {after.spec.deadline:%Y-%m-%d %H:%M} UTC, budget $35.00"


def test_amend_to_a_deadline_no_future_meets_says_so_with_the_deadline_that_would_do(env, store, tmp_path):
    """It was taken without a word (P(meet) 0.00 showed only in `broker status`)."""
    job_id = json.loads(run("submit", job_file(tmp_path), "--json").stdout)["job"]
    result = run("amend", job_id, "--deadline", "+30m")
    assert result.exit_code == 0, result.output
    said = " ".join(result.stdout.split())
    assert "at risk: P(meet deadline) 0.00, below the" in said and f"`broker amend {job_id} --deadline 20" in said
    outlook = json.loads(run("amend", job_id, "--budget", "30", "--json").stdout)["outlook"]
    assert outlook["p_meet_deadline"] == 0.0 and outlook["finish_at_odds"] is not None


def test_amend_refuses_bad_values_and_ended_jobs_in_one_line_and_changes_nothing(env, store, tmp_path):
    job_id = json.loads(run("submit", job_file(tmp_path), "--json").stdout)["job"]
    before = store.get_job(job_id)
    for args, said in (
        ((), "amend: nothing to change; give --deadline or --budget"),
        (("--budget", "-3"), "--budget: -3.0 is out of range"),
        (("--deadline", "2020-01-01T00:00Z"), "--deadline: 2020-01-01 00:00 UTC is in the past"),
        (("--deadline", "soon"), "--deadline: 'soon' is not a time"),
    ):
        result = run("amend", job_id, *args)
        assert result.exit_code == 2 and said in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert store.get_job(job_id) == before
    run("cancel", job_id)
    result = run("amend", job_id, "--budget", "50")
    assert result.exit_code == 2 and f"{job_id} is already cancelled; nothing to change" in result.stderr
    assert store.get_job(job_id).spec.budget_usd == 20


def test_a_late_jobs_budget_can_be_raised_its_past_deadline_kept(store, catalog):
    clock = ManualClock(NOW)
    broker = Broker(store, catalog, planning.get(), clock)
    job = broker.submit(make_spec(deadline=NOW + timedelta(hours=24), budget_usd=100))
    clock.advance(hours=30)  # its deadline passed: it is late
    amended = broker.amend(job.id, budget_usd=150)
    assert amended.spec.budget_usd == 150 and amended.spec.deadline == job.spec.deadline


def test_amend_resumes_a_job_the_budget_cap_stopped_only_with_more_than_it_spent(env, store, tmp_path):
    job_id = json.loads(run("submit", job_file(tmp_path), "--json").stdout)["job"]
    job = store.get_job(job_id)
    offer = job.quote.chosen.offer
    spent = Run(fence=1, agent="a", offer=offer, dispatched_at=NOW, started_at=NOW, ended_at=NOW, cost_usd=5.0)
    spent = spent.model_copy(update={"end_reason": "fenced", "checkpoint_url": "file:///ckpt/1", "checkpoint_step": 9})
    stop = {"state": JobState.failed, "fence": 1, "runs": [spent], "reason": "budget spent: $5.00 of $5.00"}
    store.update_job(job_id, lambda j: j.model_copy(update={**stop, "stopped_at_budget": True}))
    failed = store.get_job(job_id)
    for args, said in (
        (("--deadline", "+30h"), f"{job_id} is already failed; nothing to change; give --budget above what it spent"),
        (("--budget", "5"), f"--budget: $5.00 is not above the $5.00 job {job_id} has spent; give more to resume it"),
    ):
        result = run("amend", job_id, *args)
        assert result.exit_code == 2 and said in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert store.get_job(job_id) == failed
    result = run("amend", job_id, "--budget", "30")
    assert result.exit_code == 0 and "amended and queued again (resumed: budget raised to $30.00" in result.stdout
    assert store.get_job(job_id).pending and store.pending_count() == 1  # back in the planner's queue
    store.update_job(job_id, lambda j: j.model_copy(update={**stop, "stopped_at_budget": False}))  # failed otherwise
    result = run("amend", job_id, "--budget", "50")
    assert result.exit_code == 2 and result.stderr.strip().endswith(f"{job_id} is already failed; nothing to change")
