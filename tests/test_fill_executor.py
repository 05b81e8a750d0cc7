"""The fill executor with real processes: steps stay inside windows, an overrunning task is SIGKILLed and
resumes from its state, and a fill job checkpointed in bubbles finishes on an ordinary agent identically."""

import os
import sys
import time
from pathlib import Path

import pytest
import torch

from broker.agents.checkpoints import CheckpointStore
from broker.bubbles.executor import FillExecutor
from broker.bubbles.step_time import STALLED_WINDOWS, StepTime
from conftest import EXAMPLES, assert_same_weights, make_spec, run_to_end

FILL = EXAMPLES / "bubbles" / "fill_mlp.py"


@pytest.fixture(autouse=True)
def importable(monkeypatch):
    monkeypatch.syspath_prepend(str(FILL.parent))  # the spawned child imports fill_mlp by name


def windows(executor, count, length_s, gap_s=0.02):
    reports = []
    for _ in range(count):
        reports.append(executor.window(length_s))
        time.sleep(gap_s)  # the main job computes between bubbles
    return reports


def filled(config: dict, count: int, length_s: float, grace_s: float = 0.05):
    """A fill executor of `config` run through `count` windows and stopped; none of them killed it."""
    executor = FillExecutor("fill_mlp:MlpFill", config, grace_s=grace_s)
    executor.start()
    try:
        reports = windows(executor, count, length_s)
    finally:
        executor.stop()
    assert all(r is not None for r in reports) and executor.kills == 0
    return executor, reports


def test_fill_steps_run_only_inside_their_windows():
    executor, _ = filled({"extra_step_s": 0.004, "step_s": 0.006}, 30, 0.05, grace_s=0.5)
    overruns = sorted(executor.overruns_ms())
    assert len(overruns) >= 60  # several steps per 50 ms window
    assert overruns[int(0.99 * (len(overruns) - 1))] <= 5.0  # p99 overrun within 5 ms


def test_a_slow_first_step_does_not_keep_the_steps_after_it_out_of_the_windows():
    """A process's first whole step (4 micro-steps here) is a warm-up: on a GPU its first kernels made it 3-5 times
    longer than the steps after it. Timed, it is not what the executor plans with: planning with it, no step would
    start again in windows shorter than it."""
    executor, reports = filled({"micro_steps": 4, "cold_s": 0.04, "step_s": 0.0}, 20, 0.03)
    assert max(b - a for a, b, _ in executor.steps[:4]) >= 0.04  # the warm-up ran, longer than a window
    assert all(r["steps"] for r in reports[-10:])  # and the steps after it run in every window
    planned = sorted(max(0.0, (b - end) * 1000) for _, b, end in executor.steps[8:])
    assert planned[int(0.99 * (len(planned) - 1))] <= 5.0  # within their windows once planned


def test_one_slow_step_keeps_the_steps_after_it_out_of_the_windows_only_for_a_while():
    """A spike of load made one step longer than the windows: planned with the longest step ever seen, no step started
    again, and the fill job stayed where it was for as long as its stage trained."""
    executor, reports = filled({"spike_s": 0.05, "spike_call": 10, "step_s": 0.0}, 60, 0.03, grace_s=0.1)
    calls = [sum(len(r["steps"]) for r in reports[: i + 1]) for i in range(len(reports))]
    spiked = next(i for i, called in enumerate(calls) if called >= 10)  # the window of the 10th call
    assert not reports[spiked + 1]["steps"]  # it is planned with for a while
    after = reports[spiked + STALLED_WINDOWS + 2 :]
    # then the steps are tried again, at least once a stall's length of windows: a loaded machine's slow steps each
    # stall a while (a busy fresh clone saw 8 of 42 windows with steps), a step planned for good with the spike none
    assert sum(1 for r in after if r["steps"]) >= len(after) // (STALLED_WINDOWS + 1)
    planned = sorted(max(0.0, (b - end) * 1000) for a, b, end in executor.steps[10:])
    assert planned[int(0.99 * (len(planned) - 1))] <= 5.0  # within their windows


def progressed(executor, most_s: float = 60.0) -> int:
    """Windows until the task's state has steps in it; the step saved, 0 if none came within `most_s`. A busy
    machine's fresh clone saw five 50 ms windows all overrun (a process's first step is its slowest, and each kill
    starts a new process): each window after one without progress is twice as long, up to 2 s."""
    length_s, until = 0.05, time.monotonic() + most_s
    while time.monotonic() < until:
        windows(executor, 1, length_s)
        if (step := executor.take_state()["step"]) > 0:
            return step
        length_s = min(2.0, 2 * length_s)
    return 0


