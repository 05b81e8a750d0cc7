"""A DeepSpeed pipeline engine that marks its own bubbles: a BubbleInstruction where a large idle
window begins, a BubbleEnd where it ends, and a handler that records both, measures free memory,
signals the fill executor and returns at once. Training itself is untouched: the instructions
run between DeepSpeed's own (before the blocking receive that is the wait), so losses are the
same bit for bit.

Where the windows are, per stage of DeepSpeed's 1F1B TrainSchedule:
- fill-drain: the wait for the iteration's first activation (stages > 0), which is also the
  previous iteration's drain;
- fwd-bwd: the wait for the first gradient (stages < p - 1).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch
from deepspeed.runtime.pipe.engine import PipelineEngine
from deepspeed.runtime.pipe.schedule import PipeInstruction, RecvActivation, RecvGrad, TrainSchedule


class BubbleInstruction(PipeInstruction):
    """A large bubble begins: its kind and expected length (0 when unknown)."""

    def __init__(self, kind: str, expected_s: float = 0.0):
        super().__init__(kind=kind, expected_s=expected_s)


class BubbleEnd(PipeInstruction):
    """The awaited message arrived: the bubble is over."""

    def __init__(self, kind: str):
        super().__init__(kind=kind)


class BubbleTrainSchedule(TrainSchedule):
    """DeepSpeed's 1F1B TrainSchedule with the bubble marks around the two blocking waits."""

    def __init__(self, micro_batches: int, stages: int, stage_id: int, expected_s: dict[str, float] | None = None):
        super().__init__(micro_batches=micro_batches, stages=stages, stage_id=stage_id)
        self.expected_s = expected_s or {}

    def steps(self):
        first = {RecvActivation: "fill-drain", RecvGrad: "fwd-bwd"}
        for commands in super().steps():
            marked = []
            for command in commands:
                kind = first.pop(type(command), None)
                if kind is not None:
                    marked += [BubbleInstruction(kind, self.expected_s.get(kind, 0.0)), command, BubbleEnd(kind)]
                else:
                    marked.append(command)
            yield marked


@dataclass
class BubbleRecorder:
    """What the engine saw of its bubbles: (kind, start, end, free bytes) per window, and who to tell."""

    memory_budget_bytes: int = 0  # on CPU: the budget the fill work may use, minus this process's RSS
    signal: object = None  # called as signal(kind, expected_s, free_bytes) at each bubble start
    windows: list[tuple[str, float, float, int]] = field(default_factory=list)
    _open: dict[str, tuple[float, int]] = field(default_factory=dict)

    def begin(self, kind: str, expected_s: float) -> None:
        free = free_memory_bytes(self.memory_budget_bytes)
        self._open[kind] = (time.monotonic(), free)
        if self.signal is not None:
            self.signal(kind, expected_s, free)

    def end(self, kind: str) -> None:
        started, free = self._open.pop(kind)
        self.windows.append((kind, started, time.monotonic(), free))


def free_memory_bytes(budget_bytes: int) -> int:
    """Memory a fill job could use now: free device memory after emptying the allocator's cache on CUDA,
    else the configured budget minus this process's resident set."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        return int(torch.cuda.mem_get_info()[0])
    with open(f"/proc/{os.getpid()}/statm") as statm:
        rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return max(0, budget_bytes - rss)


def _exec_bubble(self, kind: str, expected_s: float) -> None:
    self.bubble_recorder.begin(kind, expected_s)


def _exec_bubble_end(self, kind: str) -> None:
    self.bubble_recorder.end(kind)


class BubblePipelineEngine(PipelineEngine):
    """PipelineEngine with handlers for the bubble marks and the marked schedule."""

    _INSTRUCTION_MAP = {**PipelineEngine._INSTRUCTION_MAP, BubbleInstruction: _exec_bubble, BubbleEnd: _exec_bubble_end}

    def _train_schedule(self):
        return BubbleTrainSchedule(
            self.micro_batches, self.num_stages, self.stage_id, getattr(self, "bubble_expected_s", None)
        )


def instrument(
    engine: PipelineEngine, recorder: BubbleRecorder, expected_s: dict[str, float] | None = None
) -> PipelineEngine:
    """Make a PipelineEngine from deepspeed.initialize mark its bubbles (it becomes a BubblePipelineEngine)."""
    engine.__class__ = BubblePipelineEngine
    engine.bubble_recorder, engine.bubble_expected_s = recorder, expected_s
    return engine
