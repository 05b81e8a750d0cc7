"""What a refused job is told to change, checked against the quote it then gets."""

import re
from datetime import datetime

import pytest
from rich.console import Console
from test_market_model import NOW, _offer, trace
from test_quotes import _quote_spec

from broker import planning
from broker.app import render
from broker.core.broker import Broker
from broker.core.clock import SimulatedClock
from broker.domain.errors import InfeasibleError
from broker.domain.jobspec import IfOverBudget, JobSpec
from broker.pricing.availability import MarketModel
from broker.sim.market import OfferBook


@pytest.fixture(scope="module")
def broker():
    calm = MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)])
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    return Broker(None, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), calm, explained=True)


def _refusal(broker: Broker, spec: JobSpec) -> str:
    with pytest.raises(InfeasibleError) as refused:
        broker.quote(spec)
    return str(refused.value)


def test_the_deadline_a_refused_job_is_told_meets_the_odds_it_asked(broker):
    """The money model's earliest finish is the speed estimate's: told that deadline, a job was quoted at P(meet)
    0.34 with 0.95 asked. The deadline told is where the futures finish at the asked odds."""
    spec = _quote_spec(3.0).model_copy(update={"budget_usd": 100.0})
    message = _refusal(broker, spec)
    told = re.search(r"move --deadline to (\S+) or later", message)
    assert told and "quoted there, it meets the deadline 0.95 of the time" in message, message
    earliest = re.search(r"the earliest finish is (\S+ \S+) UTC", message)[1]
    assert datetime.fromisoformat(told[1]) > datetime.fromisoformat(earliest + "+00:00")
    quote = broker.quote(JobSpec(**{**spec.model_dump(exclude={"deadline"}), "deadline": told[1]}))
    assert not quote.short_of_odds, quote.forecast.p_meet_deadline


def test_the_budget_a_refused_job_is_told_is_kept_by_most_of_its_futures():
    """Told its expected cost rounded to the cent, a job given that budget was refused again for a fraction of a
    cent; given it up to the cent, its futures kept it about half the time, and in a flaky zone (where the rule falls
    back to on-demand) none did. It is told the 90th percentile of the futures it is quoted with at budget enough."""
    flaky = MarketModel.fit([trace("us-east-1a", [1] * 3 + [0] * 9, 300)])  # spot a quarter of the time
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    broker = Broker(None, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), flaky, explained=True)
    spec = _quote_spec(20.0).model_copy(update={"budget_usd": 1.0})
    message = _refusal(broker, spec)
    told = re.search(
        r"raise --budget to \$(\S+) \(its futures cost that or less 9 times in 10; \$(\S+) covers", message
    )
    assert told and float(told[1]) > float(told[2]), message
    capped = spec.model_copy(update={"if_over_budget": IfOverBudget.stop})  # quoted at budget enough: no cap there
    assert _refusal(broker, capped) == message
    quote = broker.quote(spec.model_copy(update={"budget_usd": float(told[1])}))
    assert quote.chosen.within_budget and quote.forecast.p_within_budget >= 0.85, quote.forecast.p_within_budget
    at_expected = broker.quote(spec.model_copy(update={"budget_usd": float(told[2])}))
    assert at_expected.chosen.within_budget and at_expected.forecast.p_within_budget < 0.5
    # a quote that more futures take over the budget than keep it says so, and what budget 9 in 10 keep
    warned = Console(width=200, record=True)
    warned.print(render.quote_table(at_expected, "quote"))
    over, text = 1 - at_expected.forecast.p_within_budget, " ".join(warned.export_text().split())
    assert f"the futures cost more than the budget {over:.0%} of the time" in text
    assert f"raise --budget to ${at_expected.forecast.cost_p90_usd:,.2f} for 9 in 10" in text
    calm = Console(width=200, record=True)
    calm.print(render.quote_table(quote, "quote"))
    assert "raise --budget" not in calm.export_text()


def test_a_job_that_starts_on_on_demand_lists_no_alternative_on_the_same_offer():
    """The start on on-demand takes the baseline's offer for the chosen one: the alternatives listed it again."""
    lost = MarketModel.fit([trace("us-east-1a", [1] * 60 + [0] * 3, 50)])  # spot lost every 10 hours
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    broker = Broker(None, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), lost)
    # 10 h of work in 14 h, half an hour to restore after each preemption: the reserve's start costs no more
    quote = broker.quote(_quote_spec(14.0, restore_minutes=30.0).model_copy(update={"budget_usd": 100.0}))
    assert quote.chosen.offer.tier.value == "on_demand", quote.forecast.evidence
    assert quote.chosen.offer.id not in [o.offer.id for o in quote.alternatives]
    assert [o.offer.tier.value for o in quote.alternatives] == ["spot"]  # the money model's choice heads them


def test_a_refused_job_no_later_deadline_helps_is_not_told_to_move_it():
    """In a zone with spot a quarter of the time, $12 keeps the job on spot, where it is slow: told the money
    model's deadline, it was refused again. No deadline up to 16 times its time is quoted at the odds within budget."""
    flaky = MarketModel.fit([trace("us-east-1a", [1] * 3 + [0] * 9, 300)])
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    broker = Broker(None, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), flaky, explained=True)
    message = _refusal(broker, _quote_spec(3.0).model_copy(update={"budget_usd": 12.0}))
    assert "move --deadline to" not in message and "is quoted at the 0.95 asked within the budget" in message
    assert message.count("move --deadline later and raise --budget, or lower deadline_probability") == 1
