"""The first planner: the cheapest offer that meets the deadline and the budget, checked by brute force."""

import math
import re
from datetime import timedelta

import pytest

from broker import planning
from broker.domain.errors import BrokerError, InfeasibleError
from broker.domain.model import Tier
from broker.models.risk import evaluate
from conftest import NOW, make_spec

POLICY = planning.get("cheapest")


def brute_force_cheapest(spec, offers):
    """Independently: scan every offer, keep those that fit and are feasible, take the minimum cost."""
    best = None
    for o in offers:
        shape_ok = any(a.name == o.accelerator and a.count == o.accelerator_count for a in spec.resources.accelerators)
        memory_ok = spec.resources.gpu_memory_gb is None or o.gpu_memory_gb >= spec.resources.gpu_memory_gb
        if not (shape_ok and memory_ok and o.tier in spec.tiers):
            continue
        option = evaluate(spec, o, NOW)
        if spec.deadline is not None and option.p_meet_deadline < spec.deadline_probability:
            continue
        if spec.budget_usd is not None and option.expected_cost_usd > spec.budget_usd:
            continue
        if best is None or option.expected_cost_usd < best.expected_cost_usd:
            best = option
    return best


SPECS = {
    "lora-any-24gb": dict(
        resources={"accelerators": ["A10G", "L4", "A100"], "gpu_memory_gb": 24}, work={"gpu_hours": 6}, deadline="+24h"
    ),
    "big-tight": dict(
        resources={"accelerators": ["A100:8", "H100:8", "H200:8"]},
        work={"gpu_hours": 800},
        deadline="+40h",
        deadline_probability=0.99,
    ),
    "on-demand-only": dict(resources={"accelerators": ["V100:1", "T4:1"]}, work={"gpu_hours": 1}, tiers=["on_demand"]),
    "inference-budget": dict(
        resources={"accelerators": ["L4", "T4", "A10G"]}, work={"gpu_hours": 3, "kind": "inference"}, budget_usd=4
    ),
}


@pytest.mark.parametrize("name", SPECS)
def test_chosen_offer_is_the_cheapest_feasible_one_by_brute_force(name, catalog):
    spec = make_spec(**SPECS[name])
    quote = POLICY.quote(spec, catalog.offers, NOW)
    best = brute_force_cheapest(spec, catalog.offers)
    assert quote.chosen.expected_cost_usd == pytest.approx(best.expected_cost_usd)
    assert quote.chosen.feasible


def test_quote_cost_is_price_times_expected_time(catalog):
    quote = POLICY.quote(make_spec(**SPECS["lora-any-24gb"]), catalog.offers, NOW)
    for option in [quote.chosen, *quote.alternatives, quote.on_demand_baseline]:
        assert option.expected_cost_usd == pytest.approx(option.offer.price_usd_per_h * option.expected_wall_h)


def test_a_tight_deadline_moves_the_job_to_faster_gpus(catalog):
    loose = POLICY.quote(make_spec(**{**SPECS["big-tight"], "deadline": "+200h"}), catalog.offers, NOW)
    tight = POLICY.quote(make_spec(**SPECS["big-tight"]), catalog.offers, NOW)
    assert loose.chosen.offer.accelerator == "A100"  # 100 h on 8x A100 is the cheapest when time allows
    assert tight.chosen.offer.accelerator in {"H100", "H200"}
    assert tight.chosen.expected_cost_usd >= loose.chosen.expected_cost_usd


def test_on_demand_only_jobs_get_on_demand(catalog):
    quote = POLICY.quote(make_spec(**SPECS["on-demand-only"]), catalog.offers, NOW)
    assert quote.chosen.offer.tier == Tier.on_demand and quote.savings_usd == pytest.approx(0)


def test_alternatives_are_distinct_feasible_and_no_cheaper(catalog):
    quote = POLICY.quote(make_spec(**SPECS["lora-any-24gb"]), catalog.offers, NOW)
    shapes = [(o.offer.cloud, o.offer.instance_type, o.offer.tier) for o in [quote.chosen, *quote.alternatives]]
    assert len(quote.alternatives) == 4 and len(set(shapes)) == 5
    costs = [o.expected_cost_usd for o in [quote.chosen, *quote.alternatives]]
    assert costs == sorted(costs) and all(o.feasible for o in quote.alternatives)


def test_savings_are_against_the_cheapest_on_demand_option_that_meets_the_deadline(catalog):
    spec = make_spec(**SPECS["lora-any-24gb"])
    quote = POLICY.quote(spec, catalog.offers, NOW)
    on_demand = [
        evaluate(spec, o, NOW)
        for o in catalog.offers
        if o.tier == Tier.on_demand and o.accelerator in {"A10G", "L4", "A100"} and o.accelerator_count == 1
    ]
    cheapest = min((o for o in on_demand if o.meets_deadline), key=lambda o: o.expected_cost_usd)
    assert quote.on_demand_baseline.expected_cost_usd == pytest.approx(cheapest.expected_cost_usd)
    assert quote.savings_usd == pytest.approx(cheapest.expected_cost_usd - quote.chosen.expected_cost_usd)
    assert quote.savings_pct == pytest.approx(100 * quote.savings_usd / cheapest.expected_cost_usd)


