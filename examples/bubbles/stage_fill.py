"""What a training stage of train_gpt.py does with its bubbles: fill them itself with a fill task (`--fill`), or
publish its measured profile and serve the broker's fill jobs in them as a broker agent (`--broker`)."""

from __future__ import annotations

import time
from datetime import UTC

import torch


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


def register(main_job: str, accelerator: str, stage: int, recorder, iterations):
    """Publish this stage's measured profile and serve fill jobs in its bubbles as a broker agent."""
    from datetime import datetime

    from broker.agents.checkpoints import CheckpointStore
    from broker.app.settings import Settings
    from broker.bubbles.agent import FillAgent
    from broker.bubbles.capacity import bubble_offer
    from broker.bubbles.profiler import profile
    from broker.store.jobs import Store
    from broker.store.profiles import save_profile

    settings = Settings.from_env()
    if not settings.redis_url:
        raise SystemExit("--broker needs BROKER_REDIS_URL: the broker's Redis (see `broker demo --bubbles`)")
    store = Store(settings.redis_url, prefix=settings.prefix)
    measured = profile(
        main_job,
        stage,
        "cuda" if torch.cuda.is_available() else "cpu",
        recorder.windows,
        iterations,
        datetime.now(UTC),
    )
    save_profile(store, measured)
    offer = bubble_offer(measured, "local", "local", accelerator, min_window_s=0.001)  # CPU windows last milliseconds
    if offer is None:
        print(f"stage {stage}: no window long enough to fill yet; not registering", flush=True)
        return None
    agent = FillAgent(store, CheckpointStore(settings.checkpoints), measured, offer)
    recorder.signal = agent.signal
    agent.start()
    return agent
