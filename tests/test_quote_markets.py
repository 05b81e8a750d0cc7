"""Quotes on markets the money model alone misreads: a zone that goes down for hours (its futures fall back to
on-demand), one up minutes at a time (refused for hours of work), the odds the rule's zones give, and a budget the
futures would pass (core/forecast.py)."""

from datetime import timedelta

import pytest
from test_market_model import NOW, _offer, trace
from test_quotes import _choppy, _quote, _quote_spec

from broker import planning
from broker.core.broker import Broker
from broker.core.clock import SimulatedClock
from broker.domain.errors import InfeasibleError
from broker.pricing.availability import MarketModel
from broker.sim.market import OfferBook


def test_a_quote_on_a_choppy_zone_is_not_certain_and_on_a_calm_one_it_is_cheap():
    calm = MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)])
    tight, easy = _quote(_choppy(), 18.0).forecast, _quote(calm, 18.0).forecast
    assert tight.futures == 1000 and tight.rule == "greedy"
    assert tight.cost_p50_usd > easy.cost_p50_usd and tight.cost_p90_usd >= tight.cost_p50_usd
    assert easy.p_within_budget > tight.p_within_budget
    assert easy.spot_share > 0.9 > tight.spot_share
    # the guard's on-demand keeps the deadline at the estimated speed (the median future's; slower ones may miss)
    assert tight.finish_p50 <= NOW + timedelta(hours=18.0)
    # 10 h of work in 14 h: the reserve for a speed not yet measured (46% at the prior's spread) does not fit, so
    # even on a calm zone the job starts on on-demand: a slow one would know too late
    assert _quote(calm, 14.0).forecast.spot_share == 0.0


def test_a_zone_up_minutes_at_a_time_is_no_spot_offer_for_hours_of_work():
    """Up 30 minutes, then down 90: some 20 preemptions in 10 hours of work, each a wait of 90 minutes. The money
    model priced a start there as 1/a launch attempts of 5 minutes and runs that lasted 1 / the catalog's hazard (5
    hours), so it chose spot at $10.07 and its futures ran 80% of their hours on on-demand ($27.97 median)."""
    flaky = MarketModel.fit([trace("us-east-1a", [1] * 3 + [0] * 9, 300)])
    with pytest.raises(InfeasibleError, match=r"cheapest option meeting the deadline is .* on_demand .* at \$30\.78"):
        _quote(flaky, 18.0)  # within $12: none
    quote = _quote(flaky, 18.0, budget_usd=40.0)
    assert quote.chosen.offer.tier == "on_demand" and quote.forecast.spot_share == 0.0


