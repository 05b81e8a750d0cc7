"""Validate the memory and iteration-time model (broker/policies/transformer.py) on real DeepSpeed runs.

For each layout (p stages, d data-parallel replicas, micro-batch b; global batch 16) it trains
examples/bubbles/train_gpt.py under torchrun and measures, on the most loaded stage, the peak memory
and the median iteration time. On CPU (gloo) the model is small (8 blocks, hidden 64, 4 heads,
sequence 32, vocabulary 256) and memory is weights + gradients + optimizer state just before the
optimizer step plus the peak of the tensors autograd keeps for backward. On CUDA the model is larger
(8 blocks, hidden 1024, 16 heads, sequence 512, vocabulary 8192) and memory is
`torch.cuda.max_memory_allocated`; ranks that outnumber the GPUs share them over gloo. Both fp32, SGD.
Memory is compared with the estimate with its safety margin on CUDA (whose peak includes workspace)
and without it on CPU. The time is the model's: DeepSpeed's lock-step 1F1B timeline over per-stage
forward and backward times profiled on the device (as Pipette profiles them: rank 0 times one block,
the embedding and the head alone, in the training process just before the timed steps and after
them, as this machine's speed drifts), plus the engine's own cost per microbatch (DeepSpeed on one
rank with only the embedding and head; on CUDA it overlaps the compute), the cost of one pipeline
message (DeepSpeed's send, timed on two stages with only the embedding and head) and, with d > 1, a
ring all-reduce at the bandwidth an all-reduce probe measured; compute is scaled by ranks per core
(CPU) or per GPU when ranks share them. Iterations are timed after the first three, which run with
the memory hooks.

    python bench/parallel.py --json [--steps 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from broker.domain.model import TransformerSpec
from broker.models.transformer import (
    MARGIN,
    Hardware,
    Layout,
    exchange_seconds,
    iteration_seconds,
    stage_layers,
    stage_memory_bytes,
    stage_params,
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "bubbles" / "train_gpt.py"
CUDA = torch.cuda.is_available()
# nn.TransformerEncoderLayer: ReLU MLP, no dropout here; on CPU attention keeps its s x s scores, on CUDA
# scaled_dot_product_attention's memory-efficient kernel keeps none (as flash attention)
MODEL = TransformerSpec(
    layers=8,
    hidden=1024 if CUDA else 64,
    heads=16 if CUDA else 4,
    seq_len=512 if CUDA else 32,
    vocab=8192 if CUDA else 256,
    global_batch=16,
    precision="fp32",
    optimizer="sgd",
    dropout=False,
    flash_attention=CUDA,
    mlp_activation="relu",
    schedule="deepspeed",
)
SHAPE = {
    "GPT_LAYERS": str(MODEL.layers),
    "GPT_HIDDEN": str(MODEL.hidden),
    "GPT_HEADS": str(MODEL.heads),
    "GPT_SEQ": str(MODEL.seq_len),
    "GPT_VOCAB": str(MODEL.vocab),
}  # train_gpt.py reads its shape from these
LAYOUTS = [(1, 1, 2), (1, 1, 4), (2, 1, 2), (2, 1, 4), (4, 1, 2), (1, 2, 2), (2, 2, 2), (2, 2, 4)]  # (p, d, b)
LAYOUTS += [(1, 1, 1), (1, 1, 8)] if CUDA else []  # one GPU: only single-rank layouts run unshared


def run(
    p: int, d: int, b: int, steps: int, out: Path, layers: int | None = None, extra: tuple[str, ...] = ()
) -> list[dict]:
    m = MODEL.global_batch // (b * d)
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [
        str(torchrun),
        "--nproc_per_node",
        str(p * d),
        str(SCRIPT),
        "--stages",
        str(p),
        "--micro-batches",
        str(m),
        "--micro-batch",
        str(b),
        "--steps",
        str(steps),
        "--out",
        str(out),
        "--measure-memory",
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **SHAPE, **({} if layers is None else {"GPT_LAYERS": str(layers)})}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        output = done.stdout + done.stderr  # the first rank's traceback, not torchrun's summary after it
        raise RuntimeError(output[output.find("Traceback") :][:4000])
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(p * d)]


def timed_iterations(rank: dict) -> float:
    """Median iteration after the memory-measured steps and one more."""
    return statistics.median(end - start for start, end in rank["iterations"][rank["memory_steps"] + 1 :])


def compute_profile(rank: dict) -> dict[str, tuple[float, float]]:
    """Rank 0's profile of the parts (forward, backward), before the timed steps and after them, averaged."""
    profiles = rank["compute_profiles"]
    return {part: tuple(statistics.mean(p[part][i] for p in profiles) for i in (0, 1)) for part in profiles[0]}


