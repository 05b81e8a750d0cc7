"""What choosing a fill job's micro-step configuration in its windows is worth (PipeFill's Algorithm 1, live).

The fill job is examples/bubbles/fill_mlp.py with `extra_row_s` making a step of 16 rows take about 40 ms as
submitted. For each window length, the same FillExecutor gets the same windows (one every window length plus
20 ms, signalled from here as an engine would) twice: as submitted, and with the fill agent's
ConfigurationProbe (each split timed in the windows, the best kept). Prints one JSON object: per window length
the configuration chosen and how long choosing took (windows, seconds with the trials' process starts), whole
steps done per 100 windows after the choice (and as submitted), the share of window time spent in steps, and
the p99 overrun past a window's end.

    python bench/fill_configurations.py --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples" / "bubbles")]  # the spawned child imports fill_mlp by name

from broker.bubbles.executor import FillExecutor  # noqa: E402
from broker.bubbles.probe import NEXT, TIMING, ConfigurationProbe  # noqa: E402

GAP_S = 0.02  # the main job's compute between windows
FREE_BYTES = 4 * 10**9
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


def measure(window_s: float, config: dict, count: int) -> dict:
    submitted = FillExecutor("fill_mlp:MlpFill", {**config, "step_s": 0.0})
    submitted.start()
    try:
        as_submitted = run_windows(submitted, window_s, count)
    finally:
        submitted.stop()
    executor = FillExecutor("fill_mlp:MlpFill", {**config, "step_s": 0.0})
    executor.start()
    try:
        probe, outcome, timing = ConfigurationProbe(executor.configurations, executor.micro_steps), TIMING, 0
        began = time.monotonic()
        while outcome in (TIMING, NEXT):
            report = executor.window(window_s * MARGIN)
            time.sleep(window_s * (1 - MARGIN) + GAP_S)
            outcome = probe.after_window(executor, report, [(window_s * MARGIN, FREE_BYTES)], window_s + GAP_S)
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
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows-ms", type=float, nargs="+", default=[15.0, 30.0, 60.0])
    parser.add_argument("--count", type=int, default=100, help="windows measured in each configuration")
    parser.add_argument("--row-s", type=float, default=0.0025, help="extra seconds per row of a micro-batch")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    config = {"extra_row_s": str(args.row_s)}
    rows = [measure(ms / 1000, config, args.count) for ms in args.windows_ms]
    out = {"step_as_submitted_ms": 16 * args.row_s * 1000, "windows": rows}
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
