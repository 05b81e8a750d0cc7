"""How sure a quote is of the job's speed (core/fleet.Fleet.speed_prior): the spread the measured jobs show, how far
off each kind of estimate runs, and a job run again at its earlier runs' speed."""

import math

import numpy as np
import pytest
from test_market_model import NOW, _offer, trace
from test_quotes import _finished, _quote, _quote_spec, _rated

from broker import planning
from broker.core.broker import Broker
from broker.core.clock import SimulatedClock
from broker.domain.model import Job, JobState
from broker.pricing.availability import MarketModel
from broker.sim.market import OfferBook


def test_quotes_learn_how_far_off_the_speed_estimate_is_from_measured_jobs():
    from broker.core.fleet import Fleet
    from broker.core.forecast import forecast
    from broker.models.risk import SPEED_PRIOR_SIGMA

    model = MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)])
    quote = _quote(model, 30.0)
    assert Fleet.of([], [], NOW, []).speed_sigma == pytest.approx(SPEED_PRIOR_SIGMA)  # nothing finished: the prior
    for sigma in (0.05, 0.5):  # many finished jobs outweigh the prior, narrower or wider than it
        speeds = np.exp(np.random.default_rng(1).normal(0.0, sigma, 60))
        learned = Fleet.of([], [], NOW, [_finished(quote, v, f"j{i}") for i, v in enumerate(speeds)]).speed_sigma
        assert learned < SPEED_PRIOR_SIGMA / 2 if sigma < SPEED_PRIOR_SIGMA else learned > 0.4
    wide = np.exp(np.random.default_rng(2).normal(0.0, 0.5, 60))
    running = [_finished(quote, v, f"r{i}", JobState.running) for i, v in enumerate(wide)]
    learned = Fleet.of([], running, NOW, []).speed_sigma
    assert learned > 0.4  # a running job's measured rate counts before it finishes
    assert Fleet.of([], running, NOW, running).speed_sigma == pytest.approx(learned)  # recent and active: once
    few = [_finished(quote, v, f"j{i}") for i, v in enumerate([0.99, 1.0, 1.01])]
    assert 0.5 * SPEED_PRIOR_SIGMA < Fleet.of([], [], NOW, few).speed_sigma < SPEED_PRIOR_SIGMA  # a few: pooled
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    spec = _quote_spec(quote.chosen.expected_wall_h * 1.05)  # tight: 5% slack at the estimated speed
    tight = Broker(None, OfferBook(offers), planning.get("costslo"), SimulatedClock(NOW), model).quote(spec)
    exact = forecast(spec, tight, offers, model, "greedy", NOW, fleet=Fleet(speed_sigma=0.0))
    spread = forecast(spec, tight, offers, model, "greedy", NOW, fleet=Fleet(speed_sigma=0.25))
    assert exact.p_meet_deadline > 0.9 and 0.3 < spread.p_meet_deadline < 0.8
    assert spread.cost_p90_usd - spread.cost_p10_usd > 2 * (exact.cost_p90_usd - exact.cost_p10_usd)  # 19.3 to 6.8
    assert forecast(spec, tight, offers, model, "greedy", NOW).p_meet_deadline < 0.8  # no fleet: the prior's spread


def test_quotes_learn_how_far_off_each_kind_of_speed_estimate_runs_and_plan_with_it():
    """Thirty jobs sized in GPU-hours (a datasheet's ratio) ran at 0.8x their estimate, thirty given measured rates at
    1.0x, each within 3%: a new GPU-hours job is expected at about 0.8x (its quote's futures, its odds, the guard)
    and a new rated job at 1.0x, both sure of it; the gap between the kinds is not counted as spread. Before, both
    were quoted at the estimate with a narrow spread: the slow kind's tight jobs were quoted to meet deadlines they
    all miss. No measured job: the estimate, as before."""
    from broker.core.fleet import Fleet, estimate_kind
    from broker.core.forecast import forecast
    from broker.planning.option_table import PlanItem

    model = MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)])
    quote = _quote(model, 30.0)
    rng = np.random.default_rng(4)
    slow = [_finished(quote, 0.8 * np.exp(rng.normal(0.0, 0.03)), f"g{i}", spec_name=f"g{i}") for i in range(30)]
    right = [_finished(quote, np.exp(rng.normal(0.0, 0.03)), f"r{i}", spec_name=f"r{i}", rated=True) for i in range(30)]
    fleet = Fleet.of([], [], NOW, slow + right)
    spec = _quote_spec(quote.chosen.expected_wall_h * 1.1)  # 10% slack at the estimated speed
    assert estimate_kind(spec) == "gpu-hours (training)" and estimate_kind(_rated(spec)) == "measured rates"
    sized, rated = fleet.speed_prior(spec), fleet.speed_prior(_rated(spec))
    assert 0.8 < sized.median < 0.84 and sized.kind_runs == 30  # shrunk toward the estimate as if 5 more ran at it
    assert rated.median == pytest.approx(1.0, abs=0.02) and fleet.speed_sigma < 0.15
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    learned = forecast(spec, quote, offers, model, "greedy", NOW, fleet=fleet)
    blind = forecast(spec, quote, offers, model, "greedy", NOW, fleet=Fleet(speed_sigma=fleet.speed_sigma))
    assert learned.p_meet_deadline < 0.3 < 0.7 < blind.p_meet_deadline  # at 0.8x the slack is gone
    assert learned.finish_p50 > blind.finish_p50 and "30 measured job(s) of its kind" in learned.evidence
    assert forecast(_rated(spec), quote, offers, model, "greedy", NOW, fleet=fleet).p_meet_deadline > 0.7
    job = Job(
        id="new", spec=spec, submitted_at=NOW, updated_at=NOW, quote=quote.model_copy(update={"forecast": learned})
    )
    assert PlanItem.from_job(job).speed == pytest.approx(sized.median)  # the guard plans at it until measured
    assert Fleet.of([], [], NOW, []).speed_prior(spec) == (1.0, Fleet().speed_sigma, 0, 0)


