"""A stop that lands while a child process starts (inside Popen, after the fork) waits until the child is kept, so the
clean-up that follows stops it: a SIGTERM'd backtest once left its scratch redis-server running. A stop in a HiGHS
solve ends it early, not at its time limit (domain/stops.py, planning/highs.py)."""

import os
import random
import signal
import subprocess
import threading
import time

import highspy
import pulp
import pytest

from broker.agents.provision import LocalProvisioner
from broker.domain.stops import stops_held
from broker.planning import highs
from broker.store import embedded


def interrupt(signum, frame):
    raise KeyboardInterrupt  # as the CLI's commands take a SIGTERM (app/cli/common.stop_signals_as_ctrl_c)


@pytest.fixture
def sigterm_interrupts():
    previous = signal.signal(signal.SIGTERM, interrupt)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def stopped_as_it_starts(monkeypatch):
    """Popen that starts the child, then takes a SIGTERM before it returns; the children it started."""
    started, real = [], subprocess.Popen

    def popen_then_stopped(*args, **kwargs):
        process = real(*args, **kwargs)
        started.append(process)
        os.kill(os.getpid(), signal.SIGTERM)
        return process

    monkeypatch.setattr(subprocess, "Popen", popen_then_stopped)
    yield started
    for process in started:
        process.kill()
        process.wait()


def test_a_stop_held_acts_once_the_block_ends_and_the_handlers_are_back(sigterm_interrupts):
    done = []
    with pytest.raises(KeyboardInterrupt), stops_held() as held:
        os.kill(os.getpid(), signal.SIGTERM)
        done.append(list(held))
        assert done == [[signal.SIGTERM]]
    assert signal.getsignal(signal.SIGTERM) is interrupt
    with stops_held() as held:  # no stop: nothing raised after
        done.append(list(held))
    assert done == [[signal.SIGTERM], []]


def test_a_scratch_server_stopped_as_it_starts_is_stopped_not_left_running(sigterm_interrupts, stopped_as_it_starts):
    with pytest.raises(KeyboardInterrupt), embedded.scratch():
        pytest.fail("the stop came before the server was up")
    (server,) = stopped_as_it_starts
    assert server.poll() is not None  # it ran on, its parent gone


def test_a_local_agent_stopped_as_it_starts_is_kept_for_stop_all(
    sigterm_interrupts, stopped_as_it_starts, catalog, tmp_path
):
    provisioner = LocalProvisioner("redis://127.0.0.1:1/0", str(tmp_path / "ckpt"), tmp_path / "runs")
    with pytest.raises(KeyboardInterrupt):
        provisioner.start("spot-1", catalog.offers[0])
    (agent,) = stopped_as_it_starts
    assert provisioner.agents == {"spot-1": agent}
    provisioner.stop_all(timeout_s=10)
    assert agent.poll() is not None


def hard_knapsack() -> pulp.LpProblem:
    """A MILP that HiGHS does not prove in 40 s on this machine (40 knapsack rows over 100 binaries)."""
    rng = random.Random(0)
    prob = pulp.LpProblem("hard", pulp.LpMinimize)
    x = [prob.add_variable(f"x{i}", cat=pulp.LpBinary) for i in range(100)]
    prob += -pulp.lpSum(rng.randint(10, 100) * v for v in x)
    for _ in range(40):
        weights = [rng.randint(10, 100) for _ in x]
        prob += pulp.lpSum(w * v for w, v in zip(weights, x)) <= sum(weights) // 3
    return prob


def stopped_after(seconds: float, solve) -> float:
    """Seconds until `solve` ends in the stop a SIGTERM `seconds` in raises."""
    threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGTERM)).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        solve()
    return time.monotonic() - started


def test_a_stop_ends_a_pulp_highs_solve_early_then_acts(sigterm_interrupts):
    """It waited out the time limit: a backtest stopped in its bounds ran on up to a minute."""
    assert stopped_after(0.5, lambda: highs.solve(hard_knapsack(), timeLimit=60)) < 10


def test_a_stop_ends_a_highs_run_early_then_acts(sigterm_interrupts, tmp_path):
    """As costslo runs its LP (a HiGHS kept across pricing passes)."""
    hard_knapsack().writeMPS(str(tmp_path / "hard.mps"))
    solver = highspy.Highs()
    solver.setOptionValue("output_flag", False)
    solver.setOptionValue("time_limit", 60.0)
    solver.readModel(str(tmp_path / "hard.mps"))
    assert stopped_after(0.5, lambda: highs.run(solver)) < 10
