"""The numbers users look at (models/accounting.py), on runs with known costs."""

import json
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from seeded_jobs import ended_run, offer

from broker import planning
from broker.domain.figures import JobFigures, figures, hours_late
from broker.domain.model import MAX_PROGRESS_POINTS, Job, JobState, Tier
from broker.models.accounting import progress_frame, quote_record, spend_over_time
from conftest import make_spec


def test_spend_over_time_reaches_every_runs_cost_even_on_a_clock_ahead_of_now(catalog):
    """A demo's compressed clock stamps its runs after the wall clock's now: the chart must still show them."""
    now = datetime.now(UTC)
    spot, on_demand = offer(catalog, Tier.spot), offer(catalog, Tier.on_demand)
    for start in (now - timedelta(hours=5), now + timedelta(hours=3)):  # a live run; a demo's, ahead of now
        runs = [ended_run(1, spot, start, 2, "preempted"), ended_run(2, on_demand, start + timedelta(hours=2), 1, "x")]
        job = Job(
            id="j",
            spec=make_spec(),
            state=JobState.done,
            submitted_at=start,
            updated_at=start,
            quote=planning.get().quote(make_spec(), catalog.offers, start),
            runs=runs,
        )
        frame = spend_over_time([figures(job, now)], now)
        last = frame.iloc[-1]
        assert last["spot"] == pytest.approx(runs[0].cost_usd) and last["on_demand"] == pytest.approx(runs[1].cost_usd)
        assert frame.index[0] == pd.Timestamp(start) and frame.sum(axis=1).is_monotonic_increasing


def test_progress_points_are_thinned_to_a_bound_and_keep_the_curves_ends(catalog):
    start = datetime(2026, 11, 23, tzinfo=UTC)
    run = ended_run(1, offer(catalog, Tier.spot), start, 2, "finished")
    for minute in range(1000):
        run.record_progress(start + timedelta(minutes=minute), float(minute))
    points = run.progress_points
    assert len(points) <= MAX_PROGRESS_POINTS and points[0] == (start, 0.0) and points[-1][1] == 999.0
    job = Job(
        id="j",
        spec=make_spec(),
        submitted_at=start,
        updated_at=start,
        quote=planning.get().quote(make_spec(), catalog.offers, start),
        runs=[run],
    )
    frame = progress_frame(job)
    assert list(frame.columns) == ["time", "done", "run"] and len(frame) == len(points)
    assert frame["time"].iloc[0] == pd.Timestamp(start) and set(frame["run"]) == {"r1"}


@pytest.mark.parametrize(
    "state, run_hours, deadline_h, late_h",
    [
        (JobState.done, 10, 8, 2.0),  # finished 2 h past its deadline
        (JobState.done, 6, 8, 0.0),  # on time
        (JobState.running, 6, 8, 4.0),  # unfinished, and now 12 h after it came
        (JobState.running, 6, 20, 0.0),  # unfinished, deadline still ahead
    ],
)
def test_hours_late_count_past_the_deadline_at_the_finish_or_now(catalog, state, run_hours, deadline_h, late_h):
    start = datetime(2026, 11, 23, tzinfo=UTC)
    spec = make_spec(deadline=f"+{deadline_h}h", now=start)
    job = Job(
        id="j",
        spec=spec,
        state=state,
        submitted_at=start,
        updated_at=start,
        quote=planning.get().quote(make_spec(), catalog.offers, start),
        runs=[ended_run(1, offer(catalog, Tier.spot), start, run_hours, "finished")],
    )
    assert hours_late(job, start + timedelta(hours=12)) == pytest.approx(late_h)


def test_the_quotes_record_sets_what_jobs_cost_and_when_they_finished_against_their_quotes(catalog):
    """The live counterpart of a backtest's calibration: finished jobs' spend against their quotes, decided deadlines
    against the odds quoted; jobs still open, failed, cancelled or run on a local stand-in say nothing of the quotes."""
    start = datetime(2026, 11, 23, tzinfo=UTC)
    spot = offer(catalog, Tier.spot)

    def job(name, state, times, deadline_h=20.0, on_cloud=True):
        """A job that ran `times` the hours its quote's cost buys on `spot` (1: it cost its quote to the cent)."""
        spec = make_spec(name=name, deadline=f"+{deadline_h}h", now=start, resources={"accelerators": ["L4:1"]})
        quote = planning.get().quote(spec, [spot], start)
        hours = times * quote.cost_usd / spot.price_usd_per_h
        runs = [ended_run(1, spot, start, hours, "finished").model_copy(update={"on_cloud": on_cloud})] if times else []
        return Job(id=name, spec=spec, state=state, submitted_at=start, updated_at=start, quote=quote, runs=runs)

    amended = job("amended", JobState.done, 1)
    amended = amended.model_copy(
        update={"spec": amended.spec.model_copy(update={"deadline": start + timedelta(hours=25)})}
    )
    jobs = [
        job("on-quote", JobState.done, 1),
        job("dearer", JobState.done, 2, deadline_h=15),  # 100% off, and it finished late
        job("cheaper", JobState.done, 0.5),
        job("open", JobState.running, 0, deadline_h=40),  # its deadline is ahead: undecided
        job("past", JobState.queued, 0),  # unfinished past its deadline: missed
        job("crashed", JobState.failed, 1),
        job("stopped", JobState.cancelled, 0),
        job("local", JobState.done, 9, on_cloud=False),  # `broker run`'s or a demo's: this machine's speed
        amended,  # its cost counts; its deadline is not the one its odds were quoted for
    ]
    now = start + timedelta(hours=30)
    record = quote_record([figures(j, now) for j in jobs], now)
    assert record["finished"] == 4 and record["median_cost_error_pct"] == pytest.approx(25.0, abs=0.1)
    assert record["at_or_below_quote_pct"] == pytest.approx(75.0)
    assert hours_late(jobs[1], now) > 0 and hours_late(jobs[0], now) == 0 == hours_late(jobs[2], now)
    assert record["deadlines"] == 4 and record["met"] == 2  # "dearer" late, "past" unfinished past its deadline
    assert record["quoted_p_meet_mean"] == pytest.approx(
        sum(j.quote.p_meet_deadline for j in jobs[:3] + [jobs[4]]) / 4, abs=1e-3
    )
    assert record["banded"] == 0 and record["within_p10_p90_pct"] is None  # money-model quotes: no band
    kept = JobFigures.from_json("on-quote", figures(jobs[0], now).to_json())  # the record keeps the quote's figures
    assert (kept.quoted_usd, kept.quoted_p_meet) == (jobs[0].quote.cost_usd, jobs[0].quote.p_meet_deadline)
    older = json.dumps(json.loads(figures(jobs[0], now).to_json())[:10])  # a record kept before the quote's figures
    assert JobFigures.from_json("on-quote", older).quoted_usd is None and quote_record([], now)["finished"] == 0
