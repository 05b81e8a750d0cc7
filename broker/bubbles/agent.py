"""A stage's fill executor as a broker agent of tier `bubble`.

An instrumented training rank publishes its BubbleProfile, registers the stage's windows as an
Offer of tier bubble and serves fill jobs through the contract every agent keeps
(broker/agents/contract.py): assignments from its stream (acked after the start), the checkpoint the
broker chose, started, progress, checkpoint and exited reports, the fence and the deadline guard's
move request read from its views (never a job record), and a heartbeat lease.
A job runs only inside the windows: each bubble signal
from the engine becomes an executor window as long as that kind of window nearly always is (its
p10, less a 10% margin); the engine never waits for it. When training ends, the running fill job
is checkpointed and handed back (end reason `preempted`), so the broker moves it elsewhere.
A new fill job is first timed in each configuration it offers (micro-step splits; probe.py) and runs
on in the one that does the most work in these windows and their free memory; if none fits, it is
handed back at once as `unfit` (the broker never sends it to this stage again). Once its steps are
timed, the offer's speed becomes what steps of that length pack into the windows
(`measured_speed`), so quotes price this stage by what it delivers. On CUDA the fill process may
allocate no more than the least free memory the windows had.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from datetime import UTC, datetime

from broker.agents.checkpoints import CheckpointStore
from broker.agents.contract import Assignment, Contract, Unregistered, Verdict, newest_token
from broker.bubbles.capacity import bubble_offer, measured_speed
from broker.bubbles.executor import START_TIMEOUT_S, FillExecutor, stage_device, warm_fill_processes
from broker.bubbles.probe import NEXT, TIMING, UNFIT, ConfigurationProbe
from broker.bubbles.profiler import profile
from broker.bubbles.recorder import BubbleRecorder
from broker.domain.bubbles import BubbleProfile, FillStats, stage_agent_id
from broker.domain.offer import Offer
from broker.sdk import STATE_FILE
from broker.store.jobs import Store
from broker.store.profiles import save_fill_stats, save_profile
from broker.store.shards import ShardedStore

log = logging.getLogger(__name__)

WINDOW_MARGIN = 0.9  # use 90% of a window's p10 length
CHECKPOINT_EVERY_S = 5.0
OWNERSHIP_EVERY_S = 1.0
PROGRESS_EVERY_S = 1.0  # as the other agents: windows come many times a second
STATS_EVERY_S = 2.0
MIN_SPEED = 1e-3  # the least speed an offer states
ASSIGNMENT_EVERY_S = 0.2  # bubble signals come tens of times a second; the stream needs no such rate


class FillAgent:
    """One stage's agent: one fill job at a time, run in the stage's bubbles."""

    def __init__(
        self,
        store: Store,
        checkpoints: CheckpointStore,
        profile: BubbleProfile,
        offer: Offer,
        lease_s: float = 10.0,
        token: str | None = None,
        profiles: Store | None = None,
    ):
        self.store, self.checkpoints, self.offer, self.token = store, checkpoints, offer, token
        self.profiles = profiles or store  # where profiles and fill statistics live: a sharded store's first shard
        self.id = stage_agent_id(profile.main_job, profile.stage)
        self.window_s = {w.kind: w.p10_s * WINDOW_MARGIN for w in profile.windows}
        self.median_s = {w.kind: w.median_s for w in profile.windows}
        self.bubbles = [(self.window_s[w.kind], w.free_bytes) for w in profile.windows]  # Algorithm 1's B[i], M[i]
        self.device = stage_device()  # read here, on the stage's training thread, not on the serving thread
        self.memory_fraction = memory_cap(profile, self.device)
        self.stats = FillStats(main_job=profile.main_job, stage=profile.stage, updated_at=datetime.now(UTC))
        self.iterations: list[float] = []  # the main job's iteration times while a fill job ran
        self.step_s: list[float] = []  # the fill job's measured step times (the latest 200)
        self.iteration_s = profile.iteration_s
        self.lease_ms = int(lease_s * 1000)
        self.signals: queue.Queue = queue.Queue()
        self.contract = Contract(store, self.id)
        self.executor: FillExecutor | None = None
        self.job: Assignment | None = None
        self.probe: ConfigurationProbe | None = None  # while the job's configurations are being timed
        self.chosen_at: float | None = None  # when the running job's configuration was chosen (monotonic)
        self.efficiency = 1.0  # the chosen configuration's work per second over the submitted one's
        self.total_steps = 0
        self.served: list[str] = []  # job ids it ran, in order
        self._thread = threading.Thread(target=self._serve, name=f"fill-agent-{self.id}", daemon=True)
        self._beating = threading.Thread(target=self._heartbeat, name=f"fill-lease-{self.id}", daemon=True)
        self._owned = self._saved = self._reported = self._published = self._polled = 0.0
        self._leaving = threading.Event()  # asked: take no new job
        self._left = threading.Event()  # done: the lease says "leaving" and no heartbeat will undo it
        self._lease = threading.Lock()  # a heartbeat's renewal never lands inside the mark "leaving" (or the exit)
        self._lapsed = threading.Event()  # a heartbeat found the lease gone: the serving thread starts afresh
        self._stopped = threading.Event()
        self._turned = time.monotonic()  # the serving thread's last turn: a hung one lets the lease lapse

    # -- wiring ---------------------------------------------------------------------------

    def signal(self, kind: str, expected_s: float = 0.0, free_bytes: int = 0) -> None:
        """The engine's bubble signal (BubbleRecorder.signal): queue it and return at once."""
        self.signals.put((kind, time.monotonic()))

    def iteration(self, seconds: float) -> None:
        """The main job finished an iteration (for the slowdown while filling)."""
        if self.executor is not None:
            self.iterations.append(seconds)

    def start(self) -> None:
        warm_fill_processes()  # before any job comes: its fill process then forks in milliseconds
        self.contract.register(self.offer, self.lease_ms, token=self.token)
        self._thread.start()
        self._beating.start()

    def leaving(self) -> None:
        """Training is ending: take no new job. Every stage says so before any hands its job back, or the
        broker could move the job to a stage of the same pipeline that is about to end too."""
        self._leaving.set()
        self._left.wait(timeout=5.0)

    def stop(self) -> None:
        """Training ends: hand the running job back with its checkpoint, leave the broker (its lease lapses)."""
        self.signals.put(None)
        self._thread.join()

    # -- the loop -------------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            while True:
                self._housekeeping()
                try:
                    item = self.signals.get(timeout=0.2)
                except queue.Empty:
                    continue
                if item is None:
                    break
                if self.executor is not None:
                    self._window(*item)
        finally:
            if self.executor is not None:
                self._end("preempted", checkpoint=True)
            self._publish()
            with self._lease:  # no renewal after the mark: the lease lapses and the broker removes the agent, as a
                self._stopped.set()  # process agent's does (after the exit report; an agent's ACL user may not DEL)
                self.contract.leave()

    def _heartbeat(self) -> None:
        """The lease, renewed on a thread of its own: starting or restarting a fill process (a torch import) can
        outlast the lease on a busy machine, and the serving thread waits for it meanwhile. A serving thread that
        has not turned for longer than a process may take to start is hung: the lease lapses, the job moves. Once
        leaving, the renewed lease stays marked so (the contract's), until the job's hand-back is reported."""
        while not self._stopped.wait(self.lease_ms / 4000):
            with self._lease:
                hung = time.monotonic() - self._turned > START_TIMEOUT_S + self.lease_ms / 1000
                if self._stopped.is_set() or hung:
                    continue
                if not self.contract.renew(self.lease_ms):
                    self._lapsed.set()

    def _housekeeping(self) -> None:
        now = self._turned = time.monotonic()
        if self._leaving.is_set() and not self._left.is_set():
            with self._lease:  # no heartbeat after the mark
                self.contract.leave()
            self._left.set()
        if self._lapsed.is_set() and not self._leaving.is_set():  # a long pause: the broker may have moved our job
            self._lapsed.clear()
            if self.executor is not None:
                self._end("lost", checkpoint=False)
            why = self.contract.refused()
            if why is not None:  # registering again would be refused again: training goes on, its bubbles unoffered
                log.error(
                    "agent=%s refused: %s; this stage offers no bubbles: pass attach(..., token=) or "
                    "BROKER_AGENT_TOKEN (`broker agents token --pool %s`)",
                    self.id,
                    why,
                    self.stats.main_job,
                )
                self._leaving.set()  # takes no job
                self._left.set()
                self._stopped.set()  # and its heartbeat ends: no lease to renew for the rest of the training
                return
            log.warning("agent=%s lease lapsed; re-registering", self.id)
            with self._lease:
                self.contract.register(self.offer, self.lease_ms, token=self.token)
        if now - self._published >= STATS_EVERY_S:
            self._publish()
        if self.executor is None:
            if now - self._polled >= ASSIGNMENT_EVERY_S and not self._leaving.is_set():
                self._polled = now
                self._take_assignment()
        elif now - self._owned >= OWNERSHIP_EVERY_S:
            self._owned = now
            verdict = self.contract.verdict(self.job.job, self.job.fence)
            if verdict == Verdict.checkpoint:
                if not self.executor.trying:  # a trial's state is not kept: the next periodic save answers it
                    self._checkpoint()
            elif verdict != Verdict.run:
                self._end(verdict.value, checkpoint=verdict == Verdict.moved)

    def _take_assignment(self) -> None:
        try:
            job = self.contract.take(block_ms=None)
        except Unregistered:  # removed as lost, or refused: the lapse's handling tells which
            self._lapsed.set()
            return
        if job is None:
            return
        if not job.spec.fill_task:
            self.contract.refuse(
                job, "fill job has no fill_task (module:Class of its FillTask); it cannot run in bubbles"
            )
            return
        executor = FillExecutor(job.spec.fill_task, {**job.spec.env, "step_s": 0.0}, device=self.device)
        executor.state = self._resume(job.job, job.resume_from)
        try:
            executor.start(self.memory_fraction)
        except (RuntimeError, OSError) as err:
            self.contract.refuse(job, str(err))
            return
        self.executor, self.job, self.total_steps = executor, job, int(job.spec.work.steps)
        self.probe, self.chosen_at = ConfigurationProbe(executor.configurations, executor.micro_steps), None
        self.efficiency, self.step_s = 1.0, []
        self._owned = self._saved = time.monotonic()
        self.served.append(job.job)
        self.stats.jobs += 1
        self.contract.started(job, pid=executor.process.pid)

    def _resume(self, job_id: str, url: str | None) -> dict | None:
        """The state in the checkpoint the broker chose (verified), or None to start afresh."""
        if url is None:
            return None
        import torch

        manifest, _ = self.checkpoints.verified_at(job_id, url)
        if manifest is None:
            return None
        with self.checkpoints.open_file(manifest, STATE_FILE) as f:
            return torch.load(f, weights_only=False, map_location="cpu")  # not onto the training job's GPU

    def _window(self, kind: str, began: float) -> None:
        usable = self.window_s.get(kind, 0.0)
        self.stats.bubble_s += self.median_s.get(kind, 0.0)  # bubble time while it held a job, filled or not
        length = usable - (time.monotonic() - began)
        if length <= 0.001:  # a window too short to use, or gone before this thread was free (a start, a checkpoint)
            self.stats.missed += int(usable > 0.001)
            return
        report = self.executor.window(length)
        self.stats.fill_s += sum(end - start for start, end in report["steps"]) if report else length
        if report:
            self.step_s = (self.step_s + [end - start for start, end in report["steps"]])[-200:]
        kept = report and not self.executor.trying  # a trial's steps are timed, not kept
        done = report["done"] if kept else (self.executor.state or {}).get("step", 0)
        if done >= self.total_steps or time.monotonic() - self._reported >= PROGRESS_EVERY_S:
            self.contract.report(self.job.job, self.job.fence, "progress", done=done, total=self.total_steps)
            self._reported = time.monotonic()
        if done >= self.total_steps:
            self._end("finished", checkpoint=True)
        elif time.monotonic() - self._saved >= CHECKPOINT_EVERY_S and not self.executor.trying:
            self._checkpoint()
        if self.probe is not None and self.executor is not None:
            self._time_configuration(report)

    def _time_configuration(self, report: dict | None) -> None:
        """One more window for the configuration being timed; once all are timed, run on in the best or leave."""
        outcome = self.probe.after_window(
            self.executor, report, self.bubbles, self.stats.iteration_s or self.iteration_s
        )
        if outcome == TIMING:
            return
        self.step_s = []  # the offer's speed comes from the steps of the configuration that runs
        if outcome == NEXT:
            return
        probe, self.probe, self.chosen_at = self.probe, None, time.monotonic()
        if outcome == UNFIT:
            log.warning(
                "job=%s agent=%s no configuration's steps fit these windows in time or memory", self.job.job, self.id
            )
            self._reprice(float("inf"))  # no step of its fits: the least speed
            self._end("unfit", checkpoint=True)
            return
        log.info("job=%s agent=%s configuration=%s", self.job.job, self.id, probe.chosen.name)
        self.efficiency = probe.efficiency(probe.chosen)

    def _publish(self) -> None:
        recent = sorted(self.iterations[-200:])
        self.stats.iteration_s = recent[len(recent) // 2] if recent else self.stats.iteration_s
        self.stats.updated_at = datetime.now(UTC)
        save_fill_stats(self.profiles, self.stats)
        self._published = time.monotonic()
        if self.step_s and self.probe is None:  # while timing configurations, their steps are not the job's
            self._reprice(sorted(self.step_s)[len(self.step_s) // 2])

    def _reprice(self, step_s: float) -> None:
        """Offer the speed steps of `step_s` really get here, when it moved more than 10% from the offer's."""
        iteration_s = self.stats.iteration_s or self.iteration_s
        speed = measured_speed(list(self.window_s.values()), iteration_s, step_s) if step_s < float("inf") else 0.0
        # steps longer than every window: as good as unusable, still an offer
        speed = max(speed * self.efficiency, MIN_SPEED)
        if abs(speed - self.offer.speed_factor) > 0.1 * self.offer.speed_factor:
            self.offer = self.offer.model_copy(update={"speed_factor": speed})
            self.contract.offer(self.offer)

    def _checkpoint(self) -> None:
        url = self.executor.checkpoint(self.checkpoints, self.job.job)
        step = int((self.executor.state or {}).get("step", 0))
        self.contract.report(self.job.job, self.job.fence, "checkpoint", url=url, step=step)
        self._saved = time.monotonic()

    def _end(self, reason: str, checkpoint: bool) -> None:
        if checkpoint:
            self._checkpoint()
        self.executor.stop()
        self.contract.exited(self.job.job, self.job.fence, reason, code=0 if reason == "finished" else None)
        self.executor, self.job = None, None


def serve_stage(
    store: ShardedStore,
    checkpoints: CheckpointStore,
    main_job: str,
    stage: int,
    recorder: BubbleRecorder,
    iterations: list[tuple[float, float]],
    accelerator: str,
    min_window_s: float = 0.05,
    token: str | None = None,
) -> FillAgent | None:
    """Publish a stage's measured profile; serve fill jobs as an agent, fed by the recorder's bubble signals, if a
    window is long enough to use. An engine's stage (Bubbles) and bench/stage_replay.py's replayed one both start
    here."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    measured = profile(main_job, stage, device, recorder.windows, iterations, datetime.now(UTC))
    save_profile(store.shards[0], measured)  # profiles live in shard 0
    offer = bubble_offer(measured, "local", "local", accelerator, min_window_s=min_window_s)
    if offer is None:
        return None
    agent_id = stage_agent_id(measured.main_job, measured.stage)
    agent_store = store.of_agent(agent_id)
    token = newest_token(store, agent_id, token)  # a restarted training job's stages: its launch token may have ended
    agent = FillAgent(agent_store, checkpoints, measured, offer, token=token, profiles=store.shards[0])
    recorder.signal = agent.signal
    agent.start()
    return agent


def memory_cap(profile: BubbleProfile, device: int | None) -> float | None:
    """On the stage's GPU (`stage_device`), the share of its memory the fill process may allocate: the least free
    memory its windows had, so an out-of-memory error hits the fill job and never the training stage. None
    elsewhere."""
    if device is None or not profile.device.startswith("cuda"):
        return None
    import torch

    total = torch.cuda.get_device_properties(device).total_memory
    return min(1.0, min(w.free_bytes for w in profile.windows) / total)
