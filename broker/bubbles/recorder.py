"""What a stage saw of its bubbles, engine or not: each window's kind, start, end and the free memory at
its start, and a signal to whoever fills it. The DeepSpeed engine (instrument.py) and the one-stage
replay of bench/stage_replay.py both record through it."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch


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
