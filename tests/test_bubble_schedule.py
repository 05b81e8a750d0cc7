"""The bubble model against the schedules themselves: DeepSpeed's TrainSchedule instruction streams, an
event-driven simulation (message passing between stages) written independently of `timeline`, and a
rendezvous run of those streams (blocking sends and receives, as DeepSpeed's engine does them)."""

import heapq
import random

import pytest
from deepspeed.runtime.pipe.schedule import (
    BackwardPass,
    ForwardPass,
    RecvActivation,
    RecvGrad,
    SendActivation,
    SendGrad,
    TrainSchedule,
)

from broker.models.schedule import Op, bubble_fraction, bubble_windows, closed_form, op_order, timeline


def deepspeed_order(p: int, m: int, stage: int) -> list[Op]:
    """The forwards and backwards DeepSpeed's TrainSchedule runs on a stage, in order (microbatches counted)."""
    ops, forwards, backwards = [], 0, 0
    for step in TrainSchedule(micro_batches=m, stages=p, stage_id=stage).steps():
        for instruction in step:
            if isinstance(instruction, ForwardPass):
                ops.append(Op("F", forwards))
                forwards += 1
            elif isinstance(instruction, BackwardPass):
                ops.append(Op("B", backwards))
                backwards += 1
    return ops


def simulate(orders: list[list[Op]], t_f, t_b, v=1) -> list[list[tuple[float, float, Op]]]:
    """Discrete events: a stage runs its next op once the message it needs has arrived (activations flow
    down the pipeline, gradients up; with chunks the last stage feeds the first); no shared clock sweep."""
    p = len(orders)
    arrived: set[tuple[int, Op]] = set()  # (receiving stage, op the message enables), once delivered
    events = [(0.0, 1, s, 0, None) for s in range(p)]  # (time, 0 = delivery / 1 = wake-up, stage, sequence, message)
    sequence = 0
    free, cursor, placed = [0.0] * p, [0] * p, [[] for _ in range(p)]
    while events:
        now, what, s, _, message = heapq.heappop(events)
        if what == 0:
            arrived.add((s, message))
        if cursor[s] >= len(orders[s]) or free[s] > now:
            continue
        op = orders[s][cursor[s]]
        needs = not (op.kind == "F" and s == 0 and op.chunk == 0)
        if needs and (s, op) not in arrived:
            continue  # woken again when the message is delivered
        end = now + (t_f[s] if op.kind == "F" else t_b[s]) / v
        placed[s].append((now, end, op))
        cursor[s], free[s] = cursor[s] + 1, end
        sequence += 1
        heapq.heappush(events, (end, 1, s, sequence, None))
        for target, enabled in _messages(op, s, p, v):
            sequence += 1
            heapq.heappush(events, (end, 0, target, sequence, enabled))
    return placed


def _messages(op: Op, s: int, p: int, v: int):
    if op.kind == "F":
        if s < p - 1:
            yield s + 1, op
        elif op.chunk < v - 1:
            yield 0, Op("F", op.microbatch, op.chunk + 1)
        else:
            yield s, Op("B", op.microbatch, op.chunk)  # the last stage's own backward follows its forward
    elif s > 0:
        yield s - 1, op
    elif op.chunk > 0:
        yield p - 1, Op("B", op.microbatch, op.chunk - 1)


def random_stages(rng: random.Random, min_p: int):
    """p stages, m microbatches and unequal forward and backward times."""
    p, m = rng.randint(min_p, 6), rng.randint(1, 10)
    return p, m, [rng.uniform(0.5, 2.0) for _ in range(p)], [rng.uniform(1.0, 4.0) for _ in range(p)]


@pytest.mark.parametrize("p", [2, 3, 4, 5])
@pytest.mark.parametrize("m", [1, 2, 4, 7, 8])
def test_1f1b_order_is_what_deepspeeds_train_schedule_runs(p, m):
    for stage in range(p):
        assert op_order("1f1b", p, m, stage) == deepspeed_order(p, m, stage)


@pytest.mark.parametrize("seed", range(6))
def test_timeline_equals_the_event_simulation_of_deepspeeds_streams_with_unequal_stages(seed):
    rng = random.Random(seed)
    p, m, t_f, t_b = random_stages(rng, min_p=2)
    expected = simulate([deepspeed_order(p, m, s) for s in range(p)], t_f, t_b)
    assert _rounded(timeline("1f1b", p, m, t_f, t_b)) == _rounded(expected)


def run_blocking(p: int, m: int, t_f, t_b, exchange_s: float) -> list[list[tuple[float, float, Op]]]:
    """Each stage runs its TrainSchedule instructions in order; a send and the neighbour's matching receive
    finish together, exchange_s after the later of the two reaches it (gloo/NCCL send and recv block)."""
    streams = [
        [i for step in TrainSchedule(micro_batches=m, stages=p, stage_id=s).steps() for i in step] for s in range(p)
    ]
    partner = {
        SendActivation: (1, RecvActivation),
        RecvActivation: (-1, SendActivation),
        SendGrad: (-1, RecvGrad),
        RecvGrad: (1, SendGrad),
    }
    clock, cursor, counts = [0.0] * p, [0] * p, [{"F": 0, "B": 0} for _ in range(p)]
    placed = [[] for _ in range(p)]
    while any(cursor[s] < len(streams[s]) for s in range(p)):
        moved = False
        for s in range(p):
            if cursor[s] >= len(streams[s]):
                continue
            instruction = streams[s][cursor[s]]
            if type(instruction) in partner:
                offset, counterpart = partner[type(instruction)]
                other = s + offset
                if cursor[other] >= len(streams[other]) or type(streams[other][cursor[other]]) is not counterpart:
                    continue  # blocked until the neighbour reaches its half
                clock[s] = clock[other] = max(clock[s], clock[other]) + exchange_s
                cursor[other] += 1
            elif isinstance(instruction, (ForwardPass, BackwardPass)):
                kind = "F" if isinstance(instruction, ForwardPass) else "B"
                start, clock[s] = clock[s], clock[s] + (t_f[s] if kind == "F" else t_b[s])
                placed[s].append((start, clock[s], Op(kind, counts[s][kind])))
                counts[s][kind] += 1
            cursor[s] += 1
            moved = True
        assert moved, "the instruction streams deadlocked"
    return placed