def test_a_task_that_overruns_its_window_is_killed_and_resumes_from_its_last_state():
    executor = FillExecutor("fill_mlp:MlpFill", {"step_s": 0.0}, grace_s=0.05)
    executor.start()
    try:
        saved = progressed(executor)
        assert saved > 0
        kills = executor.kills  # those of a busy machine's first windows
        executor.config = {**executor.config, "extra_step_s": 2.0}  # the restarted child takes 2 s per step
        executor.kill_and_restart()
        # a 2 s step in a 0.5 s window: killed again (a 50 ms window could end before a busy machine's restarted child
        # even read it, and then it rightly starts no step)
        assert executor.window(0.5) is None and executor.kills == kills + 2
        executor.config = {"step_s": 0.0}
        executor.kill_and_restart()
        assert executor.take_state()["step"] == saved  # back where the last state was taken
    finally:
        executor.stop()


def test_a_warm_up_longer_than_the_windows_is_killed_once_not_in_every_window():
    """A process's first step (a GPU's first kernels; `cold_s` here) is its slowest. Each process started after a kill
    ran it in the next window and was killed again while the windows were shorter than it: a restart a window, and no
    progress (here 4 kills, one in each short window before the long one). A restart now waits for a window as long
    as the warm-up was seen running."""
    executor = FillExecutor("fill_mlp:MlpFill", {"step_s": 0.0, "cold_s": 0.5}, grace_s=0.2)
    executor.start()
    try:
        reports = []
        for length_s in [0.03] * 4 + [1.5] + [0.03] * 5:
            reports.append(executor.window(length_s))
            time.sleep(0.02)
        steps = executor.take_state()["step"]
    finally:
        executor.stop()
    # the first process's warm-up, in the first window (a busy machine's late reply may add one: not one a window)
    assert reports[0] is None and executor.kills <= 2
    assert reports[4]["steps"] and steps > 1  # the restart's warm-up waited for the long window; steps ran after it


def test_a_warm_up_time_that_fits_no_window_is_tried_again_after_a_stall():
    """The warm-up's time after a kill may have been a spike's: kept for good, windows shorter than it would never
    run the task again. It is planned with until STALLED_WINDOWS windows have gone without a step."""
    step = StepTime(0.002, (), warm_up_s=0.4)
    assert step.next_s(warming_up=True) == 0.4 and step.next_s(warming_up=False) == 0.002
    for _ in range(STALLED_WINDOWS):
        step.window_ended(0)
    assert step.next_s(warming_up=True) == 0.002


def test_a_trial_configuration_is_timed_but_its_steps_are_not_kept():
    executor = FillExecutor("fill_mlp:MlpFill", {"step_s": 0.0})
    executor.start()
    try:
        assert executor.micro_steps == 1 and set(executor.configurations) == {"2x8", "4x4", "8x2"}
        windows(executor, 3, 0.03)
        before = executor.take_state()["step"]
        executor.reconfigure(executor.configurations["4x4"], trial=True)
        reports = windows(executor, 3, 0.03)
        assert executor.micro_steps == 4 and reports[-1]["done"] > before  # it ran whole steps of 4 micro-batches
        assert executor.take_state()["step"] == before  # a checkpoint now would save the state before the trial
        executor.reconfigure({})
        assert executor.micro_steps == 1 and executor.take_state()["step"] == before
        windows(executor, 3, 0.03)
        assert executor.take_state()["step"] > before  # as submitted, its steps count again
    finally:
        executor.stop()


def test_another_configuration_runs_in_the_same_process_with_a_memory_peak_of_its_own():
    """Timing a configuration starts no new process (on an H200 each start took seconds of windows); the task is
    built again in the child, and its memory peak starts over, so a split's peak is not the whole batch's."""
    executor = FillExecutor("fill_mlp:MlpFill", {"step_s": 0.0, "width": 512, "depth": 3, "batch": 4096})
    executor.start()
    try:
        pid = executor.process.pid
        assert executor.window(3.0)["steps"]
        whole = executor.peak_bytes
        executor.reconfigure({"micro_steps": 8}, trial=True)
        assert executor.process.pid == pid and executor.micro_steps == 8
        assert executor.window(3.0)["steps"]
        assert executor.peak_bytes < whole - 20 * 2**20  # 512 of 4096 rows' activations at once, not all of them
    finally:
        executor.stop()


