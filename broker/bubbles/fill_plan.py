"""PipeFill's fill plan (Algorithm 1): how a fill job's work packs into a stage's bubbles, and the
throughput it gets there.

The fill job is linearised into nodes (time, memory): steps, or layers of a step. Bubbles
repeat every iteration: durations B[i] and free memories M[i]. Replicate the node list while
it is shorter than all the bubbles together, then walk the bubbles cyclically, packing the next
nodes into bubble i while they fit its time and memory. A node that fits no bubble makes the
job infeasible here (the paper's loop would never end). Pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass

EPS_S = 1e-9  # three 0.1 s steps fit a 0.3 s window, though 0.1 + 0.1 + 0.1 > 0.3 in floating point


@dataclass(frozen=True)
class Node:
    time_s: float
    memory_bytes: int


def fill_plan(bubbles: list[tuple[float, int]], nodes: list[Node]) -> list[list[int]] | None:
    """Partitions of the (replicated) node list, one per bubble visited in order; None if a node fits no bubble."""
    if not nodes or not bubbles:
        return None
    if any(n.time_s <= 0 for n in nodes):
        raise ValueError("nodes: every node needs a time > 0 s (profile the fill job's steps first)")
    if any(not any(n.time_s <= d and n.memory_bytes <= m for d, m in bubbles) for n in nodes):
        return None
    total_bubble = sum(d for d, _ in bubbles)
    unit = sum(n.time_s for n in nodes)
    copies = 1
    while (copies + 1) * unit < total_bubble:
        copies += 1
    work = list(range(len(nodes))) * copies
    partitions, i, at = [], 0, 0
    while at < len(work):
        duration, memory = bubbles[i % len(bubbles)]
        part, used = [], 0.0
        while (
            at < len(work)
            and used + nodes[work[at]].time_s <= duration + EPS_S
            and nodes[work[at]].memory_bytes <= memory
        ):
            used += nodes[work[at]].time_s
            part.append(work[at])
            at += 1
        partitions.append(part)
        i += 1
    return partitions


def fill_throughput(bubbles: list[tuple[float, int]], iteration_s: float, nodes: list[Node], cycles: int = 64) -> float:
    """The fill job's long-run speed in the bubbles as a share of its exclusive speed (0 when it fits nowhere):
    its nodes streamed through `cycles` iterations of bubbles by the plan's packing rule."""
    if fill_plan(bubbles, nodes) is None:
        return 0.0
    done, k = 0.0, 0
    for _ in range(cycles):
        for duration, memory in bubbles:
            used = 0.0
            while used + nodes[k].time_s <= duration + EPS_S and nodes[k].memory_bytes <= memory:
                used += nodes[k].time_s
                k = (k + 1) % len(nodes)
            done += used
    return done / (cycles * iteration_s)


def best_configuration(
    bubbles: list[tuple[float, int]], iteration_s: float, configurations: dict[str, list[Node]]
) -> tuple[str, float] | None:
    """The configuration (micro-batch split, offload, checkpointing ...) that does the most work in the bubbles,
    with its fill throughput; None when none fits. Each configuration's nodes are one step of the same work, so
    they rank by steps per second (throughput over the step's exclusive time), not by the share of time used."""
    scored = [(name, fill_throughput(bubbles, iteration_s, nodes), nodes) for name, nodes in configurations.items()]
    scored = [s for s in scored if s[1] > 0]
    if not scored:
        return None
    name, share, _ = max(scored, key=lambda s: s[1] / sum(n.time_s for n in s[2]))
    return name, share
