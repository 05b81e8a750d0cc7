"""A job's outlook (Broker.outlook): its quote made again from where it stands, the work left at its measured speed
after what it has spent, so a user who looks again once the job has run learns what the quote could not know."""

from datetime import datetime, timedelta

import pytest
from test_market_model import NOW, _offer, trace
from test_quotes import _finished, _quote, _quote_spec

from broker import planning
from broker.core.broker import Broker
from broker.core.clock import SimulatedClock
from broker.core.forecast import Underway, forecast
from broker.domain.model import IfOverBudget, JobState
from broker.models.risk import exclusive_hours, restart_hours
from broker.pricing.availability import MarketModel
from broker.sim.market import OfferBook

CALM = [trace("us-east-1a", [1] * 300 + [0] * 1, 20)]  # spot nearly always


def test_an_outlook_prices_the_work_left_at_the_measured_speed_after_what_was_spent():
    model = MarketModel.fit(CALM)
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    quote = _quote(model, 30.0)
    on_demand = quote.on_demand_baseline
    played = quote.model_copy(update={"chosen": on_demand})
    half_h = on_demand.expected_wall_h / 2
    spec = _quote_spec(30.0).model_copy(update={"deadline": NOW + timedelta(hours=half_h)})  # half the work: in time

    def ahead(speed, on=None):
        underway = Underway(left=0.5, speed=speed, run_h=2.0, spent_usd=7.0, on=on)
        return forecast(spec, played, offers, model, "greedy", NOW, underway=underway)

    slow, fast = ahead(0.8), ahead(1.25)
    work_h = exclusive_hours(spec, on_demand.offer) / 2 / 0.8
    # not running now: a start (a new instance, the restore) as the futures pay it, then the work left
    assert slow.cost_p10_usd == slow.cost_p90_usd == pytest.approx(7.0 + 3.06 * (restart_hours(spec) + work_h))
    assert ahead(0.8, on_demand.offer).cost_p50_usd == pytest.approx(7.0 + 3.06 * work_h)  # running there: no start
    assert slow.speed_sigma == 0.0 and slow.p_meet_deadline == 0.0 and fast.p_meet_deadline == 1.0
    unmeasured = ahead(None)  # not yet measured: the speed's spread, as at submit
    assert unmeasured.cost_p90_usd > unmeasured.cost_p10_usd and 0.0 < unmeasured.p_meet_deadline < 1.0

    # on spot, where it nearly always runs: a quarter of the work costs about a quarter of the quote's, after the spent
    roomy = _quote_spec(30.0)
    assert quote.chosen.offer.tier.value == "spot"
    full = forecast(roomy, quote, offers, model, "greedy", NOW)
    underway = Underway(left=0.25, speed=1.0, run_h=3.0, spent_usd=5.0)
    quarter = forecast(roomy, quote, offers, model, "greedy", NOW, underway=underway)
    assert quarter.cost_p50_usd - 5.0 == pytest.approx(full.cost_p50_usd / 4, rel=0.15)


def test_a_broker_gives_the_outlook_of_a_job_under_way_not_of_one_that_ended(store):
    model = MarketModel.fit(CALM)
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    broker = Broker(store, OfferBook(offers), planning.get("cbl-greedy"), SimulatedClock(NOW), model)
    quote = broker.quote(_quote_spec(30.0))
    slow = _finished(quote, 0.5, "slow", JobState.running)  # measured at half the estimated speed
    broker.clock.advance(hours=4)
    outlook = broker.outlook(slow)
    assert outlook.speed_sigma == 0.0
    assert outlook.cost_p50_usd > quote.forecast.cost_p50_usd  # twice the time for what is left
    assert broker.outlook(_finished(quote, 0.5, "done")) is None
    assert Broker(store, OfferBook(offers), planning.get("cbl-greedy"), SimulatedClock(NOW)).outlook(slow) is None


