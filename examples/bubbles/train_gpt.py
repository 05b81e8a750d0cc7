"""A small GPT-style model trained with DeepSpeed's pipeline engine, 4 stages, 4 microbatches.

    torchrun --nproc_per_node 4 examples/bubbles/train_gpt.py --steps 3 --out run.json [--instrument]

Runs on CPU with gloo, on CUDA with NCCL when there is a GPU per rank, and with gloo when ranks
share a GPU (a one-GPU machine running a multi-stage layout; see `init_distributed`). With --instrument the
engine marks its bubbles (broker.bubbles.instrument) and each rank writes the windows it saw;
rank 0 writes the losses. Seeds are fixed, so two runs give the same losses bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.pipe import LayerSpec, PipelineModule
from gpt import (  # beside this script: torchrun puts its directory on the path
    HIDDEN,
    LAYERS,
    SEQ,
    VOCAB,
    Block,
    Embed,
    Head,
    batches,
    layers,
    loss_fn,
)
from stage_fill import Filler
from torch import nn

MEMORY_STEPS = 3  # iterations measured with saved-tensor hooks (Python per saved tensor: too slow to time)


class SavedActivations:
    """Peak bytes of the tensors autograd keeps for backward (each storage counted once, freed when
    the graph lets go of it): the activation memory of a stage, measured on CPU as well as on GPU."""

    def __init__(self):
        import weakref

        self.live, self.peak, self.count = 0, 0, {}
        self._finalize = weakref.finalize

    def pack(self, tensor):
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self.count:
            self.count[key] = 0
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
            self._finalize(storage, self._free, key, storage.nbytes())
        self.count[key] += 1
        return tensor

    def _free(self, key, nbytes):
        self.count.pop(key, None)
        self.live -= nbytes

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda tensor: tensor)


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def measure_states(engine, optimizer, into: dict) -> None:
    """Record weights + gradients + optimizer state as they stand just before each optimizer step (their peak)."""
    from deepspeed.runtime.pipe import schedule

    step = type(engine)._INSTRUCTION_MAP[schedule.OptimizerStep]

    def measured(self, *args, **kwargs):
        params = list(self.module.parameters())
        states = [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
        into["state_bytes"] = max(
            into.get("state_bytes", 0),
            tensor_bytes(params) + tensor_bytes(p.grad for p in params) + tensor_bytes(states),
        )
        return step(self, *args, **kwargs)

    type(engine)._INSTRUCTION_MAP = {**type(engine)._INSTRUCTION_MAP, schedule.OptimizerStep: measured}


def time_instructions(engine, into: dict) -> None:
    """Record how long each of the engine's instructions takes (ms), by type: where a stage's time goes.
    On a GPU each is synchronized, so the time is the device's, not the host's launch."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def timed(kind, handler):
        def run(self, *args, **kwargs):
            sync()
            began = time.perf_counter()
            try:
                return handler(self, *args, **kwargs)
            finally:
                sync()
                into.setdefault(kind.__name__, []).append(1000 * (time.perf_counter() - began))

        return run

    type(engine)._INSTRUCTION_MAP = {
        kind: timed(kind, handler) for kind, handler in type(engine)._INSTRUCTION_MAP.items()
    }


def median_seconds(fn, repeats: int, warmup: int = 5, setup=lambda: None) -> float:
    """Median of single timed runs after warm-up (the first CUDA runs autotune, clocks ramp up); a GPU is
    synchronized, so the time is the device's."""
    import statistics

    seconds = []
    for attempt in range(repeats + warmup):
        setup()
        began = time.perf_counter()
        fn()
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        seconds.append(time.perf_counter() - began) if attempt >= warmup else None
    return statistics.median(seconds)


