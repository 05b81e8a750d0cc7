"""A stop that lands while a child process starts (inside Popen, after the fork) waits until the child is kept, so the
clean-up that follows stops it: a SIGTERM'd backtest once left its scratch redis-server running (store/spawn.py)."""

import os
import signal
import subprocess

import pytest

from broker.agents.provision import LocalProvisioner
from broker.store import embedded
from broker.store.spawn import stops_held


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
    with pytest.raises(KeyboardInterrupt), stops_held():
        os.kill(os.getpid(), signal.SIGTERM)
        done.append("kept")
    assert done == ["kept"] and signal.getsignal(signal.SIGTERM) is interrupt
    with stops_held():  # no stop: nothing raised after
        done.append("again")
    assert done == ["kept", "again"]


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
