"""Uniform Progress in the quotes' futures and on the server, step for step: the same rule on random traces, and
the guard's promises there (never a miss on-demand alone would avoid, no on-demand with spot always there)."""

import random
from dataclasses import replace

import numpy as np
import pytest

from broker.domain.model import Tier
from broker.models import futures
from broker.models.futures import Setting
from broker.planning.uniform_progress import Move, Progress, decide

D = 0.2  # changeover delay (hours), as in the paper's evaluation


def simulate(trace: list[bool], total_h=48.0, window_h=72.0, step_h=0.1, cheapest_if_late=False, extends=False):
    """Run one job under the guard on an availability trace; returns (finish hour or None, spot hours, od hours)."""
    on, done, busy, spot_h, od_h = None, 0.0, 0, 0.0, 0.0
    for step, available in enumerate(trace):
        t = step * step_h
        if done >= total_h - 1e-9:
            return t, spot_h, od_h
        if on == Tier.spot and not available:
            on = None  # preempted
        progress = Progress(total_h, done, t, window_h, D, cheapest_if_late or extends, extends=extends)
        move = decide(progress.in_window(on), on, available)
        target = {Move.spot: Tier.spot, Move.on_demand: Tier.on_demand, Move.wait: None}[move]
        if target != on:
            on = target
            busy = round(D / step_h) if target else 0  # a changeover makes no progress
        if on is not None:
            spot_h += step_h * (on == Tier.spot)
            od_h += step_h * (on == Tier.on_demand)
            if busy > 0:
                busy -= 1
            else:
                done += step_h
    return (len(trace) * step_h if done >= total_h - 1e-9 else None), spot_h, od_h


@pytest.mark.parametrize("seed", range(8))
def test_the_guard_never_misses_a_deadline_on_demand_alone_could_meet(seed):
    rng = random.Random(seed)
    trace, available = [], True
    for _ in range(720):  # 72 h in 0.1 h steps: spot comes and goes in runs
        if rng.random() < rng.choice([0.01, 0.05, 0.2]):
            available = not available
        trace.append(available)
    finish, spot_h, od_h = simulate(trace)
    assert finish is not None and finish <= 72 + 1e-6


@pytest.mark.parametrize("seed", range(8))
def test_quotes_simulate_the_same_uniform_progress_the_server_runs(seed):
    """models/futures.py plays Uniform Progress vectorised over futures; on the same trace it must do what
    decide() does step by step: same finish, same hours on spot and on-demand."""
    rng = random.Random(100 + seed)
    trace, available = [], True
    for _ in range(720):
        if rng.random() < rng.choice([0.02, 0.1, 0.3]):
            available = not available
        trace.append(available)
    finish, spot_h, od_h = simulate(trace)
    setting = Setting(48.0, 48.0, (1.0,), 3.0, D, 0.0, None, 72.0, rule="uniform", keeps_progress=True)
    out = futures.simulate(setting, np.array(trace, dtype=bool)[None, None, :], 0.1)
    assert od_h > 1.0 and spot_h > 1.0  # the trace makes it move both ways
    assert (out.finish_h[0], out.spot_h[0], out.od_h[0]) == pytest.approx((finish, spot_h, od_h), abs=1e-6)


def test_quotes_simulate_a_lost_deadline_run_cheapest_as_the_server_runs_it():
    """48 h of work and 40 h to go: lost from the start. Run cheapest it takes spot whenever there is some and
    on-demand in between, the same in the futures as in decide(); the futures price the rest past their horizon
    (the deadline) on on-demand, and it costs less than on-demand to the end."""
    rng = random.Random(7)
    trace, available = [], True
    for _ in range(400):
        if rng.random() < 0.1:
            available = not available
        trace.append(available)
    finish, spot_h, od_h = simulate(trace, window_h=40.0, cheapest_if_late=True)
    assert finish is None and spot_h > 10 and od_h > 5
    available = np.array(trace, dtype=bool)[None, None, :]
    cheapest = Setting(48.0, 48.0, (1.0,), 3.0, D, 0.0, None, 40.0, "uniform", True, cheapest_if_late=True)
    out = futures.simulate(cheapest, available, 0.1)
    assert out.spot_h[0] == pytest.approx(spot_h, abs=1e-6)
    assert out.od_h[0] - od_h == pytest.approx(out.finish_h[0] - 40.0, abs=1e-6) and out.finish_h[0] > 40.0
    soonest = futures.simulate(replace(cheapest, cheapest_if_late=False), available, 0.1)
    assert soonest.spot_h[0] == 0 and out.cost_usd[0] < soonest.cost_usd[0] and soonest.finish_h[0] < out.finish_h[0]


def test_quotes_simulate_a_lost_deadline_run_to_its_second_window_as_the_server_runs_it():
    """`if_late: extend`: 30 h of work in 24 h, lost from the start, so the rule runs it to a second window (48 h):
    ahead of that pace it waits for spot, the same in the futures as in decide(); run cheapest it is never idle
    (on-demand whenever spot is gone)."""
    rng = random.Random(11)
    trace, available = [], True
    for _ in range(480):
        if rng.random() < rng.choice([0.02, 0.1, 0.3]):
            available = not available
        trace.append(available)
    finish, spot_h, od_h = simulate(trace, total_h=30.0, window_h=24.0, extends=True)
    assert finish is not None and 30.0 < finish <= 48.0 and spot_h > 5 and od_h > 1
    available = np.array(trace, dtype=bool)[None, None, :]
    setting = Setting(30.0, 30.0, (1.0,), 3.0, D, 0.0, None, 24.0, "uniform", True, cheapest_if_late=True)
    extended = futures.simulate(replace(setting, late_window_h=48.0), available, 0.1)
    assert (extended.finish_h[0], extended.spot_h[0], extended.od_h[0]) == pytest.approx(
        (finish, spot_h, od_h), abs=1e-6
    )
    cheapest = futures.simulate(setting, available, 0.1)
    idle_h = [o.finish_h[0] - o.spot_h[0] - o.od_h[0] for o in (extended, cheapest)]
    assert idle_h[0] > 1.0 and idle_h[1] == pytest.approx(0.0, abs=1e-6)


def test_with_spot_always_there_the_guard_never_pays_on_demand():
    finish, spot_h, od_h = simulate([True] * 720)
    assert od_h == 0 and finish == pytest.approx(48 + D, abs=0.11)


def test_with_no_spot_at_all_the_job_still_finishes_on_demand():
    finish, spot_h, od_h = simulate([False] * 720)
    assert spot_h == 0 and finish is not None and finish <= 72
