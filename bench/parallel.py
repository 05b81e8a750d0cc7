"""Validate the memory and iteration-time model (broker/policies/transformer.py) on real DeepSpeed runs.

For each layout (p stages, d data-parallel replicas, micro-batch b; global batch 16) it trains
examples/bubbles/train_gpt.py (GPT-style: 8 blocks, hidden 64, 4 heads, sequence 32, vocabulary 256,
fp32, SGD) under torchrun with gloo on CPU (NCCL on CUDA) and measures, on the most loaded stage,
weights + gradients + optimizer state just before the optimizer step plus the peak of the tensors
autograd keeps for backward, and the median iteration time. The estimate is the model's, without its
safety margin; the time uses per-stage compute profiled here (t_f + t_b of one microbatch, as Pipette
profiles it), scaled by ranks per core when the ranks outnumber the cores, and Pipette's pipeline form.

    python bench/parallel.py --json [--steps 8]
"""

from __future__ import annotations

import argparse
import contextlib
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
MODEL = TransformerSpec(layers=8, hidden=64, heads=4, seq_len=32, vocab=256, global_batch=16, precision="fp32", optimizer="sgd",
                        dropout=False, flash_attention=False, mlp_activation="relu")  # nn.TransformerEncoderLayer's defaults  # fmt: skip
LAYOUTS = [(1, 1, 2), (1, 1, 4), (2, 1, 2), (2, 1, 4), (4, 1, 2), (1, 2, 2), (2, 2, 2), (2, 2, 4)]  # (p, d, b)


def profile_compute(micro_batch: int, repeats: int = 30) -> dict[str, float]:
    """Seconds of forward + backward of one microbatch through one block, the embedding, and the head + loss."""
    sys.path.insert(0, str(SCRIPT.parent))
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs to stdout on import
        import train_gpt

    torch.set_num_threads(1)
    ids = torch.randint(0, MODEL.vocab, (micro_batch, MODEL.seq_len))
    embed, block, head = train_gpt.Embed(), train_gpt.Block(), train_gpt.Head()

    def timed(fn) -> float:
        fn()
        began = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - began) / repeats

    x = torch.randn(micro_batch, MODEL.seq_len, MODEL.hidden, requires_grad=True)
    return {
        "embed": timed(lambda: embed(ids).sum().backward()),
        "block": timed(lambda: block(x).sum().backward()),
        "head": timed(lambda: train_gpt.loss_fn(head(x), ids).backward()),
    }


def run(p: int, d: int, b: int, steps: int, out: Path) -> list[dict]:
    m = MODEL.global_batch // (b * d)
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nproc_per_node", str(p * d), str(SCRIPT), "--stages", str(p), "--micro-batches", str(m),
               "--micro-batch", str(b), "--steps", str(steps), "--out", str(out), "--measure-memory"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GPT_LAYERS": str(MODEL.layers), "GPT_HIDDEN": str(MODEL.hidden),
           "GPT_HEADS": str(MODEL.heads), "GPT_SEQ": str(MODEL.seq_len), "GPT_VOCAB": str(MODEL.vocab)}  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(p * d)]


def row(p: int, d: int, b: int, steps: int, work: Path) -> dict:
    layout = Layout(p, 1, d, b)
    ranks = run(p, d, b, steps, work / f"p{p}d{d}b{b}")
    measured = {}
    for rank in ranks:  # replicas of a stage measure the same; keep the largest
        measured[rank["stage"]] = max(measured.get(rank["stage"], 0), rank["state_bytes"] + rank["activation_peak_bytes"])
    estimated = [e / MARGIN for e in stage_memory_bytes(MODEL, layout)]
    worst = max(range(p), key=lambda s: estimated[s])
    times = profile_compute(b)
    layers = stage_layers(MODEL, p)
    compute = [n * times["block"] for n in layers]
    compute[0] += times["embed"]
    compute[-1] += times["head"]
    contention = max(1.0, p * d / (os.cpu_count() or 1))
    hw = Hardware(flops=1.0, intra_bytes_s=1e9, inter_bytes_s=1e9, devices_per_node=p * d)
    est_iter = iteration_seconds(MODEL, layout, hw, [c * contention for c in compute])
    iterations = [end - start for start, end in ranks[0]["iterations"]][2:]
    meas_iter = statistics.median(iterations)
    return {
        "layout": str(layout), "micro_batch": b, "stage": worst,
        "est_mem_mb": round(estimated[worst] / 2**20, 3), "meas_mem_mb": round(measured[worst] / 2**20, 3),
        "mem_err_pct": round(100 * (estimated[worst] - measured[worst]) / measured[worst], 1),
        "est_iter_s": round(est_iter, 4), "meas_iter_s": round(meas_iter, 4),
        "time_err_pct": round(100 * (est_iter - meas_iter) / meas_iter, 1),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    device = f"cuda ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else f"cpu ({os.cpu_count()} cores, gloo)"
    with tempfile.TemporaryDirectory(prefix="broker-parallel-") as tmp:
        rows = []
        for p, d, b in LAYOUTS:
            rows.append(row(p, d, b, args.steps, Path(tmp)))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    body = {"device": device, "model": MODEL.model_dump(), "rows": rows,
            "mem_err_abs_mean_pct": round(statistics.mean(abs(r["mem_err_pct"]) for r in rows), 1),
            "time_err_abs_mean_pct": round(statistics.mean(abs(r["time_err_pct"]) for r in rows), 1)}  # fmt: skip
    print(json.dumps(body, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
