"""The GPT-style model of the bubble examples, without DeepSpeed: its layers, its data and its loss, and the
layers each pipeline stage holds. train_gpt.py trains it with DeepSpeed's pipeline engine; bench/stage_replay.py
runs one stage of it alone on a GPU."""

from __future__ import annotations

import os

import torch
from torch import nn

# The model's shape; bench/parallel.py varies it through the environment.
VOCAB, SEQ, HIDDEN, HEADS, LAYERS = (
    int(os.environ.get(f"GPT_{k}", v))
    for k, v in (("VOCAB", 256), ("SEQ", 32), ("HIDDEN", 64), ("HEADS", 4), ("LAYERS", 8))
)


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(SEQ, HIDDEN)

    def forward(self, ids):
        return self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            HIDDEN, HEADS, 4 * HIDDEN, dropout=0.0, batch_first=True, norm_first=True
        )
        self.mask = nn.Transformer.generate_square_subsequent_mask(SEQ)

    def forward(self, x):
        return self.layer(x, src_mask=self.mask.to(x.device), is_causal=True)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.out = nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB)

    def forward(self, x):
        return self.out(self.norm(x))


def loss_fn(logits, labels):
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def batches(micro_batch: int, seed: int):
    """Synthetic next-token data: sequences of a noisy counting pattern (learnable, deterministic)."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        start = torch.randint(0, VOCAB, (micro_batch, 1), generator=generator)
        ids = (start + torch.arange(SEQ + 1)) % VOCAB
        yield ids[:, :-1], ids[:, 1:]


def layers() -> list[type[nn.Module]]:
    """The model as DeepSpeed's PipelineModule lays it out: embedding, LAYERS blocks, head."""
    return [Embed] + [Block] * LAYERS + [Head]


def stage_layers(stage: int, stages: int) -> list[type[nn.Module]]:
    """The layers `stage` holds under DeepSpeed's uniform partition (equal counts, the first stages one more)."""
    every = layers()
    size, extra = divmod(len(every), stages)
    bounds = [s * size + min(s, extra) for s in range(stages + 1)]
    return every[bounds[stage] : bounds[stage + 1]]
