"""The fill executor: runs a fill job one step at a time inside a stage's bubbles (FreeRide's side task).

A fill job implements FillTask (SUBMITTED -create-> CREATED -init-> PAUSED -run steps-> PAUSED, and
-stop-> STOPPED). It lives in a child process so it can be killed: on each window signal the
executor tells it when the window ends; the task runs a step only while the time left exceeds its
measured step time, then pauses and reports. The process's first whole step is a warm-up, timed but not
planned with: a GPU's first kernels and the allocator's growth made it 13-28 ms against 5 ms after it on
an H200 (bench/results/bubbles.md), and planning with it kept every later step out of windows shorter
than it. A task that has not paused by the window's end plus a grace period is SIGKILLed and restarted
from its last state. On CUDA the child caps its own memory to the window's free memory. The task's state
is checkpointed through the same store as every job (`checkpoint`), so it can move to spot or on-demand
and resume there (`run_standalone`).
"""

from __future__ import annotations

import importlib
import multiprocessing
import multiprocessing.forkserver
import os
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path

from broker.bubbles.step_time import USUAL_STEPS, StepTime

START_TIMEOUT_S = 120.0


class FillTask:
    """The step interface a fill job implements."""

    def create(self, config: dict) -> None:
        """Build the job (model, data) from its configuration."""

    def init(self) -> None:
        """Move what the steps need to the device."""

    def run_step(self) -> None:
        """One batch."""
        raise NotImplementedError

    def pause(self) -> None:
        """Stop touching the device until the next window (e.g. synchronise)."""

    def stop(self) -> None:
        """Release everything."""

    def configurations(self) -> dict[str, dict]:
        """Other ways to run the same steps (the batch split into micro-batches, say), by name: config overrides
        for create. The fill agent times each inside the windows and keeps the one that does the most work."""
        return {}

    def micro_steps(self) -> int:
        """run_step calls per step of work in the current configuration (steps_done counts whole steps)."""
        return 1

    def steps_done(self) -> int:
        raise NotImplementedError

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError


def load_task(path: str) -> FillTask:
    """`module:Class` -> a new FillTask."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)()


def fill_processes():
    """Where fill processes come from: a fork server that imported torch once, so that a fill process starts in
    milliseconds rather than a new interpreter's seconds of imports (1.4 s of torch on a 2-core CPU, and a fill job
    waits for it in every start, restart and stage). The server never touches CUDA: each child starts its own
    context, as a spawned one did, and the training process it serves is never forked."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch"])
    return context


def warm_fill_processes() -> None:
    """Start the fork server now; its imports run in the background, so the first fill job does not wait for them."""
    fill_processes()
    multiprocessing.forkserver.ensure_running()


