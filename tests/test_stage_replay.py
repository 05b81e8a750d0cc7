"""The one-stage replay the GPU bench uses (bench/stage_replay.py): its waits are the schedule model's
windows, and fill from a second process leaves the stage's arithmetic untouched."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from stage_replay import MEMORY_BUDGET, Stage, replay, waits  # noqa: E402

from broker.bubbles.recorder import BubbleRecorder  # noqa: E402
from broker.models.schedule import bubble_windows  # noqa: E402

T_F, T_B = [0.010, 0.014, 0.012, 0.016], [0.020, 0.026, 0.022, 0.030]


@pytest.mark.parametrize("stage", range(4))
def test_waits_are_the_models_windows_and_add_up_to_its_period(stage):
    period, windows = bubble_windows("deepspeed", 4, 4, T_F, T_B)
    plan = waits(stage, 4, 4, T_F, T_B)
    busy = sum(T_F[stage] if op.kind == "F" else T_B[stage] for _, _, op in plan)
    assert sum(before for before, _, _ in plan) + busy == pytest.approx(period)
    marked = {kind: before for before, kind, _ in plan if kind and before > 1e-12}
    expected = {w.kind: w.duration_s for w in windows[stage] if w.kind != "scattered"}
    assert marked == pytest.approx(expected)


def test_fill_in_the_marked_waits_leaves_the_stages_losses_bit_identical(monkeypatch):
    from stage_fill import Filler

    monkeypatch.syspath_prepend(str(ROOT / "examples" / "bubbles"))  # the spawned child imports fill_mlp by name
    plan = waits(1, 4, 4, T_F, T_B)
    plain = replay(Stage(1, 4, 2, "cpu"), plan, 5, "cpu", BubbleRecorder(MEMORY_BUDGET))
    filled = replay(
        Stage(1, 4, 2, "cpu"),
        plan,
        5,
        "cpu",
        BubbleRecorder(MEMORY_BUDGET),
        fill_from=2,
        fill=lambda recorder, iterations: Filler("fill_mlp:MlpFill", recorder, 1),
    )
    assert plain["losses"] == filled["losses"]
    assert len(plain["losses"]) == 5 and len({round(x, 6) for x in plain["losses"]}) == 5  # it trains
    kinds = {kind for kind, *_ in filled["windows"]}
    assert kinds == {"fill-drain", "fwd-bwd"}
    assert filled["fill"]["steps"], "the fill task ran no step in three iterations of windows"
    first_filled = filled["iterations"][2][0]
    assert all(began >= first_filled for began, _, _ in filled["fill"]["steps"])  # none before it was started
