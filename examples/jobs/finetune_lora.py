"""A LoRA fine-tune written against broker.sdk, small enough for a CPU: a frozen base model (a seeded 4-layer MLP
standing in for pretrained weights) gets rank-r adapters on every linear layer, and only the adapters train, on a
task the base model does not solve. The checkpoint holds the adapters and their optimizer, as a real LoRA
checkpoint does (hence `checkpoint.size_gb` is small in examples/finetune-lora.yaml).

Swap in your own script; keep its three broker.sdk calls: restore, progress, save (on SIGTERM too).
"""

import argparse
import time

import torch

from broker import sdk

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--rank", type=int, default=4)
parser.add_argument("--ckpt-every", type=int, default=50)
parser.add_argument("--width", type=int, default=256)
parser.add_argument("--step-sleep-s", type=float, default=0.0, help="Slows the job down to preempt it in a demo.")
args = parser.parse_args()


class LoRALinear(torch.nn.Module):
    """y = W x + (alpha / r) B A x, with W frozen and B zero at first (the adapted model starts as the base)."""

    def __init__(self, base: torch.nn.Linear, rank: int, alpha: float = 8.0):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.a = torch.nn.Parameter(torch.randn(rank, base.in_features) / base.in_features**0.5)
        self.b = torch.nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + self.scale * (x @ self.a.T) @ self.b.T


def base_model(width: int) -> torch.nn.Sequential:
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 8))


def with_adapters(model: torch.nn.Sequential, rank: int) -> torch.nn.Sequential:
    torch.manual_seed(1)
    return torch.nn.Sequential(*(LoRALinear(m, rank) if isinstance(m, torch.nn.Linear) else m for m in model))


def batch(step: int, width: int):
    """Seeded by the step: a resumed run sees exactly the batches an uninterrupted one sees."""
    g = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(128, width, generator=g)
    task = torch.randn(width, 8, generator=torch.Generator().manual_seed(7))  # the labelling to learn
    return x, (x @ task).argmax(dim=1)


model = with_adapters(base_model(args.width), args.rank)
adapters = [p for p in model.parameters() if p.requires_grad]
optimizer = torch.optim.AdamW(adapters, lr=3e-3)
start = 0
state = sdk.restore()
if state is not None:
    model.load_state_dict(state["adapters"], strict=False)
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]
    print(f"resumed from step {start}", flush=True)
print(f"trainable {sum(p.numel() for p in adapters):,} of {sum(p.numel() for p in model.parameters()):,} parameters")

for step in range(start, args.steps):
    x, y = batch(step, args.width)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    done = step + 1
    sdk.progress(done, args.steps)
    if done % 50 == 0:
        print(f"step {done}/{args.steps} loss {loss.item():.4f}", flush=True)
    stop = sdk.should_stop()
    if sdk.should_save() or stop or done % args.ckpt_every == 0 or done == args.steps:
        trained = {k: v for k, v in model.state_dict().items() if k.endswith((".a", ".b"))}
        sdk.save({"adapters": trained, "optimizer": optimizer.state_dict(), "step": done}, step=done)
    if stop:
        raise SystemExit(0)
    time.sleep(args.step_sleep_s)
print("fine-tune done", flush=True)
