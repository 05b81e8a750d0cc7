"""The money model: expected time and cost under preemption, and the odds of meeting a deadline."""

import math
import random
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.domain.model import Tier
from broker.domain.offer import Offer
from broker.models.fit import fits, unfit
from broker.models.launch_waits import down_hours, with_launch_waits
from broker.models.risk import (
    RESTART_OVERHEAD_H,
    STARTUP_H,
    checkpoint_hours,
    evaluate,
    exclusive_hours,
    poisson_cdf,
    young_interval_h,
)
from conftest import NOW, make_spec


def offer(accelerator="A100", count=1, tier=Tier.spot, price=1.0, hazard=0.0, gpu_memory_gb=40, **extra):
    return Offer(
        cloud=extra.get("cloud", "aws"),
        region="us-east-1",
        zone="use1-az1",
        instance_type="x",
        tier=tier,
        accelerator=accelerator,
        accelerator_count=count,
        gpu_memory_gb=gpu_memory_gb,
        vcpus=extra.get("vcpus", 8),
        memory_gb=extra.get("memory_gb", 64),
        price_usd_per_h=price,
        hazard_per_h=hazard,
    )


def test_exclusive_time_divides_reference_work_by_speed_and_gpu_count():
    spec = make_spec(resources={"accelerators": ["A100:1", "H100:8", "L4:1"]}, work={"gpu_hours": 12})
    assert exclusive_hours(spec, offer("A100")) == pytest.approx(12)
    assert exclusive_hours(spec, offer("H100", 8)) == pytest.approx(12 / (8 * 989 / 312), rel=1e-3)
    assert exclusive_hours(spec, offer("L4")) == pytest.approx(12 / (121 / 312), rel=1e-3)


def test_inference_work_uses_the_bandwidth_ratio():
    spec = make_spec(resources={"accelerators": ["H100"]}, work={"gpu_hours": 10, "kind": "inference"})
    assert exclusive_hours(spec, offer("H100")) == pytest.approx(10 / (3350 / 1555), rel=1e-3)


def test_steps_use_the_measured_rate_of_the_offers_accelerator():
    spec = make_spec(
        resources={"accelerators": ["L4", "T4"]}, work={"steps": 9000, "steps_per_hour": {"L4": 3000, "T4": 1000}}
    )
    assert exclusive_hours(spec, offer("L4")) == 3
    assert exclusive_hours(spec, offer("T4")) == 9


def test_fits_checks_tier_shape_and_memory():
    spec = make_spec(resources={"accelerators": ["A100:1"], "gpu_memory_gb": 48, "cpus": 8}, tiers=["spot"])
    assert not fits(spec, offer("A100", gpu_memory_gb=40))
    assert fits(spec, offer("A100", gpu_memory_gb=80))
    assert not fits(spec, offer("A100", gpu_memory_gb=80, count=2))
    assert not fits(spec, offer("A100", gpu_memory_gb=80, tier=Tier.on_demand))
    assert not fits(spec, offer("A100", gpu_memory_gb=80, vcpus=4))


def test_what_an_offer_lacks_is_said_naming_the_specs_field():
    """A queued job no agent fits says why of each agent: "agents have L4:1" told a job asking for L4:1 nothing."""
    spec = make_spec(
        resources={
            "accelerators": ["A100:1"],
            "gpu_memory_gb": 48,
            "cpus": 8,
            "memory_gb": 32,
            "region": ["us-east-1"],
        },
        tiers=["spot"],
    )
    good = {"gpu_memory_gb": 80}
    said = {
        "on_demand is not among its tiers (spot)": offer("A100", tier=Tier.on_demand, **good),
        "A100:2 is not among its accelerators (A100:1)": offer("A100", count=2, **good),
        "40 GB a GPU, it asks gpu_memory_gb: 48": offer("A100", gpu_memory_gb=40),
        "4 vCPUs, it asks cpus: 8": offer("A100", vcpus=4, **good),
        "16 GB of memory, it asks memory_gb: 32": offer("A100", memory_gb=16, **good),
    }
    for why, lacking in said.items():
        assert unfit(spec, lacking) == why and not fits(spec, lacking)
    elsewhere = offer("A100", **good).model_copy(update={"region": "eu-west-1", "zone": "euw1-az1"})
    assert unfit(spec, elsewhere) == "euw1-az1 is not where its resources place it (cloud, region, zone, exclude)"
    assert unfit(spec, offer("A100", **good)) is None and fits(spec, offer("A100", **good))