def test_a_job_run_again_is_quoted_at_the_speed_its_earlier_runs_showed_where_the_fleet_shows_repeats_hold():
    """Ten job names ran four times each, each name at its own speed (log sd 0.3 between names) and its runs within
    2% of it: a fifth run of a name is expected at that name's speed, far surer than a new job, and plans with it.
    Where repeats do not hold (each run as far off as any job) or no name ran twice, a name's earlier runs tell
    nothing: the median of its kind of estimate at the fleet's spread, as for any job."""
    from broker.core.fleet import Fleet
    from broker.core.forecast import forecast
    from broker.planning.option_table import PlanItem

    model = MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)])
    quote = _quote(model, 30.0)
    rng = np.random.default_rng(3)
    names = np.exp(rng.normal(0.0, 0.3, 10))
    repeats = [(f"n{k}", v * np.exp(rng.normal(0.0, 0.02))) for k, v in enumerate(names) for _ in range(4)]
    fleet = Fleet.of([], [], NOW, [_finished(quote, v, f"j{i}", spec_name=n) for i, (n, v) in enumerate(repeats)])

    def named(name: str, of: Fleet = fleet):
        return of.speed_prior(_quote_spec(30.0).model_copy(update={"name": name}))

    for k, v in enumerate(names):
        prior = named(f"n{k}")
        assert prior.median == pytest.approx(v, rel=0.05) and prior.sigma < 0.25 * fleet.speed_sigma
    kind = fleet.bias["gpu-hours (training)"][0]  # the names' mean, shrunk: all are of one kind of estimate
    assert named("new") == (math.exp(kind), fleet.speed_sigma, 0, 40) and fleet.speed_sigma > 0.2
    apart = [(f"n{i % 10}", float(np.exp(rng.normal(0.0, 0.3)))) for i in range(40)]  # repeats do not hold
    loose = Fleet.of([], [], NOW, [_finished(quote, v, f"j{i}", spec_name=n) for i, (n, v) in enumerate(apart)])
    assert named("n1", loose).sigma > 0.9 * loose.speed_sigma
    unique = Fleet.of(
        [], [], NOW, [_finished(quote, v, f"j{i}", spec_name=f"u{i}") for i, (_, v) in enumerate(repeats)]
    )
    assert named("u1", unique) == (math.exp(unique.bias["gpu-hours (training)"][0]), unique.speed_sigma, 0, 40)

    slow = int(np.argmin(names))  # a slow name run again: its quote and the guard expect the slowness
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    spec = _quote_spec(30.0).model_copy(update={"name": f"n{slow}"})
    again = forecast(spec, quote, offers, model, "greedy", NOW, fleet=fleet)
    fresh = forecast(spec.model_copy(update={"name": "new"}), quote, offers, model, "greedy", NOW, fleet=fleet)
    assert again.speed_median == pytest.approx(names[slow], rel=0.05) and fresh.speed_median == math.exp(kind)
    assert again.speed_sigma < 0.25 * fresh.speed_sigma and "4 earlier job(s) of this name" in again.evidence
    assert again.cost_p50_usd > 1.5 * fresh.cost_p50_usd  # at less than half the speed: about twice the hours
    job = Job(
        id="again", spec=spec, submitted_at=NOW, updated_at=NOW, quote=quote.model_copy(update={"forecast": again})
    )
    item = PlanItem.from_job(job)
    assert item.speed == again.speed_median and item.unsure < 0.2  # a prior's reserve: 0.46 at 0.23


def test_a_quotes_odds_hardly_move_with_the_futures_seed_where_the_speed_is_what_decides():
    """On-demand's futures differ only in the job's speed: drawn one per quantile of its spread, the share that
    meets the deadline is the same to a future whatever the seed (independent draws: 0.558 to 0.608 here)."""
    from broker.core.forecast import forecast

    model = MarketModel.fit([trace("us-east-1a", [1] * 3 + [0] * 9, 300)])
    quote = _quote(model, 18.0, budget_usd=None)
    on_demand = quote.model_copy(update={"chosen": quote.on_demand_baseline})
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    spec = _quote_spec(quote.on_demand_baseline.expected_wall_h * 1.05)  # tight: its odds are the speed's
    odds = [forecast(spec, on_demand, offers, model, "greedy", NOW, seed=s).p_meet_deadline for s in range(8)]
    assert 0.5 < min(odds) and max(odds) < 0.95
    assert max(odds) - min(odds) <= 0.002


