"""A transformer training job's memory per GPU and iteration time for a pipeline/tensor/data-parallel layout.

Memory (per GPU, for the most loaded stage): weights, gradients and optimizer state of the stage's
parameters split t ways (ZeRO stage 1/2/3 also splits optimizer state/gradients/weights d ways),
and the activations of the microbatches in flight: under 1F1B stage s holds min(p - s, m) of them,
under GPipe all m. Activations per layer and microbatch follow Korthikanti et al. ("Reducing
Activation Recomputation in Large Transformer Models"): s b h (10 + 24/t + 5 a s / (h t)) bytes
in 16-bit precision (twice that in fp32), of which 2 s b h + a s^2 b are dropout masks (gone without
dropout; the a s^2 part is gone with flash attention; a ReLU MLP keeps 8 s b h less than GeLU);
with full recomputation only each layer's input, 2 s b h bytes, stays. The last stage also holds the
output layer's b s V logits: their fp32 log-softmax per microbatch in flight, and two more b s V
tensors (the gradients) while the loss runs backward; a 50k vocabulary makes this hundreds of MB
(measured on an H100: without it the estimate was 19-23% under `max_memory_allocated`).
A safety margin is added on top.

Time (Pipette's form, see ../shared/papers.md): t_f and t_b of one microbatch on each stage from a
FLOPs model (forward 24 b s h^2 + 4 b s^2 h per layer, plus 2 b s h V for the head; backward twice
the forward; recomputation one more forward) at the accelerator's sustained throughput, plus the
tensor-parallel all-reduces; with C = t_f + t_b of the slowest stage, iteration = (m + p - 1) C +
ceil(m / p) T_pp + T_dp, which is Pipette's floor(m/p)(p C + T_pp) + (p - 1) C + T_dp when p divides
m; T_pp sends 2 b s h bytes per hop (each message also pays the link's latency), T_dp is a ring
all-reduce of the stage's gradients over the slowest data-parallel link. DeepSpeed's engine
(schedule "deepspeed") runs the same order in lock-step, both neighbours blocked for each exchange:
its iteration is the length of that timeline (broker/bubbles/schedule.py) plus T_dp.
Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from broker.domain.model import TransformerSpec as ModelSpec
from broker.models.schedule import lockstep_timeline

MFU = 0.45  # sustained share of peak tensor FLOPS for large-model training (Megatron/PaLM report 40-55%)
MARGIN = 1.10  # 10% for the allocator's fragmentation, buffers and workspace


@dataclass(frozen=True)
class Layout:
    """How G = p t d GPUs run the job: p pipeline stages, t-way tensor and d-way data parallel, micro-batch b."""

    p: int
    t: int
    d: int
    micro_batch: int

    def microbatches(self, model: ModelSpec) -> int:
        return model.global_batch // (self.micro_batch * self.d)

    def __str__(self) -> str:
        return f"p{self.p}t{self.t}d{self.d}b{self.micro_batch}"


@dataclass(frozen=True)
class Hardware:
    """What the time model needs of a machine: sustained FLOP/s per device and link bandwidths (bytes/s)."""

    flops: float
    intra_bytes_s: float  # between devices in one node (NVLink or PCIe)
    inter_bytes_s: float  # between nodes (the instance's network)
    devices_per_node: int
    latency_s: float = 0.0  # per message between stages, besides its bytes over the bandwidth


def layer_params(model: ModelSpec) -> int:
    """Attention (4 h^2 + 4 h), MLP (8 h^2 + 5 h), two layer norms (4 h)."""
    h = model.hidden
    return 12 * h * h + 13 * h


def stage_layers(model: ModelSpec, p: int) -> list[int]:
    """Transformer layers per stage, as even as they go (earlier stages take the remainder)."""
    base, extra = divmod(model.layers, p)
    return [base + (1 if s < extra else 0) for s in range(p)]


def stage_params(model: ModelSpec, p: int) -> list[int]:
    """Parameters per stage: its layers, the embeddings on the first, the head and final norm on the last."""
    h, counts = model.hidden, stage_layers(model, p)
    out = [n * layer_params(model) for n in counts]
    out[0] += model.vocab * h + model.seq_len * h
    out[-1] += model.vocab * h + 2 * h
    return out


def _bytes(model: ModelSpec) -> int:
    return 4 if model.precision == "fp32" else 2


def state_bytes_per_param(model: ModelSpec) -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes per parameter; 16-bit training keeps fp32 master weights."""
    half = model.precision != "fp32"
    optimizer = (8.0 if model.optimizer == "adam" else 0.0) + (4.0 if half else 0.0)
    return float(_bytes(model)), float(_bytes(model)), optimizer


def activation_bytes(model: ModelSpec, layout: Layout) -> float:
    """Bytes one transformer layer keeps for one microbatch until its backward pass."""
    s, b, h, a, t = model.seq_len, layout.micro_batch, model.hidden, model.heads, layout.t
    if model.recompute:
        return 2.0 * s * b * h * (_bytes(model) / 2)
    masks = 1 if model.dropout else 0  # dropout keeps 1-byte masks: 2 s b h, and a s^2 b in attention
    scores = 0 if model.flash_attention else (4 + masks) * a * s / (h * t)  # flash attention keeps no s x s scores
    split = 24 if model.mlp_activation == "gelu" else 16  # GeLU keeps its input and output, ReLU only its output
    return s * b * h * (8 + 2 * masks + split / t + scores) * (_bytes(model) / 2)