def test_infeasible_job_names_the_cheapest_on_time_option_and_earliest_finish_within_budget(catalog):
    spec = make_spec(
        resources={"accelerators": ["A100:1", "L4:1"]}, work={"gpu_hours": 20}, deadline="+22h", budget_usd=12
    )
    with pytest.raises(InfeasibleError) as err:
        POLICY.quote(spec, catalog.offers, NOW)
    message = str(err.value)
    options = [
        evaluate(spec, o, NOW) for o in catalog.offers if o.accelerator in {"A100", "L4"} and o.accelerator_count == 1
    ]
    on_time = min((o for o in options if o.meets_deadline), key=lambda o: o.expected_cost_usd)
    in_budget = min((o for o in options if o.within_budget), key=lambda o: o.expected_finish)
    assert f"cheapest option meeting the deadline is {on_time.offer.cloud} {on_time.offer.instance_type}" in message
    budget = f"${math.ceil(on_time.expected_cost_usd * 100) / 100:,.2f}"  # up to the cent: a budget that admits it
    assert f"at {budget}" in message
    assert f"earliest finish within the budget is {in_budget.expected_finish:%Y-%m-%d %H:%M} UTC" in message
    at = (in_budget.expected_finish + timedelta(seconds=59)).replace(second=0, microsecond=0)  # the next minute
    later = f"move --deadline to {at:%Y-%m-%dT%H:%MZ} or later"  # a value the flag takes
    assert message.endswith(f"raise --budget to {budget} or {later}")
    assert "\n" not in message


def test_the_deadline_an_infeasible_job_is_told_to_move_to_is_one_it_is_quoted_at(catalog):
    spec = make_spec(resources={"accelerators": ["A100:1"]}, work={"gpu_hours": 20}, deadline="+3h", budget_usd=1000)
    with pytest.raises(InfeasibleError) as err:
        POLICY.quote(spec, catalog.offers, NOW)
    told = re.search(r"move --deadline to (\S+) or later", str(err.value))
    assert told, str(err.value)
    quote = POLICY.quote(
        make_spec(**{**spec.model_dump(exclude={"deadline"}), "deadline": told[1]}), catalog.offers, NOW
    )
    assert quote.chosen.meets_deadline and quote.chosen.within_budget


@pytest.mark.parametrize(
    "deadline, budget_usd, fix",
    [
        ("+3h", 1000, "; move --deadline to 20"),  # no offer is that fast: a budget raise would not help
        ("+22h", 1, "; raise --budget to $"),  # the deadline is met, nothing fits $1: a later deadline would not help
        ("+3h", 1, "; move --deadline later and raise --budget"),  # neither alone
    ],
)
def test_an_infeasible_job_is_told_only_the_fix_that_helps(catalog, deadline, budget_usd, fix):
    spec = make_spec(
        resources={"accelerators": ["A100:1", "L4:1"]}, work={"gpu_hours": 20}, deadline=deadline, budget_usd=budget_usd
    )
    with pytest.raises(InfeasibleError) as err:
        POLICY.quote(spec, catalog.offers, NOW)
    message = str(err.value)
    assert fix in message and message.replace(" or later", "").count(" or ") == 0  # one fix, not a choice of two


@pytest.mark.parametrize(
    "fields,says",
    [
        ({"resources": {"accelerators": ["K80:3"]}}, "resources.accelerators: no offer has K80:3; there are K80:1"),
        ({"tiers": ["bubble"]}, "tiers: bubbles run only fill jobs (fill: true, with a fill_task); add spot"),
        ({"resources": {"accelerators": ["L4:1"], "gpu_memory_gb": 500}}, "(the most: 24 GB a GPU"),
        ({"resources": {"accelerators": ["L4:1"], "zone": ["us-east4-z"]}}, "did you mean us-east4-"),
        (
            {"resources": {"accelerators": ["L4:1"], "cloud": ["azure"]}},
            "resources.cloud: no L4:1 offer in cloud azure",
        ),
        ({"resources": {"accelerators": ["L4:1"], "exclude": ["aws", "gcp"]}}, "in a place it excludes (aws, gcp)"),
    ],
)
def test_a_job_no_offer_fits_is_told_which_of_its_asks_leaves_none_and_what_there_is(catalog, fields, says):
    with pytest.raises(InfeasibleError) as refused:
        POLICY.quote(make_spec(**fields), catalog.offers, NOW)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(BrokerError, match="choose one of cbl-greedy, cheapest, cost-to-go, costslo"):
        planning.get("nope")
