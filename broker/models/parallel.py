"""Parallel configuration of a transformer training job (Pipette, AutoPipe): which (p, t, d, micro-batch)
layout to run on an offer's GPUs, what it costs per step, how to place nodes into pipelines, and when
re-configuring pays.

The search tries every p t d = G with t inside a node (dividing the heads and hidden size), p at most
the layers, every micro-batch dividing the per-replica batch; drops layouts whose estimated memory
exceeds the GPU's (Pipette's lesson: most of AMP's top picks ran out of memory), and keeps the fastest.
The planner prices a model job on an offer with that layout's iteration time (`exclusive_hours`).
Link bandwidths are public figures: NVLink per GPU (V100 300 GB/s, A100 600, H100/H200 900) for
4+ GPU instances with NVLink, PCIe (16 GB/s gen3, 32 GB/s gen4) otherwise, and 100 Gb/s between
instances unless a bandwidth matrix is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from broker.domain.accelerators import ACCELERATORS
from broker.domain.model import JobSpec
from broker.domain.model import TransformerSpec as ModelSpec
from broker.models.transformer import MFU, Hardware, Layout, iteration_seconds, memory_bytes

NVLINK_GB_S = {"V100": 300, "V100-32GB": 300, "A100": 600, "A100-80GB": 600, "H100": 900, "H100-MEGA": 900, "H200": 900}
PCIE_GEN4 = {"A10G", "A10", "L4", "L40S"}
INTER_NODE_GB_S = 12.5  # 100 Gb/s


def hardware(accelerator: str, count: int) -> Hardware:
    """The time model's view of one instance with `count` x `accelerator`."""
    spec = ACCELERATORS[accelerator]
    if count >= 4 and accelerator in NVLINK_GB_S:
        intra = NVLINK_GB_S[accelerator] * 1e9
    else:
        intra = (32 if accelerator in PCIE_GEN4 else 16) * 1e9
    return Hardware(
        flops=spec.tflops * 1e12 * MFU, intra_bytes_s=intra, inter_bytes_s=INTER_NODE_GB_S * 1e9, devices_per_node=count
    )


@dataclass(frozen=True)
class Choice:
    layout: Layout
    iteration_s: float
    memory_bytes: float


def layouts(model: ModelSpec, gpus: int, devices_per_node: int) -> list[Layout]:
    """Every valid (p, t, d, micro-batch) for `gpus` devices."""
    out = []
    for t in range(1, min(gpus, devices_per_node) + 1):
        if gpus % t or model.heads % t or model.hidden % t:
            continue
        for p in range(1, min(gpus // t, model.layers) + 1):
            if (gpus // t) % p:
                continue
            d = gpus // (t * p)
            if model.global_batch % d:
                continue
            per_replica = model.global_batch // d
            out += [Layout(p, t, d, b) for b in range(1, per_replica + 1) if per_replica % b == 0]
    return out


def search(model: ModelSpec, hw: Hardware, gpus: int, memory_limit_bytes: float) -> list[Choice]:
    """Every layout that fits in memory, fastest first."""
    found = []
    for layout in layouts(model, gpus, hw.devices_per_node):
        memory = memory_bytes(model, layout)
        if memory <= memory_limit_bytes:
            found.append(Choice(layout, iteration_seconds(model, layout, hw), memory))
    return sorted(found, key=lambda c: (c.iteration_s, c.memory_bytes, str(c.layout)))


@lru_cache(maxsize=4096)
def best(model: ModelSpec, accelerator: str, count: int) -> Choice | None:
    """The fastest layout of the job on one instance of count x accelerator, or None when none fits."""
    found = search(model, hardware(accelerator, count), count, ACCELERATORS[accelerator].memory_gb * 1e9)
    return found[0] if found else None


def exclusive_hours(spec: JobSpec, accelerator: str, count: int) -> float:
    """Hours for the job's steps with its best layout on count x accelerator (inf when nothing fits)."""
    choice = best(spec.transformer, accelerator, count)
    return math.inf if choice is None else spec.work.steps * choice.iteration_s / 3600


def usd_per_step(choice: Choice, price_usd_per_h: float) -> float:
    return price_usd_per_h * choice.iteration_s / 3600