@functools.cache
def engine_overhead(b: int, steps: int, work: Path) -> float:
    """Seconds per microbatch the pipeline engine spends besides the layers' compute (its instructions, buffers,
    loss and optimizer step), profiled like the compute: DeepSpeed on one rank with only the embedding and head."""
    ranks = run(1, 1, b, steps, work / f"overhead-b{b}", layers=0, extra=("--profile-compute",))
    times = compute_profile(ranks[0])
    return max(0.0, timed_iterations(ranks[0]) / (MODEL.global_batch // b) - sum(times["embed"]) - sum(times["head"]))


@functools.cache
def message_seconds(b: int, steps: int, work: Path) -> float:
    """What one pipeline message costs both stages (DeepSpeed's send, peer waiting).

    Measured on two stages that hold only the embedding and the head."""
    ranks = run(2, 1, b, steps, work / f"message-b{b}", layers=0, extra=("--time-instructions",))
    return statistics.median(
        ms / 1000 for r in ranks for kind, ms in r["instruction_ms"].items() if kind in ("SendActivation", "SendGrad")
    )


@functools.cache
def allreduce_bytes_s(d: int, nbytes: int, work: Path) -> float:
    """The data-parallel link's bandwidth as a ring all-reduce of `nbytes` over d ranks sees it."""
    ranks = run(
        1, d, MODEL.global_batch // d, 2, work / f"allreduce-d{d}", layers=0, extra=("--probe-allreduce", str(nbytes))
    )
    return 2 * (d - 1) / d * nbytes / statistics.median(r["allreduce_s"] for r in ranks)


def inplace_stage_seconds(ranks: list[dict], p: int) -> tuple[list[float], list[float]]:
    """(t_f, t_b) per stage as the engine's own instructions took them in the run (median; slowest replica):
    the compute as it ran there, to check the rest of the model apart from the compute profile."""
    t_f, t_b = [0.0] * p, [0.0] * p
    for r in ranks:
        ms = r["instruction_ms"]
        t_f[r["stage"]] = max(t_f[r["stage"]], (ms["ForwardPass"] + ms.get("LoadMicroBatch", 0.0)) / 1000)
        t_b[r["stage"]] = max(t_b[r["stage"]], ms["BackwardPass"] / 1000)
    return t_f, t_b


def row(p: int, d: int, b: int, steps: int, work: Path) -> dict:
    layout = Layout(p, 1, d, b)
    ranks = run(p, d, b, steps, work / f"p{p}d{d}b{b}", extra=("--time-instructions", "--profile-compute"))
    times = compute_profile(ranks[0])
    measured = {}
    for rank in ranks:  # replicas of a stage measure the same; keep the largest
        peak = rank["cuda_peak_bytes"] if CUDA else rank["state_bytes"] + rank["activation_peak_bytes"]
        measured[rank["stage"]] = max(measured.get(rank["stage"], 0), peak)
    # CUDA's peak includes the workspace and transient buffers the margin stands for; the CPU measure
    # (tensors kept for backward) does not, so there the estimate is compared without it
    estimated = [e if CUDA else e / MARGIN for e in stage_memory_bytes(MODEL, layout)]
    worst = max(range(p), key=lambda s: estimated[s])
    overhead = engine_overhead(b, steps, work)  # on CPU it adds to the compute; a GPU computes while the host issues
    units = torch.cuda.device_count() if CUDA else os.cpu_count() or 1
    contention = max(1.0, p * d / units)  # ranks time-share the cores, or the GPU they share
    stages = []
    for n in stage_layers(MODEL, p):
        stages.append([n * part for part in times["block"]])
    stages[0] = [x + y for x, y in zip(stages[0], times["embed"])]
    stages[-1] = [x + y for x, y in zip(stages[-1], times["head"])]
    stages = [[contention * (max(c, overhead / 2) if CUDA else c + overhead / 2) for c in stage] for stage in stages]
    bandwidth = allreduce_bytes_s(d, max(stage_params(MODEL, p)) * 4, work) if d > 1 else 1e9
    message = message_seconds(b, steps, work) if p > 1 else 0.0
    hw = Hardware(flops=1.0, intra_bytes_s=bandwidth, inter_bytes_s=bandwidth, devices_per_node=p * d)
    hw = replace(
        hw, latency_s=max(0.0, message - exchange_seconds(MODEL, layout, hw))
    )  # the bytes are priced by the bandwidth
    t_f, t_b = zip(*stages)
    est_iter = iteration_seconds(MODEL, layout, hw, (list(t_f), list(t_b)))
    meas_iter = timed_iterations(ranks[0])
    inplace = inplace_stage_seconds(ranks, p)
    est_inplace = iteration_seconds(MODEL, layout, hw, inplace) + max(
        r["instruction_ms"]["OptimizerStep"] / 1000 for r in ranks
    )
    return {
        "layout": str(layout),
        "micro_batch": b,
        "stage": worst,
        "est_mem_mb": round(estimated[worst] / 2**20, 3),
        "meas_mem_mb": round(measured[worst] / 2**20, 3),
        "est_mem_no_margin_mb": round(stage_memory_bytes(MODEL, layout)[worst] / MARGIN / 2**20, 3),
        "mem_err_pct": round(100 * (estimated[worst] - measured[worst]) / measured[worst], 1),
        "est_iter_s": round(est_iter, 4),
        "meas_iter_s": round(meas_iter, 4),
        "time_err_pct": round(100 * (est_iter - meas_iter) / meas_iter, 1),
        "ranks_per_unit": round(contention, 2),
        "compute_inplace_ratio": round(sum(map(sum, inplace)) / (sum(t_f) + sum(t_b)), 2),
        "est_iter_inplace_s": round(est_inplace, 4),
        "time_err_inplace_pct": round(100 * (est_inplace - meas_iter) / meas_iter, 1),
        "overhead_ms": round(overhead * 1000, 2),
        "message_ms": round(message * 1000, 3),
        "allreduce_gb_s": round(bandwidth / 1e9, 3) if d > 1 else None,
        "meas_saved_mb": round(
            max(r["state_bytes"] + r["activation_peak_bytes"] for r in ranks if r["stage"] == worst) / 2**20, 3
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs per layout; the row with the median time error is kept"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    device = (
        f"cuda ({torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} GPU)"
        if CUDA
        else f"cpu ({os.cpu_count()} cores, gloo)"
    )
    with tempfile.TemporaryDirectory(prefix="broker-parallel-") as tmp:
        rows = []
        for p, d, b in LAYOUTS:
            runs = []
            for _ in range(args.repeats):
                runs.append(row(p, d, b, args.steps, Path(tmp)))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
            runs.sort(key=lambda r: r["time_err_pct"])
            rows.append({**runs[len(runs) // 2], "time_err_pct_runs": [r["time_err_pct"] for r in runs]})
    unshared = [r for r in rows if r["ranks_per_unit"] <= 1]  # each rank on its own core or GPU, as the model assumes

    def mean_abs(field: str, of: list[dict]) -> float | None:
        return round(statistics.mean(abs(r[field]) for r in of), 1) if of else None

    body = {
        "device": device,
        "model": MODEL.model_dump(),
        "repeats": args.repeats,
        "rows": rows,
        "mem_err_abs_mean_pct": mean_abs("mem_err_pct", rows),
        "time_err_abs_mean_pct": mean_abs("time_err_pct", rows),
        "time_err_abs_mean_pct_unshared": mean_abs("time_err_pct", unshared),
        "time_err_inplace_abs_mean_pct": mean_abs("time_err_inplace_pct", rows),
        "time_err_inplace_abs_mean_pct_unshared": mean_abs("time_err_inplace_pct", unshared),
    }
    print(json.dumps(body, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
