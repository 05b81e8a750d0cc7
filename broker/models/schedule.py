"""Pipeline bubbles: when each stage of a pipeline-parallel training iteration sits idle.

p stages, m microbatches, v model chunks per stage (interleaved 1F1B), forward and backward
times per stage (lists: stages may differ; a chunk takes 1/v of its stage's time). Four
schedules, each as the order of operations on a stage:
- gpipe: all forwards, then all backwards;
- 1f1b: min(p - s - 1, m) warm-up forwards, then one forward and one backward in turn, then the
  remaining backwards (PipeDream-flush; the order DeepSpeed's TrainSchedule runs);
- interleaved: Megatron's interleaved 1F1B over v chunks (m a multiple of p);
- deepspeed: the 1f1b order timed as DeepSpeed's engine runs it, in lock-step (`lockstep_timeline`).
`timeline` places every operation as early as its dependencies allow (a forward needs the same
microbatch's forward on the previous stage, a backward the next stage's backward and its own
forward; a message between stages takes `exchange_s`); the gaps are the bubbles. With equal
stages the windows have closed forms (`closed_form`, from the PipeFill and FreeRide papers):
fill-drain s (t_f + t_b), and fwd-bwd (p - s - 1)(t_f + t_b) for GPipe, (p - s - 1) t_b +
max(0, p - s - m) t_f for 1F1B.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved", "deepspeed")


@dataclass(frozen=True)
class Op:
    kind: str  # "F" or "B"
    microbatch: int
    chunk: int = 0


@dataclass(frozen=True)
class BubbleWindow:
    """An idle window of one stage within an iteration; offset from the iteration's start."""

    offset_s: float
    duration_s: float
    kind: str  # "fill-drain" (between iterations), "fwd-bwd" (before the first backward), "scattered"


