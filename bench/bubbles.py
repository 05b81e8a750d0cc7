"""Bubble filling on a real DeepSpeed pipeline: how much of the bubbles a fill job uses, whether it ever
runs past a window, and what it costs the main job.

Runs examples/bubbles/train_gpt.py (4 stages, 4 microbatches) under torchrun twice: instrumented
without fill, then with the fill_mlp task in every stage's bubbles (windows sized from the first
iterations' p10, minus 10%). Prints one JSON object: per stage the measured bubble fraction vs
(p-1)/(m+p-1), the share of bubble time spent in fill steps and the fill steps' overrun past the
real end of their window (the awaited message's arrival), and the main job's iteration time with
and without fill. CPU with gloo by default; on a GPU machine the ranks use NCCL and the GPUs.

    python bench/bubbles.py --steps 12 --json
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
    overruns, filled_s = [], 0.0
    for began, ended, _ in steps:
        window = next(((s, e) for s, e in reversed(windows) if s <= began), None)
        overruns.append(max(0.0, ended - window[1]) * 1000 if window else (ended - began) * 1000)
        filled_s += ended - began
    bubble_s = sum(end - start for start, end in windows)
    return {
        "stage": plain["stage"],
        "bubble_fraction": round(idle / busy, 4),
        "formula_fraction": round((STAGES - 1) / (MICRO_BATCHES + STAGES - 1), 4),
        "fill_share": round(filled_s / bubble_s, 4) if bubble_s else 0.0,
        "fill_steps": len(steps),
        "overrun_p50_ms": round(float(np.percentile(overruns, 50)), 2) if overruns else 0.0,
        "overrun_p99_ms": round(float(np.percentile(overruns, 99)), 2) if overruns else 0.0,
    }


def median_iteration(runs: list[dict]) -> float:
    return float(np.median([end - start for start, end in steady(runs[0])]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plain = train(Path(tmp) / "plain", args.steps, "--instrument")
        filled = train(Path(tmp) / "filled", args.steps, "--fill", "fill_mlp:MlpFill")
    without, with_fill = median_iteration(plain), median_iteration(filled)
    device = (
        torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else f"cpu ({os.cpu_count()} cores, {STAGES} ranks, gloo)"
    )
    result = {
        "stages": [stage_figures(a, b) for a, b in zip(plain, filled)],
        "iteration_s_without_fill": round(without, 4),
        "iteration_s_with_fill": round(with_fill, 4),
        "slowdown_pct": round(100 * (with_fill / without - 1), 2),
        "device": device,
        "steps": args.steps,
        "losses_identical": plain[0]["losses"] == filled[0]["losses"],
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
