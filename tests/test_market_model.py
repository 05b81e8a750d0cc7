"""The market model learned from traces, the futures it samples, and quotes simulated on them."""

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from broker import planning
from broker.core.broker import Broker
from broker.core.clock import SimulatedClock
from broker.models.futures import Setting, simulate
from broker.pricing.availability import MarketModel, spells, tick_minimum
from broker.pricing.traces import Trace
from broker.sim.calibration import cost_errors_pct, reliability
from broker.sim.market import OfferBook

NOW = datetime(2023, 2, 15, tzinfo=UTC)


def trace(zone: str, pattern: list[int], repeat: int, kind: str = "p3.2xlarge") -> Trace:
    data = np.tile(np.asarray(pattern, dtype=float), repeat)
    return Trace(zone, "availability", "aws", zone[:-1], zone, kind, 600.0, data)


def test_spells_are_the_run_lengths_of_up_and_down():
    up, down = spells(np.array([1, 1, 0, 0, 0, 1, 0, 1, 1, 1], dtype=bool))
    assert up.tolist() == [2, 1, 3] and down.tolist() == [3, 1]


def test_a_tick_has_spot_only_when_it_lasted_the_whole_tick():
    assert tick_minimum(np.array([1, 1, 0, 1, 1, 1]), 200.0, 600.0).tolist() == [0, 1]


def test_sampled_futures_keep_the_traces_share_of_time_up_and_their_spell_lengths():
    model = MarketModel.fit([trace("us-east-1a", [1] * 6 + [0] * 12, 200)])  # up 1 h, down 2 h
    zone = model.zones[("aws", "us-east-1a", "p3.2xlarge")]
    assert zone.mean_up_h == pytest.approx(1.0) and zone.mean_down_h == pytest.approx(2.0)
    futures = zone.sample(np.random.default_rng(0), 500, 300)
    assert futures.mean() == pytest.approx(1 / 3, abs=0.03)
    assert futures[:, 0].mean() == pytest.approx(1 / 3, abs=0.06)  # P(launch now)
    lengths = np.concatenate([spells(f[1:-1])[0] for f in futures[:50]])
    assert np.median(lengths) == 6


def test_a_zone_with_little_evidence_borrows_from_its_siblings():
    calm = [trace(z, [1] * 60 + [0] * 6, 50) for z in ("us-west-2a", "us-west-2b", "us-west-2c")]
    flaky = trace("us-west-2d", [1] * 3 + [0] * 3, 2)  # two short spells only
    model = MarketModel.fit([*calm, flaky])
    zone = model.zones[("aws", "us-west-2d", "p3.2xlarge")]
    assert zone.weight < 0.2
    assert zone.mean_up_h > 5 * 0.5  # pulled toward the siblings' 10 h up-spells from its own 0.5 h
    unseen = model.for_offer(_offer("us-west-2z"))
    assert unseen.mean_up_h == pytest.approx(10.0, rel=0.05) and "no trace of this zone" in unseen.evidence


def test_hazard_falls_with_run_age_when_up_spells_are_heavy_tailed():
    model = MarketModel.fit([trace("us-east-1a", [1] * 2 + [0] * 2 + [1] * 120 + [0] * 2, 30)])
    rates = [rate for _, _, rate in model.zones[("aws", "us-east-1a", "p3.2xlarge")].hazard_by_age()]
    assert rates[0] > rates[2]


def _setting(**changes) -> Setting:
    base = dict(
        work_h=10.0,
        od_work_h=10.0,
        spot_prices=(1.0,),
        od_price=3.0,
        restart_h=0.1,
        checkpoint_h=0.0,
        interval_h=1.0,
        window_h=20.0,
        rule="greedy",
    )
    return Setting(**{**base, **changes})


def test_always_available_spot_costs_the_work_plus_one_restart():
    out = simulate(_setting(), np.ones((1, 3, 200), dtype=bool), 1 / 6)
    assert out.cost_usd == pytest.approx(np.full(3, 10.1)) and out.finish_h == pytest.approx(np.full(3, 10.1))