def test_a_task_that_cannot_start_says_why_in_one_line():
    executor = FillExecutor("fill_mlp:MlpFill", {"micro_steps": "3"})  # 3 does not divide its batch of 16
    with pytest.raises(RuntimeError, match="could not start: ValueError: micro_steps: 3 does not divide batch 16"):
        executor.start()


def test_a_fill_job_checkpointed_in_bubbles_finishes_on_an_ordinary_agent_with_the_same_weights(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    executor = FillExecutor("fill_mlp:MlpFill", {"step_s": 0.0})
    executor.start()
    try:
        while executor.take_state()["step"] < 15:
            windows(executor, 3, 0.03)
        url = executor.checkpoint(store, "fill")
        total = str(executor.state["step"] + 50)  # 50 more steps on the agent
    finally:
        executor.stop()

    def spec(out):
        return make_spec(
            name="fill",
            run=[sys.executable, str(FILL)],
            env={"STEPS": total, "OUTPUT": str(out)},
            resources={"accelerators": ["L4:1"]},
            work={"gpu_hours": 0.1},
        )

    run_to_end(spec(tmp_path / "moved.pt"), "fill", tmp_path / "ckpt", tmp_path / "run-moved", resume_from=url)
    run_to_end(spec(tmp_path / "plain.pt"), "plain", tmp_path / "ckpt", tmp_path / "run-plain")
    assert_same_weights(torch.load(tmp_path / "moved.pt"), torch.load(tmp_path / "plain.pt"))


def test_the_warm_up_runs_one_micro_batch_so_the_memory_peak_is_the_configurations_own():
    from fill_mlp import MlpFill

    task = MlpFill()
    task.create({"batch": 16, "micro_steps": 4})
    rows = []
    task.model.register_forward_hook(lambda module, inputs, output: rows.append(inputs[0].shape[0]))
    task.init()
    assert rows == [4]  # the whole batch at once would set the peak of the 1x16 configuration on a GPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: where a fill job's state lands on the device")
def test_a_fill_jobs_state_stays_off_the_gpu_of_the_stage_that_hosts_it():
    """The executor lives in the training stage's process: the fill job's state it takes (checkpoints, the state a
    trial goes back to) is held in host memory there, never on the training job's GPU."""
    executor = FillExecutor("fill_mlp:MlpFill", {"step_s": 0.0, "device": "cuda", "width": 1024, "depth": 3})
    executor.start()
    try:
        assert executor.window(1.0)["steps"]
        held = torch.cuda.memory_allocated()
        state = executor.take_state()
        assert {tensor.device.type for tensor in state["model"].values()} == {"cpu"}
        executor.reconfigure({"micro_steps": 2}, trial=True)
        assert executor.window(1.0)["steps"]
        assert torch.cuda.memory_allocated() == held
    finally:
        executor.stop()


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_fill_processes_fork_from_a_server_that_imported_torch_once():
    """A fill process is not a new interpreter importing torch (seconds at each start, restart and stage): it forks
    from the fork server, which loaded torch once; a restart forks from the same server."""
    executor = FillExecutor("fill_mlp:MlpFill", {"step_s": 0.0})
    executor.start()
    try:
        server = _parent(executor.process.pid)
        assert server != os.getpid()
        assert "libtorch" in Path(f"/proc/{server}/maps").read_text()
        first = executor.process.pid
        executor.kill_and_restart()
        assert executor.process.pid != first and _parent(executor.process.pid) == server
    finally:
        executor.stop()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs: a stage on the second one")
def test_a_stages_fill_process_works_on_the_stages_gpu():
    """A stage that trains on the second GPU: its fill job runs there too, not on the first stage's GPU."""
    torch.cuda.set_device(1)
    torch.ones(1, device="cuda")  # this process computes on GPU 1, as a stage of a pipeline does
    executor = FillExecutor("device_fill:DeviceFill", {"step_s": 0.0, "device": "cuda"})
    executor.start()
    try:
        assert executor.window(1.0)["steps"]
        assert executor.take_state()["cuda_device"] == 1
    finally:
        executor.stop()
        torch.cuda.set_device(0)