def stage_device() -> int | None:
    """The GPU this thread computes on, where the process has started CUDA (a training stage): its fill process works
    on the same one. A child starts on GPU 0, so on a node of several GPUs every stage's fill job would otherwise run
    beside the first stage, under a memory cap measured on another GPU. CUDA's current device is a thread's: read it
    on the thread that trains."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_device()


def _serve(
    task_path: str, config: dict, state: dict | None, conn, memory_fraction: float | None, device: int | None = None
) -> None:
    """The child: one task at a time, commands from the executor, one reply per command. `reconfigure` builds the
    task again in this process from a configuration and a state: no new interpreter, no new CUDA context (on an
    H200 a fill process took seconds to start, and the agent times several configurations)."""
    if memory_fraction is not None or device is not None:
        import torch

        if torch.cuda.is_available():
            if device is not None:
                torch.cuda.set_device(device)  # the stage's GPU: what "cuda" in the task's configuration means
            if memory_fraction is not None:  # an OOM hits the fill job, not the main job
                torch.cuda.set_per_process_memory_fraction(memory_fraction)
    task = _ready(conn, task_path, config, state)
    if task is None:
        return
    step = StepTime(  # refined as steps run
        float(config.get("step_s", 0.0)), config.get("usual_s", ()), float(config.get("warm_up_s", 0.0))
    )
    warm_up = task.micro_steps()  # calls of the first whole step: timed, not planned with
    while True:
        command, arg = conn.recv()
        if command == "run":
            steps = []
            while time.monotonic() + step.next_s(warm_up > 0) < arg:
                began = time.monotonic()
                task.run_step()
                ended = time.monotonic()
                steps.append((began, ended))
                warm_up -= 1
                if warm_up < 0:
                    step.timed(ended - began)
            step.window_ended(len(steps))
            task.pause()
            conn.send(("paused", {"steps": steps, "done": task.steps_done(), "peak_bytes": _peak_bytes()}))
        elif command == "state":
            conn.send(("state", _pack(task.state_dict())))
        elif command == "reconfigure":
            config, packed = arg
            task.stop()
            task = None
            _reset_peak()  # the next configuration's memory peak is its own
            task = _ready(conn, task_path, config, _unpack(packed) if packed is not None else None)
            if task is None:
                return
            step, warm_up = StepTime(float(config.get("step_s", 0.0))), task.micro_steps()
        elif command == "stop":
            task.stop()
            conn.send(("stopped", _pack(task.state_dict())))
            return


def _ready(conn, task_path: str, config: dict, state: dict | None) -> FillTask | None:
    """The task built from its configuration and state, announced with what the executor needs of it; None (and
    why, in one line) when it cannot be built."""
    try:
        task = load_task(task_path)
        task.create(config)
        if state is not None:
            task.load_state_dict(state)
        task.init()
    except Exception as err:  # a bad configuration or task path: the executor says why, in one line
        conn.send(("failed", f"{type(err).__name__}: {err}"))
        return None
    conn.send(("ready", {"configurations": task.configurations(), "micro_steps": task.micro_steps()}))
    return task


def _peak_bytes() -> int:
    """The most memory the task has held: the GPU allocator's peak on CUDA, else the process's peak resident set
    (since the last reset where Linux's /proc allows one)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated())
    try:
        status = Path("/proc/self/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) * 1024
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def _reset_peak() -> None:
    """Start the peak over from what the process holds now (the previous task released)."""
    import gc

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc keeps freed memory resident; give it back first
    except (OSError, AttributeError):
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
    except OSError:
        pass


def _pack(state: dict) -> bytes:
    """The state as bytes: tensors sent through a pipe as they are share memory with a process that may be gone."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _unpack(data: bytes) -> dict:
    """The state in host memory, wherever the task held it: the executor lives in the training stage's process, so
    a fill job's tensors restored on their GPU would take the main job's memory; the child moves them to the device
    itself when it builds the task."""
    import io

    import torch

    return torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")


class FillExecutor:
    """One stage's executor: a fill task in a child process, driven by window signals."""

    def __init__(self, task_path: str, config: dict, grace_s: float = 0.05, device: int | None = None):
        self.task_path, self.config, self.grace_s = task_path, config, grace_s
        self.device = device if device is not None else stage_device()  # the GPU its fill process uses
        self.submitted = dict(config)  # what configurations override
        self.context = fill_processes()
        self.state: dict | None = None  # the last state taken from the task (restarts resume here)
        self.steps: list[tuple[float, float, float]] = []  # (start, end, window end) of every step
        self.kills = 0
        self.process = None
        self.memory_fraction: float | None = None
        self.configurations: dict[str, dict] = {}  # the task's other configurations (FillTask.configurations)
        self.micro_steps = 1
        self.peak_bytes = 0  # the task's peak memory in its current process
        self.longest_step_s = 0.0  # in the current configuration
        self.warm_up_s = 0.0  # the longest call of a process's first whole step seen (a restart plans with it)
        self.calls = 0  # the calls the current task has reported (since its process started or it was rebuilt)
        self.trying = False  # the current configuration is a trial (reconfigure)

    def start(self, memory_fraction: float | None = None) -> None:
        """Start the task's process; a restart keeps the memory cap of the first start unless given another."""
        self.memory_fraction = memory_fraction if memory_fraction is not None else self.memory_fraction
        self.conn, child = self.context.Pipe()
        self.process = self.context.Process(
            target=_serve,
            args=(self.task_path, self.config, self.state, child, self.memory_fraction, self.device),
            daemon=True,
        )
        self.process.start()
        self._await_ready()

    def _await_ready(self) -> None:
        """The child's word that the task is built (imports take seconds), or why it is not, as a RuntimeError."""
        try:
            kind, about = self.conn.recv() if self.conn.poll(START_TIMEOUT_S) else (None, None)
        except EOFError:  # the process died before it could say why (killed, out of memory)
            self.process.join(5)
            kind, about = "failed", f"its process exited with code {self.process.exitcode}"
        if kind == "failed":
            raise RuntimeError(f"fill task {self.task_path} could not start: {about}")
        if kind != "ready":
            raise RuntimeError(f"fill task {self.task_path} did not start within {START_TIMEOUT_S} s")
        self.configurations, self.micro_steps, self.peak_bytes = about["configurations"], about["micro_steps"], 0
        self.calls = 0  # its first whole step is a warm-up again

    def window(self, duration_s: float) -> dict | None:
        """A bubble starts now and lasts duration_s: let the task run steps in it. None if it had to be killed."""
        began = time.monotonic()
        end = began + duration_s
        self.conn.send(("run", end))
        if self.conn.poll(max(0.0, end - time.monotonic()) + self.grace_s):
            _, report = self.conn.recv()
            self.steps += [(a, b, end) for a, b in report["steps"]]
            self.peak_bytes = max(self.peak_bytes, report["peak_bytes"])
            self.longest_step_s = max([self.longest_step_s] + [b - a for a, b in report["steps"]])
            warm_up = report["steps"][: max(0, self.micro_steps - self.calls)]
            self.warm_up_s = max([self.warm_up_s] + [b - a for a, b in warm_up])
            self.calls += len(report["steps"])
            return report
        if self.calls < self.micro_steps:  # a warm-up call overran: it ran at least since the window began
            self.warm_up_s = max(self.warm_up_s, time.monotonic() - began)
        self.kill_and_restart()
        return None

    def kill_and_restart(self) -> None:
        """The task overran its window: SIGKILL it and start again from the last state taken. The new process
        knows the longest step seen so far, so it starts no step that would not fit, and the last steps' times, at
        which it tries again after windows without a step (the overrun a spike: bubbles/step_time.py)."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.join()
        self.kills += 1
        usual = [b - a for a, b, _ in self.steps[-USUAL_STEPS:]]  # it tries these again if the overrun was a spike
        longest = max(float(self.config.get("step_s", 0.0)), self.longest_step_s)
        self.config = {**self.config, "step_s": longest, "usual_s": usual, "warm_up_s": self.warm_up_s}
        self.start()

    def reconfigure(self, overrides: dict, trial: bool = False) -> None:
        """Run on from the task's state with `overrides` on the submitted configuration, in the same process. A
        trial's steps are timed, never kept: its state is never taken, so checkpoints and what comes after it go on
        from the state before."""
        if not self.trying:
            self.take_state()
        self.config, self.longest_step_s = {**self.submitted, **overrides, "step_s": 0.0}, 0.0
        self.trying = trial
        self.conn.send(("reconfigure", (self.config, _pack(self.state) if self.state is not None else None)))
        self._await_ready()

    def take_state(self) -> dict:
        if self.trying:
            return self.state
        self.conn.send(("state", None))
        self.state = _unpack(self.conn.recv()[1])
        return self.state

    def checkpoint(self, store, job_id: str) -> str:
        """Publish the task's state as a checkpoint of the fill job; returns its URL."""
        import torch

        from broker.sdk import STATE_FILE

        state = self.take_state()
        with tempfile.TemporaryDirectory(prefix="broker-fill-") as tmp:
            torch.save(state, Path(tmp) / STATE_FILE)
            return store.publish(job_id, int(state.get("step", 0)), Path(tmp)).url

    def stop(self) -> dict:
        """End the task's process; returns its state (a trial's: the state it started from)."""
        if self.trying:
            self.process.kill()
        else:
            self.conn.send(("stop", None))
            self.state = _unpack(self.conn.recv()[1])
        self.process.join()
        return self.state

    def overruns_ms(self) -> list[float]:
        """How far each step ended past its window's end (0 for steps inside)."""
        return [max(0.0, (b - end) * 1000) for _, b, end in self.steps]


def run_standalone(task_path: str, config: dict, total_steps: int) -> FillTask:
    """Run a fill task as an ordinary job (the job contract): resume from BROKER_RESUME_FROM, save at the end."""
    from broker import sdk

    task = load_task(task_path)
    task.create(config)
    state = sdk.restore(weights_only=False)
    if state is not None:
        task.load_state_dict(state)
    task.init()
    while task.steps_done() < total_steps:
        task.run_step()
        sdk.progress(task.steps_done(), total_steps)
    sdk.save(task.state_dict(), step=task.steps_done())
    task.stop()
    return task