def test_a_quote_names_where_the_rule_starts_the_job_and_warns_when_the_odds_fall_short():
    """A policy that places by its rule starts a job whose window does not hold the reserve for a speed not yet
    measured on on-demand: its quote chooses on-demand then, not the spot offer the money model picked. And a quote
    whose futures meet the deadline less often than the spec asked says so, with the finish at those odds."""
    from rich.console import Console

    from broker.app import render

    # spot lost every 15 hours, and a restart takes half an hour: a start on spot loses more than 2 points of the odds
    choppy = MarketModel.fit([trace("us-east-1a", [1] * 90 + [0] * 3, 100)])
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]

    def quote(policy: str, window_h: float):
        broker = Broker(None, OfferBook(offers), planning.get(policy), SimulatedClock(NOW), choppy)
        return broker.quote(_quote_spec(window_h, restore_minutes=30.0).model_copy(update={"budget_usd": None}))

    def shown(q) -> str:
        console = Console(width=200, record=True)
        console.print(render.quote_table(q, "quote"))
        return console.export_text()

    tight, roomy, kept = quote("hedge", 14.0), quote("hedge", 30.0), quote("costslo", 14.0)
    assert tight.chosen.offer.tier == "on_demand" and tight.alternatives[0].offer.id == offers[0].id
    # ... and leave it for spot once its speed is measured, as the guard does
    assert tight.forecast.spot_share > 0.5 and "starts on on-demand" in tight.forecast.evidence
    assert roomy.chosen.offer.id == offers[0].id and "starts on" not in roomy.forecast.evidence  # room for the reserve
    assert kept.chosen.offer.id == offers[0].id  # a policy that keeps its choice is quoted on it
    assert quote("uniform-progress", 14.0).chosen.offer.tier == "on_demand"
    # 10 h of on-demand work in 14 h: a speed 29% slower than estimated misses, which the prior gives 7%
    assert tight.deadline_probability == 0.95 and tight.forecast.p_meet_deadline < 0.945 and tight.short_of_odds
    assert tight.forecast.finish_at_odds > NOW + timedelta(hours=14.0)  # the 95th percentile finish: late
    assert "is below the 0.95 asked" in shown(tight) and "is below" not in shown(roomy)
    assert not roomy.short_of_odds and roomy.forecast.finish_at_odds <= NOW + timedelta(hours=30.0)
    assert not tight.forecast.measures_on_spot and not roomy.forecast.measures_on_spot
    # a user's quote plays each alternative on its own offer too: the money model called spot all but certain
    told = Broker(None, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), choppy, explained=True)
    alt = told.quote(_quote_spec(14.0, restore_minutes=30.0).model_copy(update={"budget_usd": None})).alternatives[0]
    assert tight.alternatives[0].forecast is None and alt.offer.id == offers[0].id  # backtests show none: not played
    assert alt.p_meet_deadline > 0.99 and alt.forecast.p_meet_deadline < 0.945 and alt.forecast.spot_share > 0.5
    table = shown(tight.model_copy(update={"alternatives": [alt]}))
    row = next(line for line in table.splitlines() if "alt 1" in line)
    assert f"{alt.forecast.p_meet_deadline:.2f}" in row and f"{alt.p_meet_deadline:.3f}" not in row
    words, plain = " ".join(table.split()), " ".join(shown(tight).split())  # the caption wraps
    assert "each alternative run on its own offer" in words and "alternatives: the money model's" in plain
    assert "nearly every future" not in words  # on spot more than half its hours
    # an alternative whose futures all ran on its on-demand fallback says so: its tier alone would read spot
    fallen = alt.model_copy(update={"forecast": alt.forecast.model_copy(update={"spot_share": 0.0})})
    words = " ".join(shown(tight.model_copy(update={"alternatives": [alt, fallen]})).split())
    assert "alt 2: on on-demand in nearly every future" in words and "alt 1," not in words
    # so does a chosen option off on-demand whose futures (the quote's) ran all on on-demand
    spot_start = tight.model_copy(update={"chosen": roomy.chosen})
    ran_on_demand = spot_start.model_copy(update={"forecast": tight.forecast.model_copy(update={"spot_share": 0.0})})
    assert "chosen: on on-demand" in " ".join(shown(ran_on_demand).split())
    assert "chosen: on on-demand" not in " ".join(shown(spot_start).split())  # on spot more than half its hours


def test_a_capped_jobs_futures_that_would_pass_its_budget_end_there_unfinished():
    """`if_over_budget: stop` (core/budget.py): a future that would spend past the budget is stopped at it, so it
    costs the budget and does not finish; under `run` (the default) it finishes, over the budget."""
    from broker.domain.model import IfOverBudget

    choppy = _choppy()
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]

    def quoted(**update):
        spec = _quote_spec(18.0).model_copy(update=update)
        return Broker(None, OfferBook(offers), planning.get("costslo"), SimulatedClock(NOW), choppy).quote(spec)

    # the money model's mean (the futures' tail of moves to on-demand lifts it over their median): many cost more
    budget = round(quoted(budget_usd=None).chosen.expected_cost_usd, 2)
    runs_on = quoted(budget_usd=budget).forecast
    capped = quoted(budget_usd=budget, if_over_budget=IfOverBudget.stop).forecast
    assert 0.3 < runs_on.p_within_budget < 0.7 and runs_on.cost_p90_usd > budget
    assert capped.cost_p90_usd <= budget + 1e-6  # none spends past it
    assert capped.p_meet_deadline <= capped.p_within_budget  # a future stopped at the budget does not finish
    assert capped.p_meet_deadline < runs_on.p_meet_deadline - 0.2
    assert capped.budget_capped and not runs_on.budget_capped and runs_on.budget_at_odds is None
    assert not capped.over_budget  # a capped job does not overrun: its quote falls short of the odds instead
    raised = quoted(budget_usd=capped.budget_at_odds, if_over_budget=IfOverBudget.stop)
    assert raised.forecast.p_meet_deadline >= raised.deadline_probability  # the budget it was told to raise to
    from broker.app import render

    quote = quoted(budget_usd=budget, if_over_budget=IfOverBudget.stop)
    assert f"raise --budget to ${capped.budget_at_odds:,.2f} for the odds asked" in render.short_of_odds(quote)
    baseline = quote.on_demand_baseline.forecast  # what the savings are against: on-demand run to its end
    assert not baseline.budget_capped and baseline.cost_p50_usd > budget + 1  # capped, it would stop at the budget
