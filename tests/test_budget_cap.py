"""The budget cap (core/budget.py), with a real agent and job over a real Redis: `if_over_budget: stop` ends a job
once its spend would pass its budget before the guard looks again; `run` (the default) lets it run on."""

import re
from datetime import timedelta

import pytest

from broker import planning
from broker.core.budget import fallback_option, over_budget
from broker.core.clock import ManualClock
from broker.domain.errors import BrokerError, InfeasibleError
from broker.domain.figures import spend_usd
from broker.domain.model import IfOverBudget, JobState, Run
from conftest import train_spec


def running_capped(system, tmp_path):
    """A job capped at $2.00 running on an on-demand agent, a few steps in."""
    system.agent("ondemand-a")
    spec = train_spec(STEPS="2000", CKPT_EVERY="100000", STEP_SLEEP_S="0.03", OUTPUT=str(tmp_path / "final.pt"))
    job = system.broker.submit(spec.model_copy(update={"budget_usd": 2.0, "if_over_budget": IfOverBudget.stop}))
    system.drive(lambda: (run := system.job(job.id).current_run) is not None and run.progress_done >= 5)
    return job


def test_a_capped_job_is_stopped_at_its_budget_and_its_run_closed_with_a_checkpoint(system, tmp_path):
    job = running_capped(system, tmp_path)
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
    job = running_capped(system, tmp_path)
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


def test_a_job_stopped_at_its_budget_resumes_from_its_checkpoint_when_given_more(system, tmp_path):
    job = running_capped(system, tmp_path)
    run = system.job(job.id).current_run
    reached = run.started_at + timedelta(hours=2.0 / run.offer.price_usd_per_h)
    system.server.clock = system.broker.clock = ManualClock(reached)
    assert system.server.guard() == [job.id]
    stopping = system.job(job.id)
    assert stopping.stopped_at_budget and f"`broker amend {job.id} --budget` with more resumes it" in stopping.reason
    with pytest.raises(BrokerError, match=f"job: {job.id} is still stopping at its budget; amend it again once"):
        system.broker.amend(job.id, budget_usd=4.0)  # its run has not closed: its checkpoint may still be saving
    system.drive(lambda: system.job(job.id).current_run is None)
    stopped = system.job(job.id)
    for budget, said in ((2.0, "--budget: $2.00 is not above the $2.00 job"), (None, "give --budget above what it")):
        with pytest.raises(BrokerError, match=re.escape(said)):
            system.broker.amend(job.id, budget_usd=budget, deadline=None if budget else "+30h")
    assert system.job(job.id) == stopped  # refused: nothing changed

    resumed = system.broker.amend(job.id, budget_usd=4.0)
    assert resumed.state == JobState.queued and not resumed.stopped_at_budget and resumed.pending
    assert resumed.spec.budget_usd == 4.0 and resumed.reason.startswith("resumed: budget raised to $4.00")
    assert [e["state"] for e in system.store.events(job.id)][-1] == "queued"
    assert system.server.dispatch() == [(job.id, "ondemand-a")]
    system.drive(lambda: (run := system.job(job.id).current_run) is not None and run.started_at is not None)
    first, second = system.job(job.id).runs
    assert second.resume_from == first.checkpoint_url  # resumed from the checkpoint saved at the stop, not step 0
    assert system.job(job.id).state == JobState.running
    system.broker.cancel(job.id)
    system.drive(lambda: system.job(job.id).current_run is None)


@pytest.mark.parametrize("cap", [IfOverBudget.run, IfOverBudget.stop])
def test_a_job_its_budget_cannot_cover_runs_fastest_or_capped_where_the_budget_buys_most(system, cap):
    """Its budget cut below any option after submit: uncapped it runs where it finishes first (over either way);
    capped it will stop at the budget, so it runs where the budget buys the most work, the cheapest. (A policy
    that plans by budgets: the Uniform Progress family places by the deadline alone.)"""
    system.broker.policy = system.server.policy = planning.get("cheapest")
    for name in ("spot-a", "ondemand-a"):
        system.agent(name)
    assert system.offers["spot-a"].price_usd_per_h < system.offers["ondemand-a"].price_usd_per_h
    job = system.broker.submit(train_spec().model_copy(update={"budget_usd": 50.0, "if_over_budget": cap}))
    system.broker.amend(job.id, budget_usd=0.01)
    offers = list(system.offers.values())
    with pytest.raises(InfeasibleError) as refused:
        system.broker.policy.quote(system.job(job.id).spec, offers, system.server.clock.now())
    options = system.broker.policy.options(system.job(job.id).spec, offers, system.server.clock.now())
    fastest = min(options, key=lambda o: o.expected_finish)
    assert refused.value.later is None and fastest.offer == system.offers["ondemand-a"]
    assert fallback_option(system.job(job.id).spec, refused.value, options).offer == (
        fastest.offer if cap == IfOverBudget.run else min(options, key=lambda o: o.expected_cost_usd).offer
    )
    expected = "ondemand-a" if cap == IfOverBudget.run else "spot-a"
    assert system.server.dispatch() == [(job.id, expected)]