@pytest.mark.parametrize("seed", range(8))
def test_deepspeed_lockstep_timeline_equals_a_blocking_run_of_its_instruction_streams(seed):
    rng = random.Random(seed)
    p, m, t_f, t_b = random_stages(rng, min_p=1)
    exchange = rng.choice([0.0, 0.05, 0.3])
    expected = run_blocking(p, m, t_f, t_b, exchange)
    assert _rounded(timeline("deepspeed", p, m, t_f, t_b, exchange_s=exchange)) == _rounded(expected)


def test_blocking_exchanges_cost_both_neighbours_so_deepspeed_is_slower_than_dataflow_1f1b():
    t_f, t_b = [1.0, 1.0], [2.0, 2.0]
    free = [timeline(schedule, 2, 8, t_f, t_b) for schedule in ("1f1b", "deepspeed")]
    assert _rounded(free[0]) == _rounded(free[1])  # free messages: the lock-step loses nothing
    period = max(ops[-1][1] for ops in free[0])
    dataflow, lockstep = (
        max(ops[-1][1] for ops in timeline(s, 2, 8, t_f, t_b, exchange_s=0.25)) for s in ("1f1b", "deepspeed")
    )
    assert lockstep - period == pytest.approx(2 * (dataflow - period))  # an exchange's two messages hold both stages


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("interleaved", 2), ("interleaved", 3)])
def test_gpipe_and_interleaved_timelines_equal_the_event_simulation(schedule, v):
    rng = random.Random(11)
    p, m = 4, 8
    t_f = [rng.uniform(0.5, 2.0) for _ in range(p)]
    t_b = [rng.uniform(1.0, 4.0) for _ in range(p)]
    orders = [op_order(schedule, p, m, s, v) for s in range(p)]
    assert _rounded(timeline(schedule, p, m, t_f, t_b, v)) == _rounded(simulate(orders, t_f, t_b, v))


def _rounded(placed):
    return [[(round(a, 9), round(b, 9), op) for a, b, op in ops] for ops in placed]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (4, 2), (4, 4), (4, 8), (8, 16)])
def test_equal_stages_match_the_papers_closed_forms(schedule, p, m):
    period, stages = bubble_windows(schedule, p, m, [1.0] * p, [2.0] * p)
    expected_period, expected = closed_form(schedule, p, m, 1.0, 2.0)
    assert period == pytest.approx(expected_period)
    for s, windows in enumerate(stages):
        by_kind = {}
        for w in windows:
            by_kind[w.kind] = by_kind.get(w.kind, 0.0) + w.duration_s
        assert by_kind.get("fill-drain", 0.0) == pytest.approx(expected[s]["fill-drain"])
        assert by_kind.get("fwd-bwd", 0.0) == pytest.approx(expected[s]["fwd-bwd"])
        assert bubble_fraction(period, windows) == pytest.approx((p - 1) / (m + p - 1))
        if schedule == "1f1b":  # the short gaps 1F1B leaves between forwards and backwards
            assert by_kind.get("scattered", 0.0) == pytest.approx(min(p - s - 1, m - 1) * 1.0)


@pytest.mark.parametrize("v,m", [(2, 4), (2, 8), (4, 8)])
def test_interleaving_shrinks_the_bubble_to_the_megatron_fraction(v, m):
    p = 4
    period, stages = bubble_windows("interleaved", p, m, [1.0] * p, [2.0] * p, v=v)
    for windows in stages:
        assert bubble_fraction(period, windows) == pytest.approx((p - 1) / (v * m + p - 1))


def test_freerides_four_stage_rates_and_the_last_stage_has_one_long_window():
    rates = [bubble_fraction(*_stage0(m)) for m in (4, 8)]
    assert rates == pytest.approx([3 / 7, 3 / 11])  # FreeRide measured 42.4% and 26.2%
    _, stages = bubble_windows("1f1b", 4, 4, [1.0] * 4, [2.0] * 4)
    assert [w.kind for w in stages[3]] == ["fill-drain"]


def _stage0(m):
    period, stages = bubble_windows("1f1b", 4, m, [1.0] * 4, [2.0] * 4)
    return period, stages[0]


def test_bad_shapes_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="t_f and t_b"):
        timeline("1f1b", 4, 4, [1.0] * 3, [2.0] * 4)
    with pytest.raises(ValueError, match="microbatches"):
        op_order("interleaved", 4, 6, 0, v=2)
    with pytest.raises(ValueError, match="schedule"):
        op_order("zero-bubble", 4, 4, 0)