def op_order(schedule: str, p: int, m: int, stage: int, v: int = 1) -> list[Op]:
    """The order in which `stage` runs its forwards and backwards in one iteration."""
    if schedule == "gpipe":
        return [Op("F", i) for i in range(m)] + [Op("B", i) for i in range(m)]
    if schedule in ("1f1b", "deepspeed"):
        warmup = min(p - stage - 1, m)
        ops = [Op("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            ops += [Op("F", warmup + i), Op("B", i)]
        return ops + [Op("B", i) for i in range(m - warmup, m)]
    if schedule == "interleaved":
        return _interleaved(p, m, stage, v)
    raise ValueError(f"schedule: {schedule!r} is not one of {', '.join(SCHEDULES)}")


def _interleaved(p: int, m: int, stage: int, v: int) -> list[Op]:
    """Megatron-LM's interleaved 1F1B order (forward_backward_pipelining_with_interleaving)."""
    if m % p:
        raise ValueError(f"microbatches: interleaved 1F1B needs a multiple of the {p} stages, got {m}")
    total = m * v

    def forward(k: int) -> Op:
        return Op("F", (k // (p * v)) * p + k % p, (k // p) % v)

    def backward(k: int) -> Op:
        return Op("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    warmup = total if m == p else min((p - stage - 1) * 2 + (v - 1) * p, total)
    ops = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        ops += [forward(warmup + k), backward(k)]
    return ops + [backward(k) for k in range(total - warmup, total)]


def _dependency(op: Op, stage: int, p: int, v: int) -> tuple[int, Op] | None:
    """The operation on another stage that must finish before `op` on `stage` can start."""
    if op.kind == "F":
        if stage > 0:
            return stage - 1, op
        return (p - 1, Op("F", op.microbatch, op.chunk - 1)) if op.chunk > 0 else None
    if stage < p - 1:
        return stage + 1, op
    return (0, Op("B", op.microbatch, op.chunk + 1)) if op.chunk < v - 1 else (stage, Op("F", op.microbatch, op.chunk))


def _check_times(p: int, t_f: list[float], t_b: list[float]) -> None:
    if len(t_f) != p or len(t_b) != p:
        raise ValueError(f"t_f and t_b: give one time per stage ({p}), got {len(t_f)} and {len(t_b)}")


def timeline(
    schedule: str, p: int, m: int, t_f: list[float], t_b: list[float], v: int = 1, exchange_s: float = 0.0
) -> list[list[tuple[float, float, Op]]]:
    """(start, end, op) of every operation on every stage, each as early as its dependencies allow."""
    if schedule == "deepspeed":
        return lockstep_timeline(p, m, t_f, t_b, exchange_s)
    _check_times(p, t_f, t_b)
    orders = [op_order(schedule, p, m, s, v) for s in range(p)]
    done: dict[tuple[int, Op], float] = {}
    placed: list[list[tuple[float, float, Op]]] = [[] for _ in range(p)]
    cursor, free = [0] * p, [0.0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            while cursor[s] < len(orders[s]):
                op = orders[s][cursor[s]]
                dep = _dependency(op, s, p, v)
                if dep is not None and dep not in done:
                    break
                start = max(free[s], 0.0 if dep is None else done[dep] + (exchange_s if dep[0] != s else 0.0))
                end = start + (t_f[s] if op.kind == "F" else t_b[s]) / v
                done[(s, op)], free[s] = end, end
                placed[s].append((start, end, op))
                cursor[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"{schedule}: operations wait on each other (p={p}, m={m}, v={v})")
    return placed


def deepspeed_step(p: int, m: int, stage: int, step: int) -> Op | None:
    """What DeepSpeed's TrainSchedule runs on `stage` in `step`: a forward when step and stage have the same
    parity, else a backward; None in the fill and drain steps where the microbatch does not exist."""
    if (step - stage) % 2 == 0:
        op = Op("F", (step - stage) // 2)
    else:
        op = Op("B", (step + stage + 1) // 2 - p)
    return op if 0 <= op.microbatch < m else None


def lockstep_timeline(
    p: int, m: int, t_f: list[float], t_b: list[float], exchange_s: float = 0.0
) -> list[list[tuple[float, float, Op]]]:
    """DeepSpeed's TrainSchedule as it runs: 2 (m + p - 1) steps, one forward or backward per stage and step.
    At the start of a step, a stage running a backward swaps with the next stage (running a forward) the
    gradient and activation of their previous step, with blocking sends and receives: both wait for the
    slower and both pay both messages. With free messages this is dataflow 1F1B's timeline; each message
    costs it twice what dataflow 1F1B pays on its critical path."""
    _check_times(p, t_f, t_b)
    end, placed = [0.0] * p, [[] for _ in range(p)]
    for step in range(2 * (m + p - 1)):
        ops = [deepspeed_step(p, m, s, step) for s in range(p)]
        start = list(end)
        for s in range(step % 2 == 0, p - 1, 2):  # stage s backward, s + 1 forward: (step - s) odd
            messages = (ops[s] is not None) + (ops[s + 1] is not None)
            if messages:
                start[s] = start[s + 1] = max(end[s], end[s + 1]) + messages * exchange_s
        for s, op in enumerate(ops):
            end[s] = start[s]
            if op is not None:
                end[s] += t_f[s] if op.kind == "F" else t_b[s]
                placed[s].append((start[s], end[s], op))
    return placed


def bubble_windows(
    schedule: str,
    p: int,
    m: int,
    t_f: list[float],
    t_b: list[float],
    v: int = 1,
    min_s: float = 0.0,
    exchange_s: float = 0.0,
) -> tuple[float, list[list[BubbleWindow]]]:
    """(iteration period, each stage's idle windows of at least min_s) for back-to-back iterations."""
    placed = timeline(schedule, p, m, t_f, t_b, v, exchange_s)
    period = max(ops[-1][1] for ops in placed)
    stages = []
    for ops in placed:
        windows = []
        first_backward = next(i for i, (_, _, op) in enumerate(ops) if op.kind == "B")
        for i in range(1, len(ops)):
            gap = ops[i][0] - ops[i - 1][1]
            if gap > 1e-12:
                windows.append(BubbleWindow(ops[i - 1][1], gap, "fwd-bwd" if i == first_backward else "scattered"))
        wrap = ops[0][0] + period - ops[-1][1]  # this iteration's drain and the next one's fill, back to back
        if wrap > 1e-12:
            windows.append(BubbleWindow(ops[-1][1], wrap, "fill-drain"))
        stages.append([w for w in windows if w.duration_s >= min_s])
    return period, stages


def bubble_fraction(period: float, windows: list[BubbleWindow]) -> float:
    """Share of the iteration a stage is idle."""
    return sum(w.duration_s for w in windows) / period


def closed_form(schedule: str, p: int, m: int, t_f: float, t_b: float) -> tuple[float, list[dict[str, float]]]:
    """(period, per stage {kind: duration}) for equal stages, from the papers' formulas."""
    period = (m + p - 1) * (t_f + t_b)
    stages = []
    for s in range(p):
        if schedule == "gpipe":
            fwd_bwd = (p - s - 1) * (t_f + t_b)
        elif schedule == "1f1b":
            fwd_bwd = (p - s - 1) * t_b + max(0, p - s - m) * t_f
        else:
            raise ValueError(f"schedule: closed forms cover gpipe and 1f1b, not {schedule!r}")
        stages.append({"fill-drain": s * (t_f + t_b), "fwd-bwd": fwd_bwd})
    return period, stages