def profile_parts(micro_batch: int, repeats: int = 100) -> dict[str, list[float]]:
    """Seconds [forward, backward] of one microbatch through a fresh embedding, block, and head + loss on this
    rank's device. A block
    is timed as a share of a chain of LAYERS, whose activations all stay until the backward as on a stage
    (one block run alone again and again reuses the same warm memory: 10-20% faster on CPU)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ids = torch.randint(0, VOCAB, (micro_batch, SEQ), device=device)
    x = torch.randn(micro_batch, SEQ, HIDDEN, requires_grad=True, device=device)
    embed, head = Embed().to(device), Head().to(device)
    blocks = nn.Sequential(*(Block() for _ in range(max(1, LAYERS)))).to(device)
    out = {}
    parts = {
        "embed": (lambda: embed(ids).sum(), 1),
        "block": (lambda: blocks(x).sum(), len(blocks)),
        "head": (lambda: loss_fn(head(x), ids), 1),
    }
    for name, (forward, share) in parts.items():
        graph = {}

        def run_forward(forward=forward, graph=graph) -> None:  # untimed: the backward is timed alone
            graph["loss"] = forward()
            torch.cuda.synchronize() if torch.cuda.is_available() else None

        # the backward timed on its own, not as (forward + backward) - forward: on a busy machine the difference of
        # two noisy medians came out 0 for the embedding's small backward
        t_b = median_seconds(lambda graph=graph: graph["loss"].backward(), repeats, setup=run_forward)
        out[name] = [median_seconds(forward, repeats) / share, t_b / share]
    return out


def profile_between(profiles: list, micro_batch: int) -> None:
    """Rank 0 profiles the parts while the others wait (alone on its core or GPU, as in the bench's model)."""
    dist.barrier()
    if dist.get_rank() == 0:
        profiles.append(profile_parts(micro_batch))
    dist.barrier()


def allreduce_seconds(nbytes: int, repeats: int = 10) -> float:
    """Median time of one all-reduce of `nbytes` over all ranks: the data-parallel link, measured."""
    tensor = torch.ones(
        max(1, nbytes // 4), device="cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
    )
    return median_seconds(lambda: dist.all_reduce(tensor), repeats, warmup=3, setup=dist.barrier)


def stop_requested(path: str | None) -> bool:
    """Whether `path` exists on any rank: all ranks agree (an all-reduce), so all stop after the same step."""
    if path is None:
        return False
    device = "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([float(os.path.exists(path))], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def init_distributed(world_size: int) -> None:
    """NCCL with a GPU per rank, gloo on CPU. With more ranks than GPUs NCCL refuses the duplicate device,
    so ranks share GPUs over gloo, and the pipeline's sends go through host memory (gloo sends CPU tensors only)."""
    if not torch.cuda.is_available() or world_size <= torch.cuda.device_count():
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
        return
    os.environ["LOCAL_RANK"] = str(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    from deepspeed.runtime.pipe import p2p

    send, recv = p2p.send, p2p.recv

    def send_via_host(tensor, dest_stage, async_op=False):
        return send(tensor.cpu(), dest_stage, async_op)

    def recv_via_host(tensor, src_stage, async_op=False):
        host = torch.empty_like(tensor, device="cpu")
        recv(host, src_stage, async_op)
        with torch.no_grad():
            tensor.copy_(host)

    p2p.send, p2p.recv = send_via_host, recv_via_host
    dist.init_process_group(
        "gloo"
    )  # not DeepSpeed's: it binds a device, and new_group then splits, which only NCCL can
    deepspeed.init_distributed(dist_backend="gloo")


def offer_bubbles(engine, args):
    """This stage's bubbles, offered to the broker (broker.bubbles.attach) under the main job's name."""
    from broker.app.settings import Settings
    from broker.bubbles.attach import attach

    settings = Settings.from_env()
    if not settings.redis_url:
        raise SystemExit("--broker needs BROKER_REDIS_URL: the broker's Redis (see `broker demo --bubbles`)")
    return attach(
        engine,
        args.broker,
        redis_url=settings.redis_url,
        checkpoints=settings.checkpoints,
        prefix=settings.prefix,
        shards=settings.shards,
        accelerator=args.accelerator,
        profile_steps=args.profile_steps,
        min_window_s=0.001,  # CPU windows last milliseconds
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--stop-file", default=None, help="end training early, after the step in which this file appears"
    )
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--instrument", action="store_true")
    parser.add_argument(
        "--fill", default=None, help="module:Class of a fill task to run in the bubbles (implies --instrument)"
    )
    parser.add_argument("--profile-steps", type=int, default=2, help="iterations measured without fill before filling")
    parser.add_argument("--out", default="run.json")
    parser.add_argument(
        "--broker",
        default=None,
        metavar="MAIN_JOB",
        help="publish the bubble profile and serve fill jobs as agents of tier bubble (BROKER_REDIS_URL)",
    )
    parser.add_argument(
        "--accelerator", default="T4", help="the GPU a stage's bubble offer stands for (on CPU: pretend)"
    )
    parser.add_argument(
        "--measure-memory",
        action="store_true",
        help=(
            f"record weights+grads+optimizer and peak saved activations (the hooks slow the first {MEMORY_STEPS} steps)"
        ),
    )
    parser.add_argument("--time-instructions", action="store_true", help="record each engine instruction's duration")
    parser.add_argument(
        "--profile-compute",
        action="store_true",
        help="time the parts alone on rank 0 before the timed steps and after the last (the machine's speed drifts)",
    )
    parser.add_argument(
        "--probe-allreduce", type=int, default=0, metavar="BYTES", help="after training, time an all-reduce of BYTES"
    )
    args = parser.parse_args()

    init_distributed(int(os.environ.get("WORLD_SIZE", "1")))
    torch.manual_seed(0)
    model = PipelineModule(
        layers=[LayerSpec(layer) for layer in layers()],
        num_stages=args.stages,
        loss_fn=loss_fn,
        partition_method="uniform",
    )
    config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.micro_batches,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    recorder, filler, bubbles = None, None, None
    if args.broker:
        bubbles = offer_bubbles(engine, args)
        recorder = bubbles.recorder
    elif args.instrument or args.fill:
        from broker.bubbles.instrument import instrument
        from broker.bubbles.recorder import BubbleRecorder

        recorder = BubbleRecorder(memory_budget_bytes=2 * 1024**3)
        instrument(engine, recorder)
    data = batches(args.micro_batch, seed=1)
    saved, states = SavedActivations(), {}
    if args.measure_memory:
        measure_states(engine, optimizer, states)
    instructions = {}
    if args.time_instructions:
        time_instructions(engine, instructions)
    losses, iterations, profiles = [], [], []
    for step in range(args.steps):
        if step == MEMORY_STEPS:  # instruction times and profiles from the clean steps only (the hooks are slow)
            instructions.clear()
            if args.profile_compute:
                profile_between(profiles, args.micro_batch)
        if args.fill and step == args.profile_steps:
            filler = Filler(args.fill, recorder, engine.stage_id)
        started = time.monotonic()
        hooks = saved.hooks() if args.measure_memory and step < MEMORY_STEPS else nullcontext()  # then clean steps
        with hooks, bubbles.iteration() if bubbles else nullcontext():
            loss = engine.train_batch(data_iter=data)
        iterations.append((started, time.monotonic()))
        losses.append(float(loss))
        if stop_requested(args.stop_file):
            break
    if args.profile_compute:
        profile_between(profiles, args.micro_batch)
    rank = dist.get_rank()
    result = {
        "rank": rank,
        "stage": engine.stage_id,
        "losses": losses,
        "iterations": iterations,
        "windows": recorder.windows if recorder else [],
        "fill": filler.finish() if filler else None,
        "state_bytes": states.get("state_bytes", 0),
        "activation_peak_bytes": saved.peak,
        "cuda_peak_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0,
        "instruction_ms": {kind: sorted(ms)[len(ms) // 2] for kind, ms in instructions.items()},
        "compute_profiles": profiles,
        "memory_steps": MEMORY_STEPS,
        "allreduce_s": allreduce_seconds(args.probe_allreduce) if args.probe_allreduce else None,
    }
    if bubbles:
        bubbles.close()
        result["served"] = bubbles.served
    with open(f"{args.out}.rank{rank}", "w") as handle:
        json.dump(result, handle)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    # Leave without the interpreter's finalization: there the gloo process groups that DeepSpeed still holds are
    # torn down out of order, and now and then a rank aborts after its work is written (SIGABRT, "terminate
    # called without an active exception"; 3 runs in 12 on a loaded 2-core machine). torch has no fix yet.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
