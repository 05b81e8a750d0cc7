"""A training stage of train_gpt.py (`--fill`) or a bench filling its own bubbles with a fill task, without the
broker (which serves its fill jobs through broker.bubbles.attach instead)."""

from __future__ import annotations

import time


class Filler:
    """Runs a fill task in this rank's bubbles: each bubble signal becomes an executor window as long as
    that kind of window nearly always is (its p10 so far), on a thread so the engine never waits."""

    def __init__(self, task: str, recorder, stage: int, config: dict | None = None):
        import queue
        import threading

        import numpy as np

        from broker.bubbles.executor import FillExecutor

        self.p10 = {}
        for kind in {w[0] for w in recorder.windows}:
            lengths = [end - start for k, start, end, _ in recorder.windows if k == kind]
            self.p10[kind] = float(np.percentile(lengths, 10))
        self.executor = FillExecutor(task, {"step_s": 0.0, "seed": stage, **(config or {})})
        self.executor.start()
        self.signals = queue.Queue()
        self.windows = []  # (kind, start, planned end)
        recorder.signal = lambda kind, expected_s, free: self.signals.put((kind, time.monotonic()))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            item = self.signals.get()
            if item is None:
                return
            kind, began = item
            length = self.p10.get(kind, 0.0) * 0.9 - (time.monotonic() - began)  # keep a 10% margin
            if length > 0.001:
                self.windows.append((kind, began, began + length))
                self.executor.window(length)

    def finish(self) -> dict:
        self.signals.put(None)
        self.thread.join()
        self.executor.stop()
        return {
            "steps": [(a, b, end) for a, b, end in self.executor.steps],
            "windows": self.windows,
            "kills": self.executor.kills,
            "p10": self.p10,
        }