def test_without_spot_the_safety_net_moves_the_job_to_on_demand_in_time():
    out = simulate(_setting(), np.zeros((1, 2, 200), dtype=bool), 1 / 6)
    assert (out.finish_h <= 20.0).all() and out.od_h == pytest.approx(np.full(2, 10.1))
    blind = simulate(_setting(rule="spot-only"), np.zeros((1, 2, 200), dtype=bool), 1 / 6)
    assert np.isinf(blind.finish_h).all() and (blind.cost_usd == 0).all()


def test_a_preemption_loses_the_work_since_the_last_checkpoint():
    available = np.ones((1, 1, 200), dtype=bool)
    available[0, 0, 10] = False  # preempted after 1 h 40 min, back 10 minutes later
    hourly = simulate(_setting(), available, 1 / 6)
    never = simulate(_setting(interval_h=None), available, 1 / 6)
    assert hourly.finish_h[0] < never.finish_h[0]
    assert never.finish_h[0] == pytest.approx(11 / 6 + 0.1 + 10, abs=1e-6)  # all 1.5 h of progress lost


def test_the_next_zone_takes_the_job_when_the_cheapest_has_no_capacity():
    available = np.zeros((2, 1, 200), dtype=bool)
    available[1] = True
    out = simulate(_setting(spot_prices=(1.0, 2.0)), available, 1 / 6)
    assert out.cost_usd[0] == pytest.approx(2 * 10.1)


def _offer(zone: str, tier: str = "spot", price: float = 0.9):
    from broker.domain.model import Offer

    return Offer(
        cloud="aws",
        region=zone[:-1],
        zone=zone,
        instance_type="p3.2xlarge",
        tier=tier,
        accelerator="V100",
        accelerator_count=1,
        gpu_memory_gb=16,
        vcpus=8,
        memory_gb=61,
        price_usd_per_h=price,
        hazard_per_h=0.2 if tier == "spot" else 0.0,
        availability=0.9 if tier == "spot" else 1.0,
    )


def _quote(model: MarketModel, window_h: float):
    from broker.domain.jobspec import JobSpec

    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    clock = SimulatedClock(NOW)
    spec = JobSpec(
        name="train",
        run=["simulated"],
        resources={"accelerators": ["V100:1"]},
        work={"gpu_hours": 4.0, "kind": "training"},
        checkpoint={"size_gb": 1.0, "restore_minutes": 1.0},
        deadline=NOW + timedelta(hours=window_h),
        budget_usd=12.0,
    )
    return Broker(None, OfferBook(offers), planning.get("costslo"), clock, model).quote(spec)


def test_a_quote_on_a_flaky_zone_is_not_certain_and_on_a_calm_one_it_is_cheap():
    flaky = MarketModel.fit([trace("us-east-1a", [1] * 3 + [0] * 9, 300)])  # up a quarter of the time
    calm = MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)])
    tight, easy = _quote(flaky, 14.0).forecast, _quote(calm, 14.0).forecast
    assert tight.futures == 1000 and tight.rule == "greedy"
    assert tight.cost_p50_usd > easy.cost_p50_usd and tight.cost_p90_usd >= tight.cost_p50_usd
    assert easy.p_within_budget > tight.p_within_budget
    assert easy.spot_share > 0.9 > tight.spot_share
    assert tight.finish_p90 <= NOW + timedelta(hours=14.0)  # the guard's on-demand keeps the deadline


def test_quote_figures_count_errors_and_calibration():
    rows = [
        {"quoted_cost_usd": 10.0, "cost_usd": c, "p_meet": 0.9, "met": m}
        for c, m in [(11, True)] * 17 + [(5, False)] * 3
    ]
    assert cost_errors_pct(rows) == (10.0, 50.0)
    figures = reliability(rows)
    assert figures["calibration_max_gap_pts"] == pytest.approx(5.0) and figures["brier"] == pytest.approx(0.13)
