"""What a job's runs say of it: its speed measured against the estimate (planning/option_table.measured_speed) and
the work it has left (work_left), as the planner, the guard and the quotes read them."""

import math
from datetime import timedelta
from statistics import NormalDist

import pytest
from test_market_model import NOW, _offer, trace
from test_quotes import _quote, _quote_spec

from broker.domain.model import Job, Run
from broker.models.risk import checkpoint_hours, restart_hours
from broker.planning.option_table import POOLED_H, PlanItem, measured_speed, work_left
from broker.pricing.availability import MarketModel


def test_a_job_slower_than_estimated_is_seen_by_its_progress():
    quote = _quote(MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)]), 30.0)
    offer = quote.chosen.offer
    spec = _quote_spec(30.0)
    estimate_h = quote.chosen.exclusive_h
    started = NOW + timedelta(hours=1)
    run = Run(fence=1, agent="a", offer=offer, dispatched_at=started, started_at=started, progress_total=1000.0)
    job = Job(id="slow", spec=spec, submitted_at=NOW, updated_at=NOW, quote=quote, runs=[run])
    unmeasured = PlanItem.from_job(job)
    assert unmeasured.speed == 1.0 and measured_speed(job) is None  # nothing measured yet
    # the net keeps a margin for a speed at the deadline probability's quantile of the quote's spread
    sigma = quote.forecast.speed_sigma
    assert unmeasured.unsure == pytest.approx(math.exp(NormalDist().inv_cdf(spec.deadline_probability) * sigma) - 1)
    assert unmeasured.unsure > 0.1 and unmeasured.speed_sigma == sigma  # spot's work is priced over that spread
    hours = 3.0  # productive hours after the restart; half the progress the estimate says
    run.last_progress_at = started + timedelta(hours=hours + spec.checkpoint.restore_minutes / 60 + 0.05)
    run.progress_done = 1000 * 0.5 * hours / estimate_h
    item = PlanItem.from_job(job)
    assert item.speed == pytest.approx(0.5, rel=0.1) and item.unsure == item.speed_sigma == 0.0  # measured
    assert item.on_demand_h == pytest.approx(quote.on_demand_baseline.exclusive_h / item.speed)
    # 60 checkpoints the guard asked for, one every 3 minutes: their writes are not the job's pace, and each restarts
    # the interval (Young's, about 6 minutes here), so no periodic one came between them
    asked = 60
    run.last_progress_at = started + timedelta(hours=restart_hours(spec) + hours + asked * checkpoint_hours(spec))
    assert measured_speed(job) < 0.5  # the writes read as the job's pace
    run.checkpoints_asked = asked
    assert measured_speed(job) == pytest.approx(0.5, rel=1e-3)


def test_a_run_preempted_before_its_first_checkpoint_leaves_the_work_of_the_checkpoint_it_resumed_from():
    """The next run resumes from the checkpoint the preempted one started from, not from the start: the planner and
    the guard see that work left (a whole job's left would read its deadline as lost)."""
    offer, spec = _offer("us-east-1a"), _quote_spec(30.0)
    quote = _quote(MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)]), 30.0)
    started = NOW + timedelta(hours=1)
    kept = Run(
        fence=1,
        agent="a",
        offer=offer,
        dispatched_at=started,
        started_at=started,
        ended_at=started + timedelta(hours=5),
        end_reason="preempted",
        progress_total=1000.0,
        progress_done=450.0,
        checkpoint_url="file:///ckpt/400",
        checkpoint_step=400,
    )
    again = kept.model_copy(
        update={"fence": 2, "resume_from": "file:///ckpt/400", "checkpoint_url": None, "checkpoint_step": None}
    )
    job = Job(id="twice", spec=spec, submitted_at=NOW, updated_at=NOW, quote=quote, runs=[kept, again])
    assert work_left(job) == pytest.approx(0.6)
    from_start = job.model_copy(update={"runs": [again.model_copy(update={"resume_from": None})]})
    assert work_left(from_start) == 1.0  # it had started from the start


def test_a_speed_is_measured_over_the_newest_runs_pooled_not_one_short_run():
    """Three runs of 0.3 productive hours at half the estimate's pace: none alone is MIN_MEASURED_H, pooled they are;
    a run of 10 hours before them is pooled whole, and one before it, past POOLED_H, not at all."""
    quote = _quote(MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)]), 30.0)
    spec, offer, estimate_h = _quote_spec(30.0), quote.chosen.offer, quote.chosen.exclusive_h
    restart_h = restart_hours(spec)

    def run(fence, start_h, hours, speed):
        started = NOW + timedelta(hours=start_h)
        return Run(
            fence=fence,
            agent="a",
            offer=offer,
            dispatched_at=started,
            started_at=started,
            last_progress_at=started + timedelta(hours=restart_h + hours),
            progress_total=1000.0,
            progress_done=1000 * speed * hours / estimate_h,  # each run from the start: no checkpoint kept
        )

    short = [run(f, f, 0.3, 0.5) for f in (1, 2, 3)]
    job = Job(id="short", spec=spec, submitted_at=NOW, updated_at=NOW, quote=quote, runs=short[:1])
    assert measured_speed(job) is None  # 0.3 productive hours: noise
    assert measured_speed(job.model_copy(update={"runs": short})) == pytest.approx(0.5, rel=0.05)
    job = job.model_copy(update={"runs": [run(0, -30, 10.0, 3.0), run(0, -15, 10.0, 1.0), *short]})
    assert 0.9 + 10 >= POOLED_H > 0.9
    assert measured_speed(job) == pytest.approx((3 * 0.3 * 0.5 + 10 * 1.0) / (0.9 + 10), rel=0.05)
