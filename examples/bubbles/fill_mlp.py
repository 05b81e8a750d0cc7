"""A fill job with the step interface: a small MLP trained on deterministic synthetic batches.

The same task runs inside bubbles (broker.bubbles.executor.FillExecutor) and as an ordinary
job (`python examples/bubbles/fill_mlp.py` under an agent, through broker.sdk), and reaches
the same weights either way: batch k depends only on k. Its configuration sizes it: `width`,
`depth` (hidden layers) and `batch` (64, 1 and 16: a CPU step of well under a millisecond), and
`device` ("cuda": each step ends with the GPU's work done, so a step never spills past the window
it was timed for). `micro_steps` splits each step's batch into that many micro-batches whose
gradients add up before the update (PipeFill's micro-step configurations: shorter nodes that fit
shorter windows); the fill agent picks the split that does the most work in its windows.
`extra_step_s` and `extra_row_s` make steps slower, `cold_s` the first whole step of a process, `spike_s` the
`spike_call`th call of a process (a spike of the machine's load; tests).
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch import nn

from broker.bubbles.executor import FillTask, run_standalone


class MlpFill(FillTask):
    def create(self, config: dict) -> None:
        torch.set_num_threads(1)  # the same arithmetic in every process it may run in: identical weights anywhere
        torch.manual_seed(int(config.get("seed", 0)))
        self.device = torch.device(config.get("device", "cpu"))
        width, self.rows = int(config.get("width", 64)), int(config.get("batch", 16))
        hidden = [
            layer for _ in range(int(config.get("depth", 1)) - 1) for layer in (nn.Linear(width, width), nn.ReLU())
        ]
        self.model = nn.Sequential(nn.Linear(32, width), nn.ReLU(), *hidden, nn.Linear(width, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.splits = int(config.get("micro_steps", 1))
        if self.splits < 1 or self.rows % self.splits:
            raise ValueError(f"micro_steps: {self.splits} does not divide batch {self.rows}; give a divisor of it")
        self.step, self.micro = 0, 0  # whole steps done, micro-batches of the next one done
        self.sleep_s = float(config.get("extra_step_s", 0.0)) + float(config.get("extra_row_s", 0.0)) * (
            self.rows // self.splits
        )
        self.cold_s, self.cold_calls = float(config.get("cold_s", 0.0)), self.splits  # a GPU's first kernels
        self.spike_s, self.calls_to_spike = float(config.get("spike_s", 0.0)), int(config.get("spike_call", 0))

    def init(self) -> None:
        """On the device, with one untimed forward and backward of one micro-batch (no update): the GPU libraries
        start here, not in a window, and the memory peak is the configuration's own. The first steps in windows are
        still slower on a GPU; the executor times them as its warm-up."""
        self.model.to(self.device)
        x, y = self.batch(self.step)
        rows = self.rows // self.splits
        nn.functional.mse_loss(self.model(x[:rows]), y[:rows]).backward()
        self.optimizer.zero_grad()
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def batch(self, k: int):
        generator = torch.Generator(self.device).manual_seed(1000 + k)
        x = torch.randn(self.rows, 32, generator=generator, device=self.device)
        return x, x.sum(dim=1, keepdim=True)

    def run_step(self) -> None:
        """One micro-batch; the update once all of the step's micro-batches have added their gradients."""
        x, y = self.batch(self.step)
        if self.micro == 0:
            self.optimizer.zero_grad()
        rows = slice(self.micro * self.rows // self.splits, (self.micro + 1) * self.rows // self.splits)
        loss = nn.functional.mse_loss(self.model(x[rows]), y[rows])
        (loss / self.splits if self.splits > 1 else loss).backward()
        self.micro += 1
        if self.micro == self.splits:
            self.optimizer.step()
            self.step, self.micro = self.step + 1, 0
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        if self.sleep_s:
            time.sleep(self.sleep_s)  # a heavier step (or one that ignores its window, for the tests)
        if self.cold_s and self.cold_calls > 0:
            self.cold_calls -= 1
            time.sleep(self.cold_s)
        self.calls_to_spike -= 1
        if self.spike_s and self.calls_to_spike == 0:
            time.sleep(self.spike_s)

    def configurations(self) -> dict[str, dict]:
        return {
            f"{k}x{self.rows // k}": {"micro_steps": k} for k in (1, 2, 4, 8) if self.rows % k == 0 and k != self.splits
        }

    def micro_steps(self) -> int:
        return self.splits

    def steps_done(self) -> int:
        return self.step

    def state_dict(self) -> dict:
        """Whole steps only: a step part-way through is done again from its start, in any configuration."""
        return {"step": self.step, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.micro = state["step"], 0
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


if __name__ == "__main__":  # as an ordinary job: STEPS, OUTPUT from the environment
    task = run_standalone("fill_mlp:MlpFill", {}, int(os.environ.get("STEPS", "60")))
    if os.environ.get("OUTPUT"):
        torch.save(task.model.state_dict(), os.environ["OUTPUT"])
    sys.exit(0)
