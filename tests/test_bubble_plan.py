"""Bubble profiles, PipeFill's fill plan and doubling probe, and bubbles as planner offers."""

from datetime import UTC, datetime

import pytest

from broker.agents.contract import Contract
from broker.bubbles.capacity import bubble_offer, measured_speed
from broker.bubbles.fill_plan import Node, best_configuration, fill_plan, fill_throughput
from broker.bubbles.probe import AS_SUBMITTED, MIN_TIMED, PROBE_STEPS, PROBE_WINDOWS, ConfigurationProbe
from broker.bubbles.profiler import profile
from broker.domain.bubbles import BubbleProfile, WindowStats
from broker.domain.model import Tier
from broker.planning.costslo import CostSLO
from broker.planning.option_table import PlanItem
from broker.store.profiles import load_profiles, save_profile
from conftest import NOW, make_spec

T = datetime(2026, 11, 22, tzinfo=UTC)
GB = 10**9


def windows(iterations=5):
    """Records as the engine writes them: each iteration a 0.30-0.32 s fill-drain and a 0.1 s fwd-bwd window."""
    out, its = [], []
    for k in range(iterations):
        base = k * 1.0
        its.append((base, base + 1.0))
        out.append(("fill-drain", base + 0.60, base + 0.90 + 0.005 * k, 8 * GB - k))
        out.append(("fwd-bwd", base + 0.20, base + 0.30, 6 * GB))
    return out, its


def test_profile_takes_medians_p10_and_the_least_free_memory_after_warmup():
    records, iterations = windows()
    p = profile("llama", 3, "cpu", records, iterations, T)
    assert p.iteration_s == pytest.approx(1.0)
    by_kind = {w.kind: w for w in p.windows}
    assert by_kind["fill-drain"].count == 4 and by_kind["fill-drain"].median_s == pytest.approx(0.3125)
    assert (
        by_kind["fill-drain"].p10_s < by_kind["fill-drain"].median_s and by_kind["fill-drain"].free_bytes == 8 * GB - 4
    )
    assert p.usable_s(0.2) == pytest.approx(by_kind["fill-drain"].p10_s)


def test_a_stored_profile_is_replaced_only_when_the_iteration_time_drifts(store):
    records, iterations = windows()
    first = profile("llama", 3, "cpu", records, iterations, T)
    assert save_profile(store, first)
    assert not save_profile(store, first.model_copy(update={"iteration_s": 1.05}))
    assert save_profile(store, first.model_copy(update={"iteration_s": 1.2}))
    assert [p.iteration_s for p in load_profiles(store)] == [1.2]


def test_fill_plan_packs_nodes_into_bubbles_cyclically_within_time_and_memory():
    bubbles = [(1.0, 4 * GB), (0.5, 1 * GB)]
    nodes = [Node(0.4, 2 * GB), Node(0.3, 1 * GB)]
    partitions = fill_plan(bubbles, nodes)
    assert partitions[0] == [0, 1]  # 0.7 s in the 1.0 s bubble; the next node (0.4 s) would overrun it
    assert partitions[1] == []  # the 2 GB node does not fit the 1 GB bubble
    for k, part in enumerate(partitions):
        duration, memory = bubbles[k % 2]
        assert sum(nodes[n].time_s for n in part) <= duration and all(nodes[n].memory_bytes <= memory for n in part)


def test_a_node_that_fits_no_bubble_makes_the_job_infeasible_instead_of_looping():
    assert fill_plan([(1.0, 4 * GB)], [Node(0.2, GB), Node(1.5, GB)]) is None
    assert fill_throughput([(1.0, 4 * GB)], 3.0, [Node(0.2, 8 * GB)]) == 0.0


def test_throughput_is_below_the_bubble_share_and_the_best_configuration_wins():
    bubbles, iteration = [(0.9, 4 * GB), (0.3, 4 * GB)], 3.0
    small = [Node(0.1, GB)] * 4
    big = [Node(0.5, 3 * GB)] * 2
    assert 0 < fill_throughput(bubbles, iteration, big) < fill_throughput(bubbles, iteration, small) <= 1.2 / 3.0
    assert best_configuration(bubbles, iteration, {"batch 8": small, "batch 32": big})[0] == "batch 8"


def test_the_configuration_that_does_most_work_wins_and_one_over_the_free_memory_is_out():
    bubbles, iteration = [(0.03, 4 * GB)], 0.1
    steps = {  # one step of the same work, split into 1, 2 or 4 micro-steps
        "1x16": [Node(0.040, GB)],  # longer than the window: runs nowhere
        "2x8": [Node(0.014, GB)] * 2,  # a whole step a window, in 28 of its 30 ms
        "4x4": [Node(0.010, GB)] * 4,  # fills all 30 ms, but with three quarters of a step
    }
    assert fill_throughput(bubbles, iteration, steps["1x16"]) == 0.0
    assert fill_throughput(bubbles, iteration, steps["4x4"]) > fill_throughput(bubbles, iteration, steps["2x8"])
    assert best_configuration(bubbles, iteration, steps)[0] == "2x8"  # work per second, not time used
    steps["2x8"] = [Node(0.014, 5 * GB)] * 2  # its micro-batches need more than the window has free
    assert best_configuration(bubbles, iteration, steps)[0] == "4x4"
    assert best_configuration([(0.009, 4 * GB)], iteration, steps) is None


