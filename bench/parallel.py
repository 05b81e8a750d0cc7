"""Validate the memory and iteration-time model (broker/policies/transformer.py) on real DeepSpeed runs.

For each layout (p stages, d data-parallel replicas, micro-batch b; global batch 16) it trains
examples/bubbles/train_gpt.py under torchrun and measures, on the most loaded stage, the peak memory
and the median iteration time. On CPU (gloo) the model is small (8 blocks, hidden 64, 4 heads,
sequence 32, vocabulary 256) and memory is weights + gradients + optimizer state just before the
optimizer step plus the peak of the tensors autograd keeps for backward. On CUDA the model is larger
(8 blocks, hidden 1024, 16 heads, sequence 512, vocabulary 8192) and memory is
`torch.cuda.max_memory_allocated`; ranks that outnumber the GPUs share them over gloo. Both fp32, SGD.
Memory is compared with the estimate with its safety margin on CUDA (whose peak includes workspace)
and without it on CPU. The time uses per-stage compute profiled on the device (t_f + t_b of one
microbatch, as Pipette profiles it) plus the engine's own cost per microbatch (DeepSpeed on one rank
with only the embedding and head; on CUDA it overlaps the compute), scaled by ranks per core (CPU)
or per GPU when ranks share them, in Pipette's pipeline form. Iterations are timed after the first
three, which run with the memory hooks.

    python bench/parallel.py --json [--steps 10]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from broker.model import TransformerSpec
from broker.policies.transformer import MARGIN, Hardware, Layout, iteration_seconds, stage_layers, stage_memory_bytes

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "bubbles" / "train_gpt.py"
CUDA = torch.cuda.is_available()
# nn.TransformerEncoderLayer: ReLU MLP, no dropout here; on CPU attention keeps its s x s scores, on CUDA
# scaled_dot_product_attention's memory-efficient kernel keeps none (as flash attention)
MODEL = TransformerSpec(layers=8, hidden=1024 if CUDA else 64, heads=16 if CUDA else 4, seq_len=512 if CUDA else 32,
                        vocab=8192 if CUDA else 256, global_batch=16, precision="fp32", optimizer="sgd",
                        dropout=False, flash_attention=CUDA, mlp_activation="relu")  # fmt: skip
SHAPE = {"GPT_LAYERS": str(MODEL.layers), "GPT_HIDDEN": str(MODEL.hidden), "GPT_HEADS": str(MODEL.heads),
         "GPT_SEQ": str(MODEL.seq_len), "GPT_VOCAB": str(MODEL.vocab)}  # train_gpt.py reads its shape from these  # fmt: skip
LAYOUTS = [(1, 1, 2), (1, 1, 4), (2, 1, 2), (2, 1, 4), (4, 1, 2), (1, 2, 2), (2, 2, 2), (2, 2, 4)]  # (p, d, b)
LAYOUTS += [(1, 1, 1), (1, 1, 8)] if CUDA else []  # one GPU: only single-rank layouts run unshared


def profile_compute(micro_batch: int, repeats: int = 30) -> dict[str, float]:
    """Seconds of forward + backward of one microbatch through one block, the embedding, and the head + loss."""
    sys.path.insert(0, str(SCRIPT.parent))
    os.environ.update(SHAPE)
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs to stdout on import
        import train_gpt

    torch.set_num_threads(1)
    device = "cuda" if CUDA else "cpu"
    ids = torch.randint(0, MODEL.vocab, (micro_batch, MODEL.seq_len), device=device)
    embed, block, head = train_gpt.Embed().to(device), train_gpt.Block().to(device), train_gpt.Head().to(device)

    def timed(fn) -> float:
        """Median of single runs after warm-up (the first CUDA runs autotune and the clocks ramp up)."""
        seconds = []
        for attempt in range(repeats + 5):
            began = time.perf_counter()
            fn()
            torch.cuda.synchronize() if CUDA else None
            seconds.append(time.perf_counter() - began) if attempt >= 5 else None
        return statistics.median(seconds)

    x = torch.randn(micro_batch, MODEL.seq_len, MODEL.hidden, requires_grad=True, device=device)
    return {
        "embed": timed(lambda: embed(ids).sum().backward()),
        "block": timed(lambda: block(x).sum().backward()),
        "head": timed(lambda: train_gpt.loss_fn(head(x), ids).backward()),
    }


def run(p: int, d: int, b: int, steps: int, out: Path, layers: int | None = None) -> list[dict]:
    m = MODEL.global_batch // (b * d)
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nproc_per_node", str(p * d), str(SCRIPT), "--stages", str(p), "--micro-batches", str(m),
               "--micro-batch", str(b), "--steps", str(steps), "--out", str(out), "--measure-memory"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", **SHAPE, **({} if layers is None else {"GPT_LAYERS": str(layers)})}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        output = done.stdout + done.stderr  # the first rank's traceback, not torchrun's summary after it
        raise RuntimeError(output[output.find("Traceback"):][:4000])
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(p * d)]


@functools.cache
def engine_overhead(b: int, steps: int, work: Path) -> float:
    """Seconds per microbatch the pipeline engine spends besides the layers' compute (its instructions, buffers,
    loss and optimizer step), profiled like the compute: DeepSpeed on one rank with only the embedding and head."""
    ranks = run(1, 1, b, steps, work / f"overhead-b{b}", layers=0)
    per_microbatch = statistics.median(end - start for start, end in ranks[0]["iterations"][4:]) / (MODEL.global_batch // b)
    times = profile_compute(b)
    return max(0.0, per_microbatch - times["embed"] - times["head"])


def row(p: int, d: int, b: int, steps: int, work: Path) -> dict:
    layout = Layout(p, 1, d, b)
    ranks = run(p, d, b, steps, work / f"p{p}d{d}b{b}")
    measured = {}
    for rank in ranks:  # replicas of a stage measure the same; keep the largest
        peak = rank["cuda_peak_bytes"] if CUDA else rank["state_bytes"] + rank["activation_peak_bytes"]
        measured[rank["stage"]] = max(measured.get(rank["stage"], 0), peak)
    # CUDA's peak includes the workspace and transient buffers the margin stands for; the CPU measure
    # (tensors kept for backward) does not, so there the estimate is compared without it
    estimated = [e if CUDA else e / MARGIN for e in stage_memory_bytes(MODEL, layout)]
    worst = max(range(p), key=lambda s: estimated[s])
    times = profile_compute(b)
    layers = stage_layers(MODEL, p)
    compute = [n * times["block"] for n in layers]
    compute[0] += times["embed"]
    compute[-1] += times["head"]
    overhead = engine_overhead(b, steps, work)  # on CPU it adds to the compute; a GPU computes while the host issues
    compute = [max(c, overhead) if CUDA else c + overhead for c in compute]
    units = torch.cuda.device_count() if CUDA else os.cpu_count() or 1
    contention = max(1.0, p * d / units)  # ranks time-share the cores, or the GPU they share
    hw = Hardware(flops=1.0, intra_bytes_s=1e9, inter_bytes_s=1e9, devices_per_node=p * d)
    est_iter = iteration_seconds(MODEL, layout, hw, [c * contention for c in compute])
    iterations = [end - start for start, end in ranks[0]["iterations"]][4:]  # after the memory-measured steps and one more
    meas_iter = statistics.median(iterations)
    return {
        "layout": str(layout), "micro_batch": b, "stage": worst,
        "est_mem_mb": round(estimated[worst] / 2**20, 3), "meas_mem_mb": round(measured[worst] / 2**20, 3),
        "est_mem_no_margin_mb": round(stage_memory_bytes(MODEL, layout)[worst] / MARGIN / 2**20, 3),
        "mem_err_pct": round(100 * (estimated[worst] - measured[worst]) / measured[worst], 1),
        "est_iter_s": round(est_iter, 4), "meas_iter_s": round(meas_iter, 4),
        "time_err_pct": round(100 * (est_iter - meas_iter) / meas_iter, 1), "ranks_per_unit": round(contention, 2),
        "overhead_ms": round(overhead * 1000, 2),
        "meas_saved_mb": round(max(r["state_bytes"] + r["activation_peak_bytes"] for r in ranks if r["stage"] == worst) / 2**20, 3),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    device = f"cuda ({torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} GPU)" if CUDA else f"cpu ({os.cpu_count()} cores, gloo)"
    with tempfile.TemporaryDirectory(prefix="broker-parallel-") as tmp:
        rows = []
        for p, d, b in LAYOUTS:
            rows.append(row(p, d, b, args.steps, Path(tmp)))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    unshared = [abs(r["time_err_pct"]) for r in rows if r["ranks_per_unit"] <= 1]  # each rank on its own core or GPU, as the model assumes
    body = {"device": device, "model": MODEL.model_dump(), "rows": rows,
            "mem_err_abs_mean_pct": round(statistics.mean(abs(r["mem_err_pct"]) for r in rows), 1),
            "time_err_abs_mean_pct": round(statistics.mean(abs(r["time_err_pct"]) for r in rows), 1),
            "time_err_abs_mean_pct_unshared": round(statistics.mean(unshared), 1) if unshared else None}  # fmt: skip
    print(json.dumps(body, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
