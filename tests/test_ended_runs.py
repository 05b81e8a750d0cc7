"""A job that ends while its run goes on (a cancel, the budget cap) stays ended: what its agent reports afterwards
(the start the server had not folded yet, a failure, a preemption) and the loss of its agent close the run and
record it, and never start the job or queue it again."""

import time

from dispatch_system import l4_spec

from broker.domain.model import JobState

SLEEPER = "import time; time.sleep(60)"


def report(job, kind, **data):
    return {"agent": "spot-a", "job": job.id, "fence": job.fence, "type": kind, "data": data}


def test_a_job_cancelled_after_its_agent_started_it_and_before_the_server_heard_stays_cancelled(system):
    agent = system.agent("spot-a")
    job = system.broker.submit(l4_spec("long", SLEEPER))
    system.server.dispatch()
    agent.step(block_ms=10)  # started, and said so; no round has folded it yet
    assert agent.job is not None and system.job(job.id).state == JobState.queued
    system.broker.cancel(job.id)
    system.drive(lambda: system.job(job.id).current_run is None, timeout_s=20)
    ended = system.job(job.id)
    assert ended.state == JobState.cancelled and ended.runs[0].started_at is not None
    assert agent.job is None and system.store.get_agent("spot-a").job is None


def test_a_cancelled_job_whose_run_then_fails_or_is_preempted_is_not_queued_again(system):
    system.agent("spot-a")
    job = system.broker.submit(l4_spec("long", SLEEPER, max_restarts=3))
    system.drive(lambda: system.job(job.id).state == JobState.running)
    system.broker.cancel(job.id)
    running = system.job(job.id)
    failed = system.server.apply([report(running, "exited", reason="failed", code=1)])
    assert (failed.state, failed.restarts, failed.runs[-1].end_reason) == (JobState.cancelled, 0, "failed")
    assert system.store.pending_count() == 0

    other = system.broker.submit(l4_spec("other", SLEEPER))
    system.drive(lambda: system.job(other.id).state == JobState.running)
    system.broker.cancel(other.id)
    preempted = system.server.apply([report(system.job(other.id), "exited", reason="preempted")])
    assert (preempted.state, preempted.runs[-1].end_reason) == (JobState.cancelled, "preempted")
    assert system.store.pending_count() == 0
    system.drive(lambda: system.agents["spot-a"].job is None, timeout_s=20)  # the agent stops what it ran


def test_a_cancelled_job_whose_agent_is_lost_is_not_queued_again(system):
    agent = system.agent("spot-a")
    job = system.broker.submit(l4_spec("long", SLEEPER))
    system.drive(lambda: system.job(job.id).state == JobState.running)
    system.broker.cancel(job.id)
    system.store.redis.delete("broker:lease:spot-a")  # the agent vanished before it stopped the job
    system.server.reclaim_lost()
    lost = system.job(job.id)
    assert (lost.state, lost.current_run, lost.runs[-1].end_reason) == (JobState.cancelled, None, "lost")
    assert system.store.pending_count() == 0
    time.sleep(0.25)  # a heartbeat later
    agent.step(block_ms=10)  # its lease lapsed: it kills the job and registers again
    assert agent.job is None
