"""A deterministic torch training job written against broker.sdk (the demo runs it; so do the tests).

Every step's batch is drawn from a generator seeded by the step number, so a run resumed
from a checkpoint at step k computes exactly what an uninterrupted run computes.
Environment: STEPS (total), CKPT_EVERY (interval), STEP_SLEEP_S (to make it slow enough to
preempt), OUTPUT (where the final weights go).
"""

import os
import time

import torch

from broker import sdk

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

STEPS = int(os.environ.get("STEPS", "60"))
CKPT_EVERY = int(os.environ.get("CKPT_EVERY", "10"))
STEP_SLEEP_S = float(os.environ.get("STEP_SLEEP_S", "0"))


def fresh_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, optimizer, 0


DIRECTION = torch.linspace(-0.5, 0.5, 16).unsqueeze(1)  # a target smooth enough to learn in a few hundred steps


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(64, 16, generator=g)
    return x, (x @ DIRECTION).sin()


model, optimizer, start = fresh_state()
state = sdk.restore()
if state is not None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]
    print(f"resumed from step {start}", flush=True)

for step in range(start, STEPS):
    x, y = batch(step)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    done = step + 1
    sdk.progress(done, STEPS)
    stop = sdk.should_stop()
    if sdk.should_save() or stop or done % CKPT_EVERY == 0:
        sdk.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": done}, step=done)
        print(f"step {done}/{STEPS} loss {loss.item():.4f} (checkpoint saved)", flush=True)
    if stop:
        print(f"asked to stop: leaving at step {done}", flush=True)
        raise SystemExit(0)
    time.sleep(STEP_SLEEP_S)

torch.save(model.state_dict(), os.environ["OUTPUT"])
print(f"done: {STEPS} steps", flush=True)
