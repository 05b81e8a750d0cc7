"""Bubble filling on a real DeepSpeed pipeline: how much of the bubbles a fill job uses, whether it ever
runs past a window, and what it costs the main job.

Runs examples/bubbles/train_gpt.py (4 stages, 4 microbatches) under torchrun twice: instrumented
without fill, then with the fill_mlp task in every stage's bubbles (windows sized from the first
iterations' p10, minus 10%). Prints one JSON object: per stage the measured bubble fraction vs
(p-1)/(m+p-1), the share of bubble time spent in fill steps and the fill steps' overrun past the
real end of their window (the awaited message's arrival), and the main job's iteration time with
and without fill. CPU with gloo by default.

With --device cuda (a machine with one GPU) each stage runs alone on the GPU instead
(bench/stage_replay.py): its real forward and backward, its receives replaced by waits as long as
the schedule model says the other stages take, fill work from a second process in the marked
waits; it adds per stage the slowdown and whether the losses stayed identical, the overhead of
the bubble marks alone (`marks_overhead_pct`) and each stage's microbatch time. `--one-stage`
runs the same replay on CPU. `--live` fills the replayed stages through the live broker instead
(bench/live_fill.py: redis-server, `broker server`, `broker submit`, the stage's FillAgent) and adds
each fill job's outcome; give it more steps, since the agent first times the job's configurations.

    python bench/bubbles.py --steps 12 --json
    PYTHONPATH=. python bench/bubbles.py --device cuda --steps 24 --json
    PYTHONPATH=. python bench/bubbles.py --device cuda --live --steps 24 --fill-steps 90 --json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "bubbles" / "train_gpt.py"
STAGES, MICRO_BATCHES, PROFILE_STEPS = 4, 4, 2


def train(out: Path, steps: int, *flags: str) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{SCRIPT.parent}:{os.environ.get('PYTHONPATH', '')}"}
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [
        str(torchrun),
        "--nproc_per_node",
        str(STAGES),
        str(SCRIPT),
        "--steps",
        str(steps),
        "--out",
        str(out),
        "--stages",
        str(STAGES),
        "--micro-batches",
        str(MICRO_BATCHES),
        "--profile-steps",
        str(PROFILE_STEPS),
        *flags,
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode:
        sys.exit(f"torchrun failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return sorted((json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(STAGES)), key=lambda r: r["stage"])


def steady(run: dict) -> list[tuple[float, float]]:
    return run["iterations"][PROFILE_STEPS:]


def stage_figures(plain: dict, filled: dict) -> dict:
    iterations = steady(plain)
    first = iterations[0][0]
    idle = sum(end - start for _, start, end, _ in plain["windows"] if start >= first)
    busy = sum(end - start for start, end in iterations)
    start_fill = steady(filled)[0][0]
    windows = [(start, end) for _, start, end, _ in filled["windows"] if start >= start_fill]
    steps = filled["fill"]["steps"] if filled["fill"] else []
    overruns = []
    for began, ended, _ in steps:
        window = next(((s, e) for s, e in reversed(windows) if s <= began), None)
        overruns.append(max(0.0, ended - window[1]) * 1000 if window else (ended - began) * 1000)
    figures = {
        "stage": plain["stage"],
        "bubble_fraction": round(idle / busy, 4),
        "formula_fraction": round((STAGES - 1) / (MICRO_BATCHES + STAGES - 1), 4),
        "fill_share": fill_share(windows, steps, start_fill),
        "fill_steps": len(steps),
        "overrun_p50_ms": round(float(np.percentile(overruns, 50)), 2) if overruns else 0.0,
        "overrun_p99_ms": round(float(np.percentile(overruns, 99)), 2) if overruns else 0.0,
    }
    chosen_at = (filled["fill"] or {}).get("chosen_at")
    if chosen_at:  # the live agent timed the job's configurations first: the share once it runs on in its choice
        figures["choosing_s"] = round(chosen_at - start_fill, 1)
        figures["fill_share_after_choosing"] = fill_share(windows, steps, chosen_at)
    return figures


def fill_share(windows: list[tuple[float, float]], steps: list[tuple], since: float) -> float:
    """The share of the windows from `since` on that fill steps ran in."""
    bubble_s = sum(end - start for start, end in windows if start >= since)
    filled_s = sum(ended - began for began, ended, _ in steps if began >= since)
    return round(filled_s / bubble_s, 4) if bubble_s else 0.0


def median_iteration(run: dict) -> float:
    return float(np.median([end - start for start, end in steady(run)]))


# --device cuda: a model whose microbatch takes >= 20 ms a stage on an H100, and a fill step of a few ms
CUDA_SHAPE = {"GPT_HIDDEN": "2048", "GPT_SEQ": "1024", "GPT_HEADS": "16", "GPT_LAYERS": "10", "GPT_VOCAB": "8192"}
CUDA_FILL = {"device": "cuda", "width": 2048, "depth": 2, "batch": 4096}


def pipeline(steps: int) -> tuple[list[dict], list[dict], str]:
    """The real 4-rank DeepSpeed pipeline, instrumented without fill and then with fill."""
    with tempfile.TemporaryDirectory() as tmp:
        plain = train(Path(tmp) / "plain", steps, "--instrument")
        filled = train(Path(tmp) / "filled", steps, "--fill", "fill_mlp:MlpFill")
    return plain, filled, f"cpu ({os.cpu_count()} cores, {STAGES} ranks, gloo)"


def one_stage_at_a_time(
    steps: int, device: str, live=None, fill_steps: int | None = None, only: list[int] | None = None
) -> tuple[list[dict], list[dict], list[dict], str]:
    """Each stage alone on the device (bench/stage_replay.py), fill from a second process (the broker's agent's,
    given a live_fill.LiveBroker)."""
    if device == "cuda":
        os.environ.update(CUDA_SHAPE, CUBLAS_WORKSPACE_CONFIG=":4096:8")  # cuBLAS's deterministic workspace
        torch.use_deterministic_algorithms(True)  # else attention's backward may add in another order each run
    from stage_replay import stage_runs

    bare, plain, filled = stage_runs(
        STAGES,
        MICRO_BATCHES,
        4 if device == "cuda" else 2,
        steps,
        PROFILE_STEPS,
        device,
        CUDA_FILL if device == "cuda" else {},
        live,
        fill_steps,
        only,
    )
    name = torch.cuda.get_device_name(0) if device == "cuda" else f"cpu ({os.cpu_count()} cores)"
    sharing = "MPS" if os.environ.get("CUDA_MPS_PIPE_DIRECTORY") else "time-sliced contexts"
    served = " served by the live broker" if live else ""
    return bare, plain, filled, f"{name}, one stage at a time, fill in a second process{served} ({sharing})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu: the 4-rank DeepSpeed pipeline under torchrun; cuda: one stage at a time on the one GPU",
    )
    parser.add_argument("--one-stage", action="store_true", help="on CPU too, replay one stage at a time")
    parser.add_argument(
        "--live", action="store_true", help="one stage at a time, filled through the live broker (no bare runs)"
    )
    parser.add_argument("--fill-steps", type=int, help="one stage at a time: the filled runs' steps (default --steps)")
    parser.add_argument("--stage", type=int, action="append", help="one stage at a time: only this stage (repeatable)")
    args = parser.parse_args()
    bare, one_stage = None, args.live or args.device == "cuda" or args.one_stage
    if args.live:
        from live_fill import LiveBroker

        live = LiveBroker()
        try:
            bare, plain, filled, device = one_stage_at_a_time(
                args.steps, args.device, live, args.fill_steps, args.stage
            )
        finally:
            live.close()
    elif one_stage:
        bare, plain, filled, device = one_stage_at_a_time(args.steps, args.device, None, args.fill_steps, args.stage)
    else:
        plain, filled, device = pipeline(args.steps)
    stages = [stage_figures(a, b) for a, b in zip(plain, filled)]
    for figures, a, b in zip(stages, plain, filled):
        figures["slowdown_pct"] = round(100 * (median_iteration(b) / median_iteration(a) - 1), 2)
        common = min(len(a["losses"]), len(b["losses"]))  # the iterations both ran
        same = a["losses"][:common] == b["losses"][:common]
        figures["losses_identical"] = same and bool(np.isfinite(a["losses"]).all())
        if b["fill"] and "job" in b["fill"]:  # served by the live broker
            keys = (
                "job",
                "state",
                "runs",
                "dispatched_s",
                "started_s",
                "micro_steps",
                "probing",
                "kills",
                "missed_windows",
            )
            figures["fill_job"] = {k: b["fill"][k] for k in keys}
    worst = max(range(len(stages)), key=lambda s: stages[s]["slowdown_pct"]) if one_stage else 0
    without, with_fill = median_iteration(plain[worst]), median_iteration(filled[worst])
    result = {
        "stages": stages,
        "iteration_s_without_fill": round(without, 4),
        "iteration_s_with_fill": round(with_fill, 4),
        "slowdown_pct": stages[worst]["slowdown_pct"],
        "device": device,
        "steps": args.steps,
        "fill_steps": args.fill_steps or args.steps,
        "losses_identical": all(figures["losses_identical"] for figures in stages),
    }
    if bare:  # if runs without fill differ too, the arithmetic is not repeatable, whatever the fill does
        result["losses_identical_without_fill"] = all(a["losses"] == b["losses"] for a, b in zip(bare, plain))
    if bare:
        result["marks_overhead_pct"] = round(
            100 * max(median_iteration(a) / median_iteration(b) - 1 for a, b in zip(plain, bare)), 2
        )
    if one_stage:
        result["microbatch_ms"] = [round(1000 * (run["t_f"] + run["t_b"]), 1) for run in plain]
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