def test_a_backtest_takes_each_jobs_outlook_once_its_speed_is_measured(redis_server, catalog):
    """On on-demand the market adds nothing: once the speed is measured, the outlook is the realised cost, where
    the quote, made before, is off by the job's unknown speed."""
    from test_backtest import START, workload

    from broker.pricing.traces import load_traces
    from broker.sim import backtest
    from broker.sim.calibration import job_rows
    from broker.sim.market import PACKAGED_TRACES, from_traces

    market = from_traces(PACKAGED_TRACES, catalog, START, tick_s=1200)
    model = MarketModel.fit(load_traces(PACKAGED_TRACES), 1200)
    arrivals = workload(0, jobs=3, speed_sigma=0.3)
    result = backtest.run(market, arrivals, ["on-demand"], 0, redis_server, model=model, outlooks_for=("on-demand",))
    [outcome] = result.outcomes
    assert set(outcome.outlooks) == {job.id for job in outcome.jobs}
    for job in outcome.jobs:
        at, _ = outcome.outlooks[job.id]
        assert job.runs[0].started_at < at < job.runs[-1].ended_at
    quoted, ahead = job_rows(outcome.jobs, outcome.end), job_rows(outcome.jobs, outcome.end, outcome.outlooks)
    assert all(0 < row["window_gone"] < 0.5 for row in ahead)
    assert max(abs(r["cost_usd"] / r["quoted_cost_usd"] - 1) for r in quoted) > 0.1
    assert max(abs(r["cost_usd"] / r["quoted_cost_usd"] - 1) for r in ahead) < 0.03
    # how long after the first job each was quoted: its arrival in the workload; an outlook, once its job has run
    after = {a.id: a.at_h - min(x.at_h for x in arrivals) for a in arrivals}
    assert all(r["quoted_after_h"] == pytest.approx(after[r["job"]], abs=0.34) for r in quoted)  # one 20-min tick
    assert all(a["quoted_after_h"] > q["quoted_after_h"] for a, q in zip(ahead, quoted, strict=True))


def test_an_outlook_finds_the_job_where_it_runs_now():
    """Greedy never leaves on-demand: a job on it now finishes there, though spot is nearly always free; one that runs
    nowhere starts on spot. A job on spot now pays no changeover to go on."""
    model = MarketModel.fit(CALM)
    spot, on_demand = _offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)
    quote, spec = _quote(model, 30.0), _quote_spec(30.0)

    def ahead(on):
        underway = Underway(left=0.5, speed=1.0, run_h=2.0, spent_usd=0.0, on=on)
        return forecast(spec, quote, [spot, on_demand], model, "greedy", NOW, underway=underway)

    idle, kept, going = ahead(None), ahead(on_demand), ahead(spot)
    assert idle.spot_share > 0.9 and kept.spot_share == 0.0
    assert kept.cost_p50_usd == pytest.approx(3.06 * exclusive_hours(spec, on_demand) / 2, rel=0.01)
    assert going.cost_p50_usd == pytest.approx(idle.cost_p50_usd - spot.price_usd_per_h * restart_hours(spec), rel=0.01)


def test_status_warns_when_the_outlook_falls_below_the_odds_asked():
    from broker.app.render import outlook_line

    model = MarketModel.fit(CALM)
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    quote, spec = _quote(model, 30.0), _quote_spec(30.0)
    slow = forecast(spec, quote, offers, model, "greedy", NOW, underway=Underway(0.9, 0.3, 2.0, 1.0))
    on_time = forecast(spec, quote, offers, model, "greedy", NOW, underway=Underway(0.5, 1.0, 2.0, 1.0))
    assert "at risk: P(meet deadline) 0.00, below the 0.95 asked" in outlook_line(slow, 0.95)
    assert "at risk" not in outlook_line(on_time, 0.95) and "outlook now" in outlook_line(on_time, 0.95)
    # a third of its speed: the work left costs more than the $12 budget in every future, and it says so
    assert slow.p_within_budget < 0.5 <= on_time.p_within_budget
    assert "over budget likely: P(within budget)" in outlook_line(slow, 0.95)
    assert "over budget" not in outlook_line(on_time, 0.95)
    # and what would do: the budget 9 in 10 futures keep, the deadline they meet at the odds asked (to the minute up)
    told = outlook_line(slow, 0.95, "train-1")
    budget = float(told.split("`broker amend train-1 --budget ")[1].split("`")[0])
    assert slow.cost_p90_usd <= budget < slow.cost_p90_usd + 0.01
    deadline = datetime.fromisoformat(told.split("`broker amend train-1 --deadline ")[1].split("`")[0])
    assert slow.finish_at_odds <= deadline < slow.finish_at_odds + timedelta(minutes=1)
    # under the budget cap a slow job's futures stop at the budget: raising it is what would do
    capped = spec.model_copy(update={"if_over_budget": IfOverBudget.stop})
    stopped = forecast(capped, quote, offers, model, "greedy", NOW, underway=Underway(0.9, 0.7, 2.0, 1.0))
    assert stopped.p_meet_deadline == 0 and stopped.budget_at_odds > spec.budget_usd
    told = outlook_line(stopped, 0.95, "train-1")
    assert f"`broker amend train-1 --budget {stopped.budget_at_odds:.2f}` for the odds asked" in told