def test_the_probe_runs_on_in_the_best_timed_configuration_and_drops_one_killed_in_its_windows():
    probe = ConfigurationProbe({"2x8": {"micro_steps": 2}, "8x2": {"micro_steps": 8}}, micro_steps=1)
    assert probe.trial.name == AS_SUBMITTED
    for _ in range(MIN_TIMED):  # one step a window, each longer than the window
        probe.record({"steps": [(0.0, 0.040)]}, micro_steps=1, peak_bytes=GB)
    for _ in range(PROBE_WINDOWS - MIN_TIMED):
        probe.record({"steps": []}, micro_steps=1, peak_bytes=GB)
    assert probe.trial.timed() and probe.advance().name == "2x8"
    for _ in range(PROBE_STEPS):
        probe.record({"steps": [(0.0, 0.021)]}, micro_steps=2, peak_bytes=GB)
    assert probe.advance().name == "8x2"
    probe.record(None, micro_steps=8, peak_bytes=GB)  # killed twice: its steps do not end in the windows
    probe.record(None, micro_steps=8, peak_bytes=GB)
    assert probe.trial.timed() and probe.advance() is None
    chosen = probe.choice([(0.03, 4 * GB)], 0.1)
    assert chosen.name == "2x8" and chosen.overrides == {"micro_steps": 2}
    assert probe.efficiency(chosen) == pytest.approx(0.040 / 0.042)  # per step, a little slower than as submitted
    assert probe.choice([(0.03, GB // 2)], 0.1) is None  # the task needs more memory than the windows have
    assert probe.choice([(0.01, 4 * GB)], 0.1) is None  # every configuration known to be longer than the windows


def test_a_configuration_timed_on_too_few_steps_is_not_judged():
    probe = ConfigurationProbe({}, micro_steps=1)
    probe.record({"steps": [(0.0, 0.040)]}, micro_steps=1, peak_bytes=GB)  # one slow first step, then no window
    for _ in range(PROBE_WINDOWS - 1):
        probe.record({"steps": []}, micro_steps=1, peak_bytes=GB)
    assert probe.trial.timed() and probe.advance() is None
    assert probe.choice([(0.03, 4 * GB)], 0.1).name == AS_SUBMITTED  # runs on as submitted: no evidence it cannot
    assert probe.choice([(0.03, GB // 2)], 0.1) is None  # but its memory is known, and is too much


def stage_profile(free_gb=12.0):
    return BubbleProfile(
        main_job="llama-70b",
        stage=3,
        device="cuda:3 H100",
        iteration_s=7.4,
        measured_at=T,
        windows=[
            WindowStats(kind="fill-drain", median_s=2.0, p10_s=1.9, free_bytes=int(free_gb * GB), count=20),
            WindowStats(kind="scattered", median_s=0.02, p10_s=0.01, free_bytes=int(free_gb * GB), count=80),
        ],
    )


def test_a_profile_becomes_a_bubble_offer_the_planner_uses_for_fill_jobs():
    offer = bubble_offer(stage_profile(), "aws", "us-east-1", "H100")
    assert offer.tier == Tier.bubble and offer.price_usd_per_h == 0 and offer.gpu_memory_gb == pytest.approx(12.0)
    assert offer.speed_factor == pytest.approx(1.9 / 7.4 * 0.9)  # the 10 ms scattered gaps are not counted
    fill = PlanItem(
        "eval", make_spec(resources={"accelerators": ["H100:1"]}, work={"gpu_hours": 1}, deadline="+48h", fill=True)
    )
    plan = CostSLO().plan([fill], [offer], {offer.id: 1}, NOW)
    assert plan.assignments == {"eval": offer.id}
    assert (
        bubble_offer(
            stage_profile().model_copy(update={"windows": stage_profile().windows[1:]}), "aws", "us-east-1", "H100"
        )
        is None
    )


def test_measured_steps_reprice_a_bubble_offer_and_the_agent_record_keeps_its_lease(store):
    # windows of 0.30 s and 0.10 s in a 1.0 s iteration: 0.10 s steps fill both whole, 0.16 s steps waste a third
    assert measured_speed([0.30, 0.10], 1.0, 0.10) == pytest.approx(0.40)
    assert measured_speed([0.30, 0.10], 1.0, 0.16) == pytest.approx(0.16)  # one step in the 0.30 s window only
    assert measured_speed([0.30, 0.10], 1.0, 0.31) == 0.0  # longer than every window
    with pytest.raises(ValueError, match="step_s"):
        measured_speed([0.30], 1.0, 0.0)

    offer = bubble_offer(stage_profile(), "local", "local", "H100")
    contract = Contract(store, "llm-stage0")
    contract.register(offer, lease_ms=60_000)
    contract.leave()
    contract.offer(offer.model_copy(update={"speed_factor": 0.05}))
    agent = store.get_agent("llm-stage0")
    assert agent.offer.speed_factor == 0.05 and agent.offer.id == offer.id
    assert store.leases(["llm-stage0"]) == {"llm-stage0": "leaving"}  # the mark survives the new offer
    assert store.set_agent_offer("nobody", offer) is False


def test_a_fill_agent_offers_the_speed_its_measured_steps_get(store, tmp_path):
    from broker.agents.checkpoints import CheckpointStore
    from broker.bubbles.agent import FillAgent

    measured = stage_profile()
    offer = bubble_offer(measured, "local", "local", "H100")
    agent = FillAgent(store, CheckpointStore(str(tmp_path)), measured, offer)
    agent.contract.register(offer, lease_ms=60_000)
    windows = list(agent.window_s.values())
    agent._reprice(min(windows) / 2)  # short steps: about the profile's guess, so the offer stays
    assert store.get_agent(agent.id).offer.speed_factor == offer.speed_factor
    agent._reprice(max(windows) * 0.6)  # one step fits the longest window only: far slower than guessed
    repriced = store.get_agent(agent.id).offer.speed_factor
    assert repriced == pytest.approx(measured_speed(windows, measured.iteration_s, max(windows) * 0.6))
    assert repriced < 0.9 * offer.speed_factor
