"""What choosing a fill job's micro-step configuration in its windows is worth (PipeFill's Algorithm 1, live).

The fill job is examples/bubbles/fill_mlp.py with `extra_row_s` making a step of 16 rows take about 40 ms as
submitted. For each window length, the same FillExecutor gets the same windows (one every window length plus
20 ms, signalled from here as an engine would) twice: as submitted, and with the fill agent's
ConfigurationProbe (each split timed in the windows, the best kept). Prints one JSON object: per window length
the configuration chosen and how long choosing took (windows, seconds with the trials' process starts), whole
steps done per 100 windows after the choice (and as submitted), the share of window time spent in steps, and
the p99 overrun past a window's end, and each trial's median micro-step and peak memory.

With --device cuda the step is the GPU's own work (an MLP of --width and --depth on --batch rows, no sleep), and
the child's allocator is capped at the windows' free memory (--free-gb) as the fill agent caps it.

    python bench/fill_configurations.py --json
    PYTHONPATH=. python bench/fill_configurations.py --device cuda --width 4096 --depth 5 --batch 4096 --json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples" / "bubbles")]  # the spawned child imports fill_mlp by name

from broker.bubbles.executor import FillExecutor  # noqa: E402
from broker.bubbles.probe import NEXT, TIMING, ConfigurationProbe  # noqa: E402

GAP_S = 0.02  # the main job's compute between windows
MARGIN = 0.9  # the fill agent uses 90% of a window


def run_windows(executor: FillExecutor, window_s: float, count: int) -> dict:
    """`count` windows; whole steps kept, the share of window time in steps, the p99 overrun."""
    before, first = executor.take_state()["step"], len(executor.steps)
    for _ in range(count):
        executor.window(window_s * MARGIN)
        time.sleep(window_s * (1 - MARGIN) + GAP_S)
    steps = executor.steps[first:]
    overruns = sorted(max(0.0, (b - end) * 1000) for _, b, end in steps) or [0.0]
    return {
        "steps_per_100_windows": round((executor.take_state()["step"] - before) * 100 / count, 1),
        "fill_share_pct": round(100 * sum(b - a for a, b, _ in steps) / (count * window_s), 1),
        "p99_overrun_ms": round(overruns[int(0.99 * (len(overruns) - 1))], 2),
    }


def measure(window_s: float, config: dict, count: int, free_bytes: int, cap: float | None) -> dict:
    submitted = FillExecutor("fill_mlp:MlpFill", {**config, "step_s": 0.0})
    submitted.start(cap)
    try:
        as_submitted = run_windows(submitted, window_s, count)
    finally:
        submitted.stop()
    executor = FillExecutor("fill_mlp:MlpFill", {**config, "step_s": 0.0})
    executor.start(cap)
    try:
        probe, outcome, timing = ConfigurationProbe(executor.configurations, executor.micro_steps), TIMING, 0
        began = time.monotonic()
        while outcome in (TIMING, NEXT):
            report = executor.window(window_s * MARGIN)
            time.sleep(window_s * (1 - MARGIN) + GAP_S)
            outcome = probe.after_window(executor, report, [(window_s * MARGIN, free_bytes)], window_s + GAP_S)
            timing += 1
        chosen, timing_s = (probe.chosen.name if probe.chosen else None), time.monotonic() - began
        after = run_windows(executor, window_s, count) if chosen else None
    finally:
        executor.stop()
    return {
        "window_ms": window_s * 1000,
        "chosen": chosen,
        "timing_windows": timing,
        "timing_s": round(timing_s, 1),  # the trials' windows and their processes' starts
        "as_submitted": as_submitted,
        "with_choice": after,
        "trials": [
            {
                "name": t.name,
                "micro_step_ms": round(1000 * sorted(t.step_s)[len(t.step_s) // 2], 2) if t.step_s else None,
                "peak_mb": round(t.peak_bytes / 2**20, 1),
                "kills": t.kills,
            }
            for t in probe.trials
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows-ms", type=float, nargs="+", default=[15.0, 30.0, 60.0])
    parser.add_argument("--count", type=int, default=100, help="windows measured in each configuration")
    parser.add_argument("--row-s", type=float, help="extra seconds per row of a micro-batch (CPU default 0.0025)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--free-gb", type=float, default=4.0, help="free device memory in every window")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    row_s = args.row_s if args.row_s is not None else (0.0025 if args.device == "cpu" else 0.0)
    config = {
        "extra_row_s": str(row_s),
        "device": args.device,
        "width": args.width,
        "depth": args.depth,
        "batch": args.batch,
    }
    free_bytes, cap, device = int(args.free_gb * 10**9), None, f"cpu ({os.cpu_count()} cores)"
    if args.device == "cuda":
        import torch

        device = torch.cuda.get_device_name(0)
        cap = min(1.0, free_bytes / torch.cuda.get_device_properties(0).total_memory)  # as the fill agent caps it
    rows = [measure(ms / 1000, config, args.count, free_bytes, cap) for ms in args.windows_ms]
    out = {"device": device, "config": config, "free_gb": args.free_gb, "windows": rows}
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