def head_bytes(model: ModelSpec, layout: Layout) -> tuple[float, float]:
    """(kept per microbatch in flight, transient at the loss's backward) bytes of the output layer and loss."""
    logits = layout.micro_batch * model.seq_len * model.vocab / layout.t
    return 4.0 * logits, 2.0 * _bytes(model) * logits


def in_flight(model: ModelSpec, layout: Layout, stage: int) -> int:
    m = layout.microbatches(model)
    return m if model.schedule == "gpipe" else min(layout.p - stage, m)


def stage_memory_bytes(model: ModelSpec, layout: Layout) -> list[float]:
    """Estimated peak bytes per GPU of each stage, margin included."""
    weights_b, grads_b, optimizer_b = state_bytes_per_param(model)
    zero, d = model.zero_stage, layout.d
    per_param = (
        weights_b / (d if zero >= 3 else 1) + grads_b / (d if zero >= 2 else 1) + optimizer_b / (d if zero >= 1 else 1)
    )
    out = []
    for stage, (params, layers) in enumerate(zip(stage_params(model, layout.p), stage_layers(model, layout.p))):
        states = params / layout.t * per_param
        activations = activation_bytes(model, layout) * layers * in_flight(model, layout, stage)
        if stage == layout.p - 1:
            kept, transient = head_bytes(model, layout)
            activations += kept * in_flight(model, layout, stage) + transient
        out.append(MARGIN * (states + activations))
    return out


def memory_bytes(model: ModelSpec, layout: Layout) -> float:
    """The most loaded GPU's estimate: what has to fit in the accelerator's memory."""
    return max(stage_memory_bytes(model, layout))


def microbatch_flops(model: ModelSpec, layout: Layout) -> list[float]:
    """Forward plus backward FLOPs of one microbatch on each stage (whole stage, before the t-way split)."""
    s, b, h = model.seq_len, layout.micro_batch, model.hidden
    per_layer = 24 * b * s * h * h + 4 * b * s * s * h
    passes = 4 if model.recompute else 3  # forward, backward (2x), and the recomputed forward
    out = [n * per_layer * passes for n in stage_layers(model, layout.p)]
    out[-1] += 2 * b * s * h * model.vocab * 3
    return out


def stage_seconds(model: ModelSpec, layout: Layout, hw: Hardware) -> tuple[list[float], list[float]]:
    """(t_f, t_b) of one microbatch on each stage from the FLOPs model, tensor-parallel all-reduces included."""
    passes = 4 if model.recompute else 3
    tp = [0.0] * layout.p
    if layout.t > 1:  # two all-reduces forward, two backward per layer, inside the node
        msg = layout.micro_batch * model.seq_len * model.hidden * _bytes(model)
        tp = [n * 2 * 2 * (layout.t - 1) / layout.t * msg / hw.intra_bytes_s for n in stage_layers(model, layout.p)]
    compute = [f / (layout.t * hw.flops) for f in microbatch_flops(model, layout)]
    return [c / passes + x for c, x in zip(compute, tp)], [c * (passes - 1) / passes + x for c, x in zip(compute, tp)]


def exchange_seconds(model: ModelSpec, layout: Layout, hw: Hardware) -> float:
    """One message between neighbouring stages: a microbatch's activations (or their gradient)."""
    msg = layout.micro_batch * model.seq_len * model.hidden * _bytes(model)
    across_nodes = layout.p * layout.t * layout.d > hw.devices_per_node
    return hw.latency_s + msg / (hw.inter_bytes_s if across_nodes else hw.intra_bytes_s)


def iteration_seconds(
    model: ModelSpec, layout: Layout, hw: Hardware, profiled: tuple[list[float], list[float]] | None = None
) -> float:
    """One training iteration (global batch) on the slowest stage. `profiled` gives measured (t_f, t_b)
    per stage instead of the FLOPs model (Pipette profiles them)."""
    m = layout.microbatches(model)
    t_f, t_b = profiled or stage_seconds(model, layout, hw)
    across_nodes = layout.p * layout.t * layout.d > hw.devices_per_node
    grads = max(stage_params(model, layout.p)) / layout.t * _bytes(model)
    dp_bw = hw.inter_bytes_s if across_nodes and layout.d > 1 else hw.intra_bytes_s
    t_dp = 2 * (layout.d - 1) / layout.d * grads / dp_bw if layout.d > 1 else 0.0
    exchange = exchange_seconds(model, layout, hw)
    if model.schedule == "deepspeed":
        return max(ops[-1][1] for ops in lockstep_timeline(layout.p, m, t_f, t_b, exchange)) + t_dp
    compute = max(f + b for f, b in zip(t_f, t_b))
    return (m + layout.p - 1) * compute + math.ceil(m / layout.p) * (layout.p - 1) * 2 * exchange + t_dp
