"""One pipeline stage replayed alone on a device, for machines with one GPU.

The stage runs its real forward and backward (examples/bubbles/gpt.py's layers, DeepSpeed's uniform
partition) in the order DeepSpeed's TrainSchedule runs them, and every receive becomes a wait as long
as the schedule model says the other stages keep it waiting (`lockstep_timeline` over every stage's
measured forward and backward times). Waits have fixed lengths, so whatever fill work costs the stage
adds to its iteration in full: no later message absorbs it. The two large waits are marked through a
BubbleRecorder, as the instrumented engine marks them, so the same Filler fills them from a second
process. A stage's input activations and output gradients, which other stages would send, are
deterministic synthetic tensors; its "losses" are its loss (last stage) or the sum of its outputs, per
iteration, so two runs can be compared bit for bit.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from broker.bubbles.recorder import BubbleRecorder
from broker.models.schedule import lockstep_timeline

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "bubbles"))
MEMORY_BUDGET = 2 * 1024**3  # on CPU, what a fill job may use (as train_gpt.py gives its recorder)


class Stage:
    """One stage's layers, optimizer and the data the neighbouring stages would send it."""

    def __init__(self, stage: int, stages: int, micro_batch: int, device: str):
        import gpt

        torch.manual_seed(stage)
        self.gpt, self.micro_batch, self.device = gpt, micro_batch, torch.device(device)
        self.first, self.last = stage == 0, stage == stages - 1
        self.layers = nn.Sequential(*(layer() for layer in gpt.stage_layers(stage, stages))).to(self.device)
        self.optimizer = torch.optim.SGD(self.layers.parameters(), lr=1e-4)
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _tensor(self, seed: int, *shape: int) -> torch.Tensor:
        generator = torch.Generator(self.device).manual_seed(seed)
        return torch.randn(*shape, generator=generator, device=self.device)

    def forward(self, iteration: int, microbatch: int) -> float:
        """The microbatch's forward; returns its loss (last stage) or its outputs' sum."""
        seed = 1000 * iteration + microbatch
        shape = (self.micro_batch, self.gpt.SEQ, self.gpt.HIDDEN)
        ids, labels = next(self.gpt.batches(self.micro_batch, seed))
        ids, labels = ids.to(self.device), labels.to(self.device)
        x = ids if self.first else self._tensor(seed, *shape).requires_grad_()
        out = self.layers(x)
        if self.last:
            out = self.gpt.loss_fn(out, labels)
        tokens = self.micro_batch * self.gpt.SEQ  # a gradient as small as a mean loss's: training stays finite
        grad = torch.ones_like(out) if self.last else self._tensor(seed + 10**6, *shape) / tokens
        self.outputs[microbatch] = (out, grad)
        return float(out.detach().double().sum())

    def backward(self, microbatch: int) -> None:
        out, grad = self.outputs.pop(microbatch)
        out.backward(grad)

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def op_seconds(stage: Stage, device: str, repeats: int = 10, warmup: int = 3) -> tuple[float, float]:
    """Median seconds of one microbatch's forward and backward on this stage, alone on the device."""
    forwards, backwards = [], []
    for attempt in range(warmup + repeats):
        began = time.perf_counter()
        stage.forward(0, 0)
        sync(device)
        middle = time.perf_counter()
        stage.backward(0)
        sync(device)
        if attempt >= warmup:
            forwards.append(middle - began)
            backwards.append(time.perf_counter() - middle)
    stage.optimizer.zero_grad(set_to_none=True)
    return statistics.median(forwards), statistics.median(backwards)


def waits(stage: int, stages: int, micro_batches: int, t_f: list[float], t_b: list[float]) -> list[tuple]:
    """(wait before, bubble kind or None, op) for each of the stage's operations in one iteration of the model:
    the wait before the first is the drain and fill between iterations, the one before the first backward
    the forward-backward window; the others are 1F1B's scattered gaps, waited but not filled."""
    placed = lockstep_timeline(stages, micro_batches, t_f, t_b)
    period = max(ops[-1][1] for ops in placed)
    ops = placed[stage]
    first_backward = next(i for i, (_, _, op) in enumerate(ops) if op.kind == "B")
    plan = []
    for i, (start, _, op) in enumerate(ops):
        before = start - (ops[i - 1][1] if i else ops[-1][1] - period)
        kind = "fill-drain" if i == 0 else "fwd-bwd" if i == first_backward else None
        plan.append((max(0.0, before), kind, op))
    return plan


