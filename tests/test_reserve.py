"""The on-demand side of a quote under a policy that places by its rule (core/reserve.py): the baseline a job falls
back to holds the reserve for a speed not yet measured and is the one its futures find cheapest at the asked odds;
a job starts on on-demand for that reserve only where it adds enough to the odds."""

import re

import pytest
from test_market_model import NOW, _offer, trace
from test_quotes import _quote_spec

from broker import planning
from broker.core.broker import Broker
from broker.core.clock import SimulatedClock
from broker.core.reserve import ODDS_TRADE, cheapest_at_odds
from broker.domain.model import Forecast, Job
from broker.pricing.availability import MarketModel
from broker.sim.market import OfferBook


def test_a_job_whose_odds_hold_without_the_reserve_starts_on_spot_and_the_planner_knows():
    """10 h of work in 13 h does not hold the reserve for a speed not yet measured (46% at the prior's spread),
    but the futures with the speed measured on spot still meet the deadline with the odds asked (0.85): the quote
    keeps the spot offer and says so, and the planner's view of the stored job carries it to the guard's rule."""
    from broker.planning.option_table import PlanItem

    calm = MarketModel.fit([trace("us-east-1a", [1] * 100 + [0] * 1, 60)])  # up 17 h at a time
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    spec = _quote_spec(13.0).model_copy(update={"budget_usd": None, "deadline_probability": 0.85})
    quote = Broker(None, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), calm).quote(spec)
    assert quote.chosen.offer.id == offers[0].id and quote.forecast.measures_on_spot and not quote.short_of_odds
    assert "measures its speed on spot" in quote.forecast.evidence
    job = Job(id="j", spec=spec, submitted_at=NOW, updated_at=NOW, quote=quote)
    assert PlanItem.from_job(job).measures_on_spot
    # asked for odds neither start reaches, the reserve's start would add less than ODDS_TRADE to them: on spot
    sure = Broker(None, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), calm)
    surer = sure.quote(spec.model_copy(update={"deadline_probability": 0.99}))
    assert surer.chosen.offer.id == offers[0].id and surer.forecast.measures_on_spot and surer.short_of_odds
    told = re.search(
        r"falls short of the 0.99 asked too, at P\(meet deadline\) ([\d.]+) for \$([\d.,]+)", surer.forecast.evidence
    )
    assert told and surer.forecast.p_meet_deadline >= float(told[1]) - ODDS_TRADE
    assert surer.forecast.cost_p50_usd < float(told[2])


def test_a_job_the_money_model_sends_to_on_demand_may_still_measure_its_speed_on_spot():
    """Down 2 hours after each 10 up, spot alone does not keep the odds of a 10-hour job in 13 hours, so the money
    model chooses on-demand; the rule still runs it on spot while in time. Its quote skipped the reserve's question
    for a choice of on-demand: the job kept the reserve on spot, and the rule sent it to on-demand hours early (a
    backtest's Greedy paid 57% more once the money model saw the waits)."""
    from broker.core.broker import with_market_spells
    from broker.models.launch_waits import with_launch_waits

    model = MarketModel.fit([trace("us-east-1a", [1] * 60 + [0] * 12, 80)])
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    spec = _quote_spec(13.0).model_copy(update={"budget_usd": None, "deadline_probability": 0.85})
    money = planning.get("hedge").quote(spec, with_launch_waits([with_market_spells(o, model) for o in offers]), NOW)
    assert money.chosen.offer.tier == "on_demand"
    quote = Broker(None, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), model).quote(spec)
    assert quote.forecast.measures_on_spot and "measures its speed on spot" in quote.forecast.evidence
    assert not quote.short_of_odds and quote.forecast.spot_share > 0.5
    only_on_demand = Broker(None, OfferBook(offers[1:]), planning.get("hedge"), SimulatedClock(NOW), model)
    assert not only_on_demand.quote(spec).forecast.measures_on_spot  # no spot to measure it on


def test_a_reserve_that_adds_odds_starts_the_job_on_on_demand_and_says_what_spot_would_keep():
    """Where spot is lost every 10 hours and a restart takes half an hour, the reserve's start on on-demand adds more
    than ODDS_TRADE to odds neither start reaches: the job starts there, and its quote says what the start on spot
    would cost and keep, and the asked odds at which the job starts there."""
    choppy = MarketModel.fit([trace("us-east-1a", [1] * 60 + [0] * 3, 50)])
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    spec = _quote_spec(14.0, restore_minutes=30.0).model_copy(update={"budget_usd": None})
    broker = Broker(None, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), choppy)
    quote = broker.quote(spec)
    assert quote.chosen.offer.tier == "on_demand" and not quote.forecast.measures_on_spot and quote.short_of_odds
    said = re.search(
        r"from a start on spot ([\d.]+) at \$([\d.,]+) p50: a deadline_probability of ([\d.]+)", quote.forecast.evidence
    )
    assert said and float(said[2]) < quote.forecast.cost_p50_usd
    assert float(said[1]) < quote.forecast.p_meet_deadline - ODDS_TRADE
    there = broker.quote(spec.model_copy(update={"deadline_probability": float(said[3])}))
    assert there.chosen.offer.id == offers[0].id and there.forecast.p_meet_deadline == pytest.approx(float(said[1]))