def test_the_speed_strata_are_scipys_latin_hypercube_draw_for_draw():
    """forecast.latin_hypercube stands in for scipy.stats.qmc (its import took half a second of each `broker submit`):
    the same points from the same generator, and the generator left as scipy leaves it (a child spawned)."""
    from scipy.stats import qmc

    from broker.core.forecast import latin_hypercube

    for seed in range(10):
        for n in (1, 7, 250, 1000):
            ours, theirs = np.random.default_rng(seed), np.random.default_rng(seed)
            drawn = latin_hypercube(ours, n)
            assert np.array_equal(drawn, qmc.LatinHypercube(d=1, rng=theirs).random(n)[:, 0])
            assert np.array_equal(latin_hypercube(ours, n), latin_hypercube(theirs, n))
            assert ours.random() == theirs.random()
    assert np.array_equal(np.sort(np.floor(drawn * 1000)), np.arange(1000))  # one point in each thousandth


def test_each_kind_of_estimate_is_as_unsure_as_its_measured_jobs_were(store):
    """Thirty GPU-hours jobs (a datasheet's ratio) missed their estimates by 40% (log sd), thirty given measured rates
    by 2%: a new rated job keeps the reserve of its own kind's spread, not of both kinds pooled, so one whose window
    holds that reserve starts on spot where the pooled spread weighed a start on on-demand; a new GPU-hours job is as
    unsure as its kind showed. The fleet's pooled spread stays what a kind not yet measured is quoted with."""
    from broker.core.fleet import Fleet
    from broker.models.risk import unmeasured_margin

    model = MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)])
    quote = _quote(model, 30.0)
    rng = np.random.default_rng(5)
    wide = [_finished(quote, np.exp(rng.normal(0.0, 0.4)), f"g{i}", spec_name=f"g{i}") for i in range(30)]
    sure = [_finished(quote, np.exp(rng.normal(0.0, 0.02)), f"r{i}", spec_name=f"r{i}", rated=True) for i in range(30)]
    fleet = Fleet.of([], [], NOW, wide + sure)
    spec = _rated(_quote_spec(quote.chosen.expected_wall_h * 1.25)).model_copy(update={"budget_usd": None})
    rated, sized = fleet.speed_prior(spec), fleet.speed_prior(_quote_spec(30.0))
    assert rated.sigma < 0.1 < 0.2 < fleet.speed_sigma < sized.sigma  # 0.09, 0.25, 0.34 (each shrunk to the prior)
    assert unmeasured_margin(rated.sigma, 0.95) < 0.2 < 0.4 < unmeasured_margin(fleet.speed_sigma, 0.95)

    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    broker = Broker(store, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), model)
    pooled = broker.quote(spec)  # nothing measured yet: the prior's 0.23, a 46% reserve the window does not hold
    reserve_weighed = ("starts on on-demand", "measures its speed on spot")  # its start on spot is weighed against
    assert any(said in pooled.forecast.evidence for said in reserve_weighed)  # one on on-demand (broker.quote)
    for job in wide + sure:
        store.add_job(job)
    learned = broker.quote(spec)  # a quarter more time than the work holds its kind's 16% reserve
    assert learned.chosen.offer.id == offers[0].id and learned.forecast.speed_sigma == pytest.approx(
        rated.sigma, abs=0.01
    )
    assert not any(said in learned.forecast.evidence for said in reserve_weighed)  # on spot with no weighing


def test_a_demos_copied_jobs_teach_the_quotes_nothing(store):
    """`make demo` copies its jobs into the user's store to be shown; they ran on a compressed clock, so a quote made
    after it must not learn their speeds or their arrivals. The same jobs as the user's own do teach it."""
    model = MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)])
    quote = _quote(model, 30.0)
    slow = [_finished(quote, 0.5, f"j{i}", spec_name=f"j{i}") for i in range(20)]
    for job in slow:
        job.runs[0].ended_at, job.runs[0].end_reason = job.runs[0].last_progress_at, "finished"
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    broker = Broker(store, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), model)
    spec = _quote_spec(30.0)
    before = broker.quote(spec).forecast
    for job in slow:
        store.add_job(job.model_copy(update={"id": f"demo-{job.id}", "tags": ["demo"]}))
    after_demo = broker.quote(spec).forecast
    assert after_demo.cost_p50_usd == pytest.approx(before.cost_p50_usd, rel=1e-9)
    assert after_demo.speed_sigma == before.speed_sigma
    for job in slow:
        store.add_job(job)
    assert broker.quote(spec).forecast.cost_p50_usd > 1.5 * before.cost_p50_usd  # half the estimated speed
