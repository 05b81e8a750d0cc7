"""The budget cap (core/budget.py), with a real agent and job over a real Redis: `if_over_budget: stop` ends a job
once its spend would pass its budget before the guard looks again; `run` (the default) lets it run on."""

from datetime import timedelta

import pytest

from broker.core.budget import over_budget
from broker.core.clock import ManualClock
from broker.domain.figures import spend_usd
from broker.domain.model import IfOverBudget, JobState, Run
from conftest import train_spec


def test_a_capped_job_is_stopped_at_its_budget_and_its_run_closed_with_a_checkpoint(system, tmp_path):
    system.agent("ondemand-a")
    spec = train_spec(STEPS="2000", CKPT_EVERY="100000", STEP_SLEEP_S="0.03", OUTPUT=str(tmp_path / "final.pt"))
    job = system.broker.submit(spec.model_copy(update={"budget_usd": 2.0, "if_over_budget": IfOverBudget.stop}))
    system.drive(lambda: (run := system.job(job.id).current_run) is not None and run.progress_done >= 5)
    assert system.server.guard() == []  # cents spent: it runs on
    running = system.job(job.id)
    price = running.current_run.offer.price_usd_per_h
    pass_h = 0.05
    reached = running.current_run.started_at + timedelta(hours=2.0 / price)
    before = reached - timedelta(hours=pass_h + 0.01)
    assert not over_budget(running, before, pass_h) and over_budget(running, before + timedelta(hours=0.02), pass_h)
    uncapped = running.model_copy(update={"spec": running.spec.model_copy(update={"if_over_budget": "run"})})
    assert not over_budget(uncapped, reached + timedelta(hours=10), pass_h)  # `run`: never stopped

    system.server.clock = ManualClock(reached)  # its run has spent the budget
    assert system.server.guard() == [job.id]
    stopped = system.job(job.id)
    assert stopped.state == JobState.failed and stopped.reason.startswith("budget spent: $2.00 of $2.00")
    system.drive(lambda: system.job(job.id).current_run is None)  # the agent stops the job and reports its exit
    ended = system.job(job.id)
    (run,) = ended.runs
    assert ended.state == JobState.failed and run.end_reason == "fenced"
    assert run.checkpoint_url is not None and run.checkpoint_step >= 5  # saved on the stop: resumable work kept
    assert spend_usd(ended, reached) == run.cost_usd == pytest.approx(2.0)  # ended on the clock that stopped it
    assert system.store.working_agents()[0].job is None  # the agent is free for other work
    assert system.server.guard() == []  # ended: nothing more to stop


def test_a_capped_job_whose_budget_is_raised_runs_on_to_the_new_one(system, tmp_path):
    system.agent("ondemand-a")
    spec = train_spec(STEPS="2000", CKPT_EVERY="100000", STEP_SLEEP_S="0.03", OUTPUT=str(tmp_path / "final.pt"))
    job = system.broker.submit(spec.model_copy(update={"budget_usd": 2.0, "if_over_budget": IfOverBudget.stop}))
    system.drive(lambda: (run := system.job(job.id).current_run) is not None and run.progress_done >= 5)
    run = system.job(job.id).current_run
    reached = run.started_at + timedelta(hours=2.0 / run.offer.price_usd_per_h)
    system.broker.amend(job.id, budget_usd=4.0)  # told its outlook overruns, the user raises it
    system.server.clock = ManualClock(reached)
    assert system.server.guard() == [] and system.job(job.id).state == JobState.running
    system.server.clock = ManualClock(run.started_at + timedelta(hours=4.0 / run.offer.price_usd_per_h))
    assert system.server.guard() == [job.id]
    assert system.job(job.id).reason.startswith("budget spent: $4.00 of $4.00")
    system.drive(lambda: system.job(job.id).current_run is None)


def test_a_capped_job_back_in_the_queue_with_its_budget_spent_is_not_started_again(system):
    """A run lost past the budget (its cost runs until the lease lapses) puts the job back in the queue spent."""
    agent = system.agent("ondemand-a")
    spec = train_spec().model_copy(update={"budget_usd": 1.0, "if_over_budget": IfOverBudget.stop})
    job = system.broker.submit(spec)
    now = system.server.clock.now()
    lost = Run(fence=1, agent="gone", offer=agent.offer, dispatched_at=now, started_at=now, ended_at=now)
    lost = lost.model_copy(update={"end_reason": "lost", "cost_usd": 1.05})
    back = {"state": JobState.migrating, "fence": 1, "runs": [lost]}
    system.store.update_job(job.id, lambda j: j.model_copy(update=back))
    assert system.store.get_job(job.id).pending
    assert system.server.dispatch() == []
    ended = system.job(job.id)
    assert ended.state == JobState.failed and ended.reason.startswith("budget spent: $1.05 of $1.00")
    assert len(ended.runs) == 1  # not started again
    uncapped = system.broker.submit(train_spec())  # the agent is free for the others
    assert system.server.dispatch() == [(uncapped.id, "ondemand-a")]