def test_a_job_falls_back_to_an_on_demand_offer_whose_window_holds_the_reserve_for_its_speed():
    """The guard measures a job's progress on its quote's on-demand baseline, and the futures fall back to it. The
    money model's baseline, the cheapest on-demand offer meeting the deadline at the estimated speed, took 10 h of a
    13 h window: no room for the reserve of a speed not yet measured, so the job was sent to on-demand at once
    (where a slower speed misses). An offer twice as fast holds it: it is the baseline, and the job runs on spot."""
    model = MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)])
    fast = _offer("us-east-1y", "on_demand", 9.0).model_copy(update={"speed_factor": 2.0, "instance_type": "p3.fast"})
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06), fast]
    broker = Broker(None, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), model)
    quote = broker.quote(_quote_spec(13.0).model_copy(update={"budget_usd": 100.0}))  # 10 h of work on the slow one
    assert quote.on_demand_baseline.offer.id == fast.id and quote.chosen.offer.id == offers[0].id
    assert quote.forecast.spot_share > 0.9 and not quote.short_of_odds, quote.forecast
    tight = broker.quote(_quote_spec(6.0).model_copy(update={"budget_usd": 100.0}))  # 5 h on the fast one
    # no offer holds the reserve; the slow one cannot even be in time
    assert tight.on_demand_baseline.offer.id == fast.id
    slow_only = Broker(None, OfferBook(offers[:2]), planning.get("hedge"), SimulatedClock(NOW), model)
    held = slow_only.quote(_quote_spec(13.0).model_copy(update={"budget_usd": 100.0}))
    assert held.on_demand_baseline.offer.id == offers[1].id  # none faster: the reserve's start is weighed there
    assert held.measures_on_spot or held.chosen.offer.id == offers[1].id, held.forecast.evidence


def test_a_job_falls_back_where_its_futures_cost_least_at_the_asked_odds_not_where_the_reserve_barely_fits():
    """With 15.2 h to go the slow on-demand offer (10 h of work) holds the reserve for a speed not yet measured, but
    only just: the guard has no slack to spend on spot, and its futures pay on-demand early. With the fast one to fall
    back to, the job keeps to spot: the futures of both baselines are played and the cheaper at the asked odds is the
    baseline (finetune-lora with 23 h to go ran all on an L4 on-demand, $13.24; with an A100 behind it, $3.17)."""
    model = MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)])
    fast = _offer("us-east-1y", "on_demand", 9.0).model_copy(update={"speed_factor": 2.0, "instance_type": "p3.fast"})
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06), fast]
    spec = _quote_spec(15.2).model_copy(update={"budget_usd": 100.0})
    both = Broker(None, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), model).quote(spec)
    slow_only = Broker(None, OfferBook(offers[:2]), planning.get("hedge"), SimulatedClock(NOW), model).quote(spec)
    assert slow_only.on_demand_baseline.offer.id == offers[1].id  # it holds the reserve: the cheapest that does
    assert both.on_demand_baseline.offer.id == fast.id and both.chosen.offer.id == offers[0].id
    assert both.forecast.cost_mean_usd < slow_only.forecast.cost_mean_usd
    assert both.forecast.p_meet_deadline >= slow_only.forecast.p_meet_deadline >= spec.deadline_probability


@pytest.mark.parametrize(
    "odds, picked",
    [
        ({"slow": (0.96, 5.0), "fast": (0.99, 9.0)}, "slow"),  # both meet 0.95: the cheaper
        ({"slow": (0.90, 5.0), "fast": (0.99, 9.0)}, "fast"),  # only one meets: it
        ({"slow": (0.90, 5.0), "fast": (0.93, 9.0)}, "fast"),  # neither: the surer, 3 points more
        ({"slow": (0.90, 5.0), "fast": (0.91, 9.0)}, "slow"),  # neither, a point more: not worth its price
    ],
)
def test_a_baseline_is_the_cheapest_at_the_asked_odds_else_the_surest_where_it_adds_enough(odds, picked):
    def played(name):
        p, cost = odds[name]
        return Forecast.model_construct(p_meet_deadline=p, cost_mean_usd=cost)

    assert cheapest_at_odds(["slow", "fast"], played, 0.95) == picked
