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

from deepspeed.runtime.pipe.engine import PipelineEngine
from deepspeed.runtime.pipe.schedule import PipeInstruction, RecvActivation, RecvGrad, TrainSchedule

from broker.bubbles.recorder import BubbleRecorder


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