def test_on_demand_time_is_startup_plus_exclusive_time():
    option = evaluate(make_spec(work={"gpu_hours": 10}), offer(tier=Tier.on_demand, price=3.0), NOW)
    assert option.expected_wall_h == pytest.approx(STARTUP_H + 10)
    assert option.expected_cost_usd == pytest.approx(3.0 * (STARTUP_H + 10))
    assert option.checkpoint_interval_h is None and option.p_meet_deadline == 1.0


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_spot_time_follows_the_design_formula_with_youngs_interval(cloud):
    """A preemption loses half an interval, or the notice's lead where the 36 s write fits in it: EC2's 2 minutes,
    not GCE's 30 s."""
    spec = make_spec(work={"gpu_hours": 20}, checkpoint={"size_gb": 9, "restore_minutes": 3})
    lam = 0.05
    option = evaluate(spec, offer(hazard=lam, price=1.2, cloud=cloud), NOW)
    delta = 9 / 0.25 / 3600
    tau = math.sqrt(2 * delta / lam)
    restart = RESTART_OVERHEAD_H + 3 / 60
    lost = 120 / 3600 if cloud == "aws" else tau / 2
    expected = STARTUP_H + 20 * (1 + delta / tau) * (1 + lam * (restart + lost))
    assert option.checkpoint_interval_h == pytest.approx(tau)
    assert option.expected_wall_h == pytest.approx(expected)
    assert option.expected_cost_usd == pytest.approx(1.2 * expected)


def test_checkpoint_interval_never_exceeds_the_job():
    assert young_interval_h(checkpoint_h=0.01, hazard_per_h=1e-5, exclusive_h=3) == 3
    assert young_interval_h(checkpoint_h=0.01, hazard_per_h=0, exclusive_h=3) is None


def simulate_wall_h(t, delta, tau, lam, restart, rng):
    """One run: work in segments of tau, each followed by a checkpoint; preemptions lose the segment."""
    clock, done = STARTUP_H, 0.0
    next_preemption = rng.expovariate(lam)
    while done < t - 1e-12:
        segment = min(tau, t - done)
        span = segment + (delta if done + segment < t else 0)
        if clock + span > next_preemption:  # preempted mid-segment: lose it, restart
            clock = next_preemption + restart
            next_preemption = clock + rng.expovariate(lam)
            continue
        clock += span
        done += segment
    return clock


def test_expected_wall_time_agrees_with_simulated_preemptions():
    spec = make_spec(work={"gpu_hours": 30}, checkpoint={"size_gb": 45, "restore_minutes": 6})
    lam = 0.08
    option = evaluate(spec, offer(hazard=lam), NOW)
    rng = random.Random(7)
    delta, restart = checkpoint_hours(spec), RESTART_OVERHEAD_H + 0.1
    runs = [simulate_wall_h(30, delta, option.checkpoint_interval_h, lam, restart, rng) for _ in range(4000)]
    assert sum(runs) / len(runs) == pytest.approx(option.expected_wall_h, rel=0.03)


def simulate_on_a_zone(t, delta, tau, lam, restart, down_h, up_share, rng):
    """One run where spot is up a share of the time, in spells down of mean `down_h`: a start finds it down with
    1 - up_share and waits out the spell; a preemption ends a spell up, and the restart waits a whole spell down.
    The wall hours and the hours of them spent waiting (unbilled)."""
    waited = rng.expovariate(1 / down_h) if rng.random() > up_share else 0.0
    clock, done = STARTUP_H + waited, 0.0
    next_preemption = clock + rng.expovariate(lam)
    while done < t - 1e-12:
        segment = min(tau, t - done)
        span = segment + (delta if done + segment < t else 0)
        if clock + span > next_preemption:
            wait = rng.expovariate(1 / down_h)
            waited += wait
            clock = next_preemption + wait + restart
            next_preemption = clock + rng.expovariate(lam)
            continue
        clock += span
        done += segment
    return clock, waited


def test_a_start_and_each_restart_wait_out_a_spell_without_capacity_and_pay_nothing_for_it():
    """A zone up 40% of the time, down 2 h at a time, the only one of its speed. The money model priced a start that
    found no capacity as 1/a paid launch attempts of 5 minutes (7.5 minutes here) and a restart as one more: the wait
    is the spell's, unpaid."""
    spec = make_spec(work={"gpu_hours": 30}, checkpoint={"size_gb": 45, "restore_minutes": 6})
    lam, down_h, up_share = 0.08, 2.0, 0.4
    zone = offer(hazard=lam, price=1.5).model_copy(update={"availability": up_share, "mean_down_h": down_h})
    (zone,) = with_launch_waits([zone])  # the only zone of its speed
    assert zone.launch_waits_h == pytest.approx((0.6 * down_h, down_h))
    option = evaluate(spec, zone, NOW)
    rng = random.Random(11)
    delta, restart = checkpoint_hours(spec), RESTART_OVERHEAD_H + 0.1
    tau = option.checkpoint_interval_h
    runs = [simulate_on_a_zone(30, delta, tau, lam, restart, down_h, up_share, rng) for _ in range(4000)]
    assert sum(w for w, _ in runs) / len(runs) == pytest.approx(option.expected_wall_h, rel=0.03)
    assert sum(1.5 * (w - waited) for w, waited in runs) / len(runs) == pytest.approx(
        option.expected_cost_usd, rel=0.03
    )
    always_up = evaluate(spec, offer(hazard=lam, price=1.5), NOW)
    assert option.expected_wall_h - always_up.expected_wall_h > 5  # 0.6 x 2 h, then 2 h for each of 2.5 preemptions
    # an offer the market model did not measure: exponential spells from its hazard and availability
    assert down_hours(offer(hazard=lam).model_copy(update={"availability": up_share})) == pytest.approx(0.6 / 0.4 / lam)


