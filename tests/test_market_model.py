"""The market model learned from traces: spells, sampled futures, siblings as a prior, hazard by run age.

The futures a job is played out on are tested in test_futures.py, quotes simulated on them in test_quotes.py."""

from dataclasses import replace
from datetime import UTC, datetime

import numpy as np
import pytest

from broker.models.launch_waits import down_hours
from broker.pricing.availability import MarketModel, spell_at_ticks, spells, tick_minimum
from broker.pricing.traces import Trace

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


def test_a_zone_without_traces_borrows_from_its_regions_traced_zones_before_the_others():
    calm = [trace(z, [1] * 60 + [0] * 6, 50) for z in ("us-west-2a", "us-west-2b")]  # up 10 h, down 1 h
    flaky = [trace(z, [1] * 6 + [0] * 6, 300) for z in ("us-east-1a", "us-east-1b")]  # up 1 h, down 1 h
    model = MarketModel.fit([*calm, *flaky])
    zone_id = _offer("us-east-1a").model_copy(update={"zone": "use1-az4"})  # live AWS offers name zone ids
    east = model.for_offer(zone_id)
    assert east.mean_up_h == pytest.approx(1.0) and east.p_launch == pytest.approx(0.5)
    assert "traced zones in us-east-1" in east.evidence
    assert model.for_offer(_offer("us-west-2z")).mean_up_h == pytest.approx(10.0)
    elsewhere = model.for_offer(_offer("eu-west-1a"))  # no zone of its region traced: its type's zones anywhere
    assert 2.0 < elsewhere.mean_up_h < 9.0 and "traced zones in" not in elsewhere.evidence
    key = ("aws", "use1-az4", "p3.2xlarge")  # our fleet's agents there keep the region's zones as its prior
    seen = model.with_recent({key: np.array([1, 1, 1, 0])}, {key: "us-east-1"}).zones[key]
    assert "traced zones in us-east-1" in seen.evidence and seen.mean_up_h < 2.0
    west = model.zones[("aws", "us-west-2a", "p3.2xlarge")]  # its own spells, its siblings' as prior
    assert model.spot_spells(zone_id) == pytest.approx((0.5, 1.0, 1.0))  # the region's zones: up 1 h, down 1 h
    assert model.spot_spells(_offer("us-west-2a")) == (west.p_launch, west.mean_up_h, west.mean_down_h)


def test_a_type_without_traces_is_modelled_at_its_offers_hazard_and_availability():
    model = MarketModel.fit([trace("us-east-1a", [1] * 6 + [0] * 6, 300, kind="r5.16xlarge")])
    offer = _offer("us-east-1a").model_copy(update={"hazard_per_h": 0.229, "availability": 0.62})
    zone = model.for_offer(offer)
    assert zone.evidence.startswith("no trace;") and "spot there 62% of the time" in zone.evidence
    assert zone.mean_up_h == pytest.approx(1 / 0.229, rel=0.02) and zone.p_launch == pytest.approx(0.62, abs=0.01)
    assert model.spot_spells(offer) is None  # nothing measured: the offer's own availability stands
    assert down_hours(offer) == pytest.approx(zone.mean_down_h, rel=0.02)  # and the money model waits as it draws
    pool = replace(trace("us-east1-b", [64, 60, 64], 100, kind="a2-highgpu-1g"), pool=True)  # Bamboo's GCP pools
    assert MarketModel.fit([pool]).zones == {}  # refilled to its size: no gap shows, so no spells of it
    never_up = MarketModel.fit([trace("us-east-1a", [0] * 6, 10)])
    assert never_up.spot_spells(_offer("us-east-1a"))[0] == pytest.approx(1e-3)  # odds the money model can use


def test_hazard_falls_with_run_age_when_up_spells_are_heavy_tailed():
    model = MarketModel.fit([trace("us-east-1a", [1] * 2 + [0] * 2 + [1] * 120 + [0] * 2, 30)])
    rates = [rate for _, _, rate in model.zones[("aws", "us-east-1a", "p3.2xlarge")].hazard_by_age()]
    assert rates[0] > rates[2]


def _offer(zone: str, tier: str = "spot", price: float = 0.9):
    from broker.domain.offer import Offer

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


def test_each_tick_falls_in_the_spell_its_middle_is_in():
    rng = np.random.default_rng(3)
    lengths = np.concatenate([rng.integers(1, 9, (50, 12)) / 2, rng.exponential(4.0, (50, 12))])  # ends on x.5 too
    ends = np.cumsum(lengths, axis=1)
    expected = np.stack([np.searchsorted(row, np.arange(60) + 0.5, side="right") for row in ends])
    assert (spell_at_ticks(ends, 60) == expected).all()
