"""A real DeepSpeed pipeline (4 stages, gloo, torchrun) marks its bubbles without changing training."""

import json
import os
import subprocess
import sys
from datetime import UTC
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "bubbles" / "train_gpt.py"
STEPS = 3


def train(out: Path, *flags: str) -> list[dict]:
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nproc_per_node", "4", str(SCRIPT), "--steps", str(STEPS), "--out", str(out), *flags]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return sorted((json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(4)), key=lambda r: r["stage"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipeline")
    timed = (
        "--time-instructions",
        "--profile-compute",
        "--probe-allreduce",
        "65536",
    )  # measuring must not change training
    return train(tmp / "plain", *timed), train(tmp / "marked", "--instrument")


def test_losses_are_identical_bit_for_bit_with_the_bubble_marks(runs):
    plain, marked = runs
    for a, b in zip(plain, marked):
        assert a["losses"] == b["losses"] and len(a["losses"]) == STEPS
    assert plain[0]["losses"][-1] != plain[0]["losses"][0]  # it trained


def test_the_timed_run_records_where_each_stage_spends_its_iteration(runs):
    plain, _ = runs
    for stage in plain:
        ms = stage["instruction_ms"]
        iteration_ms = 1000 * min(end - start for start, end in stage["iterations"])
        assert 0 < 4 * (ms["ForwardPass"] + ms["BackwardPass"]) < iteration_ms  # 4 microbatches a step
        assert ("RecvActivation" in ms) == (stage["stage"] > 0) and ("RecvGrad" in ms) == (stage["stage"] < 3)
        assert stage["allreduce_s"] > 0
    profiles = [stage["compute_profiles"] for stage in plain]
    assert sum(len(p) for p in profiles) == 1 and len(profiles[0]) == 1  # rank 0 alone, after the last step
    assert all(t_f > 0 and t_b > 0 for t_f, t_b in profiles[0][0].values())


def test_each_stage_records_the_windows_the_schedule_has(runs):
    _, marked = runs
    kinds = [[w[0] for w in stage["windows"]] for stage in marked]
    assert kinds[0] == ["fwd-bwd"] * STEPS  # the first stage never waits for activations
    assert kinds[3] == ["fill-drain"] * STEPS  # the last stage never waits for gradients
    for middle in kinds[1:3]:
        assert middle == ["fill-drain", "fwd-bwd"] * STEPS
    for stage in marked:
        for (_kind, start, end, free), (began, ended) in zip(
            stage["windows"][:: len(stage["windows"]) // STEPS], stage["iterations"]
        ):
            assert began <= start <= end <= ended and free > 0


def test_the_recorded_windows_make_a_profile_per_stage(runs):
    from datetime import datetime

    from broker.bubbles.profiler import profile

    _, marked = runs
    profiles = [
        profile("gpt", s["stage"], "cpu", [tuple(w) for w in s["windows"]], s["iterations"], datetime.now(UTC))
        for s in marked
    ]
    assert [sorted(w.kind for w in p.windows) for p in profiles] == [
        ["fwd-bwd"],
        ["fill-drain", "fwd-bwd"],
        ["fill-drain", "fwd-bwd"],
        ["fill-drain"],
    ]
    for p in profiles:
        assert 0 < p.usable_s() < p.iteration_s and all(w.p10_s <= w.median_s for w in p.windows)