def test_a_start_waits_only_while_every_region_with_a_zone_of_its_speed_is_down():
    """The rule launches a job in any zone of its speed that has capacity: one zone's spells overstated the wait. A
    region's zones go down together, so a region counts as its zone up the most."""
    east_a = offer(hazard=0.2).model_copy(update={"availability": 0.5, "mean_down_h": 2.0})
    east_b = east_a.model_copy(update={"zone": "use1-az2", "availability": 0.25, "mean_down_h": 6.0})
    west = east_a.model_copy(update={"region": "us-west-2", "zone": "usw2-az1", "availability": 0.75})
    slower = east_a.model_copy(update={"accelerator": "L4", "zone": "use1-az3"})  # another speed: its own
    on_demand = offer(tier=Tier.on_demand, price=3.0)
    waits = {o.id: o.launch_waits_h for o in with_launch_waits([east_a, east_b, west, slower, on_demand])}
    back_per_h = 1 / 2.0 + 1 / 2.0  # us-east-1 as use1-az1 (up half the time), us-west-2
    assert waits[east_a.id] == pytest.approx((0.5 * 0.25 / back_per_h, 0.25 / back_per_h))
    assert waits[east_b.id] == waits[east_a.id]  # its region's best zone stands for it
    assert waits[west.id] == pytest.approx((0.25 * 0.5 / back_per_h, 0.5 / back_per_h))
    assert waits[slower.id] == pytest.approx((0.5 * 2.0, 2.0))  # alone at its speed: its own spells
    assert waits[on_demand.id] is None


def test_deadline_odds_fall_as_the_deadline_tightens():
    spec_for = lambda hours: make_spec(work={"gpu_hours": 10}, deadline=f"+{hours}h")  # noqa: E731
    odds = [evaluate(spec_for(h), offer(hazard=0.2), NOW).p_meet_deadline for h in (30, 14, 12, 10.5, 10)]
    assert odds == sorted(odds, reverse=True)
    assert odds[0] > 0.99 and odds[-1] == 0.0


def test_p_meet_is_the_poisson_probability_of_few_enough_preemptions():
    spec = make_spec(work={"gpu_hours": 10}, checkpoint={"size_gb": 9, "restore_minutes": 3}, deadline="+13h")
    option = evaluate(spec, offer(hazard=0.1), NOW)
    tau = option.checkpoint_interval_h
    running = 10 * (1 + checkpoint_hours(spec) / tau)
    per_preemption = RESTART_OVERHEAD_H + 0.05 + min(tau / 2, 120 / 3600)  # EC2's notice: its lead is lost
    allowed = math.floor((13 - STARTUP_H - running) / per_preemption)
    mean = 0.1 * running
    assert option.p_meet_deadline == pytest.approx(
        sum(math.exp(-mean) * mean**k / math.factorial(k) for k in range(allowed + 1))
    )
    assert option.expected_finish == NOW + timedelta(hours=option.expected_wall_h)


@given(k=st.integers(0, 60), mean=st.floats(0.01, 40))
def test_poisson_cdf_matches_the_direct_sum(k, mean):
    direct = sum(math.exp(-mean) * mean**i / math.factorial(i) for i in range(k + 1))
    assert poisson_cdf(k, mean) == pytest.approx(min(direct, 1.0), abs=1e-9)


@settings(max_examples=60)
@given(hours=st.floats(0.1, 500), lam=st.floats(0, 0.5), size=st.floats(0, 200))
def test_more_hazard_never_makes_a_job_faster(hours, lam, size):
    spec = make_spec(work={"gpu_hours": hours}, checkpoint={"size_gb": size, "restore_minutes": 2})
    calm = evaluate(spec, offer(hazard=lam), NOW)
    stormy = evaluate(spec, offer(hazard=lam * 2 + 0.01), NOW)
    assert STARTUP_H + hours <= calm.expected_wall_h * (1 + 1e-12) <= stormy.expected_wall_h * (1 + 1e-12)