def idle(seconds: float, kind: str | None, recorder: BubbleRecorder | None) -> None:
    """Wait as a receive would; a marked wait is a bubble the recorder sees begin and end."""
    until = time.monotonic() + seconds
    if kind and recorder is not None and seconds > 0:
        recorder.begin(kind, seconds)
        time.sleep(max(0.0, until - time.monotonic()))
        recorder.end(kind)
    else:
        time.sleep(max(0.0, until - time.monotonic()))


def replay(
    stage: Stage, plan: list[tuple], steps: int, device: str, recorder=None, fill_from: int | None = None, fill=None
) -> dict:
    """Run `steps` iterations of the plan; from iteration `fill_from` on, `fill(recorder, iterations)` starts a
    filler (stage_fill.Filler, or live_fill.BrokerFill).
    Returns the records bench/bubbles.py reads: iterations, windows, losses and the fill's steps."""
    iterations, losses, filler = [], [], None
    for iteration in range(steps):
        if fill is not None and iteration == fill_from:
            filler = fill(recorder, iterations)
        began, total = time.monotonic(), 0.0
        for before, kind, op in plan:
            idle(before, kind, recorder)
            if op.kind == "F":
                total += stage.forward(iteration, op.microbatch)
            else:
                stage.backward(op.microbatch)
            sync(device)  # a message leaves once the work that made it is done
        stage.step()
        sync(device)
        iterations.append((began, time.monotonic()))
        losses.append(total)
    return {
        "iterations": iterations,
        "losses": losses,
        "windows": recorder.windows if recorder is not None else [],
        "fill": filler.finish() if filler else None,
    }


def stage_runs(
    stages: int,
    micro_batches: int,
    micro_batch: int,
    steps: int,
    profile_steps: int,
    device: str,
    fill_config: dict,
    live=None,
    fill_steps: int | None = None,
    only: list[int] | None = None,
) -> tuple[list[dict], list[dict], list[dict]]:
    """Each stage in turn: bare (no marks; not with `live`), instrumented without fill, and with fill from
    iteration `profile_steps` on for `fill_steps` iterations (default `steps`), by a Filler or, given a
    live_fill.LiveBroker, by the broker's own agent; the stages in `only`, or all. The waits come from every
    stage's times, measured first."""

    def filler(recorder, iterations, stage):
        if live is not None:
            from live_fill import BrokerFill  # redis, the broker's agent: only for --live

            return BrokerFill(live, recorder, stage, iterations, fill_config)
        from stage_fill import Filler

        return Filler("fill_mlp:MlpFill", recorder, stage, fill_config)

    times = [op_seconds(Stage(s, stages, micro_batch, device), device) for s in range(stages)]
    t_f, t_b = [t for t, _ in times], [t for _, t in times]
    bare, plain, filled = [], [], []
    for s in only if only is not None else range(stages):
        plan = waits(s, stages, micro_batches, t_f, t_b)
        runs = []
        for recorder, fill, iterations in (
            (None, None, 0 if live else steps),
            (BubbleRecorder(MEMORY_BUDGET), None, steps),
            (BubbleRecorder(MEMORY_BUDGET), lambda r, its, s=s: filler(r, its, s), fill_steps or steps),
        ):
            run = replay(Stage(s, stages, micro_batch, device), plan, iterations, device, recorder, profile_steps, fill)
            runs.append({**run, "stage": s, "t_f": t_f[s], "t_b": t_b[s]})
        for into, run in zip((bare, plain, filled), runs):
            if run["iterations"]:
                into.append(run)
        print(f"stage {s}: {len(runs[-1]['iterations'])} iterations filled", file=sys.stderr, flush=True)
    return bare, plain, filled
