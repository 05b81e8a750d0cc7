"""`broker agent`: the process on an instance. It registers the capacity it stands for, keeps
a heartbeat lease, takes assignments from its stream, runs each job through the job
contract, forwards the job's events, and on a preemption notice has the job checkpoint
and leaves. It acknowledges an assignment only once the job process has started, and
runs an assignment only while its fence token is the job's newest. It reads nothing of jobs but its
assignments and its view of them: the contract every agent keeps (broker/agents/contract.py).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import time
from collections import deque
from datetime import UTC, datetime
from pathlib import Path

import redis

from broker.agents.contract import Contract, Unregistered, Verdict
from broker.agents.notices import watches_cloud
from broker.agents.runner import JobProcess
from broker.agents.tokens import longest, read_file, write_file
from broker.domain.errors import RefusedError
from broker.domain.offer import Offer, notice_grace_s
from broker.store.connection import give_up_waiting_when
from broker.store.jobs import Store

log = logging.getLogger(__name__)

FORWARDED = ("progress", "checkpoint", "restored", "checkpoint_skipped", "checkpoint_failed")
PROGRESS_EVERY_S = 1.0
OUTPUT_EVERY_S = 0.5  # how often the job's new output lines go to the log stream
NOTICE_POLL_S = 1.0  # how often the metadata service is asked (AWS suggests every 5 s; leads are 30-120 s)
KEPT_RUN_DIRS = 20  # the newest ended runs' output and events stay on the instance (`broker logs` reads Redis)
TOKEN_POLL_S = 60.0  # how often an agent with a token looks for one the broker renewed (a day before it ends)


class Agent:
    """One instance's agent: one job at a time."""

    def __init__(
        self,
        store: Store,
        agent_id: str,
        offer: Offer,
        checkpoint_root: str,
        run_root: Path,
        notices=None,
        heartbeat_s: float = 1.0,
        lease_s: float = 5.0,
        grace_s: float = 30.0,
        metrics=None,
        token: str | None = None,
        for_job: str | None = None,
        token_file: Path | None = None,
    ):
        self.store, self.id, self.offer, self.token = store, agent_id, offer, token
        self.token_file = token_file  # where a renewed token is kept for the next process (`--token-file`)
        self.for_job = for_job  # started for this job alone (`broker run`)
        self.checkpoint_root = checkpoint_root.rstrip("/")
        self.run_root = Path(run_root)
        self.notices = notices
        self.metrics = metrics  # a broker.app.metrics.AgentMetrics, or None
        self.heartbeat_s, self.lease_ms, self.grace_s = heartbeat_s, int(lease_s * 1000), grace_s
        self.contract = Contract(store, agent_id)
        self.job: JobProcess | None = None
        self.fence: int | None = None
        self._last_beat = 0.0
        self._stopping = False
        self._progress: dict | None = None  # the newest progress event not yet reported
        self._progress_sent = 0.0
        self._output_sent = 0.0
        self._notice_polled = 0.0
        self._notice = None  # the preemption notice, once one came
        self._token_polled = -float("inf")
        self._ended_runs: deque[Path] = deque()  # its ended runs' directories, oldest first

    def register(self) -> None:
        self.contract.register(
            self.offer, self.lease_ms, token=self.token, on_cloud=watches_cloud(self.notices), for_job=self.for_job
        )
        self._last_beat = time.monotonic()

    def run(self) -> str:
        """Serve assignments until preempted or stopped; returns why it ended."""
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # a stop, Ctrl-C, a closed terminal: the job
            signal.signal(signum, lambda *_: setattr(self, "_stopping", True))  # (its own session) checkpoints first
        give_up_waiting_when(self.store.redis, self._going_away)  # not for the whole outage the store rides out
        registered = False
        try:
            while True:
                try:
                    if not registered:  # here, not before: Redis may go away mid-registration too
                        self.register()
                        registered = True
                    outcome = self.step()
                except redis.ConnectionError as err:  # Redis gone longer than the store rides out: keep the job, retry
                    if self._going_away():  # unless the instance is going away: the job checkpoints all the same
                        return self._leave_unreachable(self._notice)
                    log.warning("agent=%s redis unreachable (%s); retrying in 1 s", self.id, err)
                    time.sleep(1.0)
                    continue
                if outcome:
                    return outcome
        except Exception:
            self._stop_orphan()
            raise

    def _stop_orphan(self) -> None:
        """The agent dies of an error: stop its job (its own session would outlive the agent) rather than leave it
        running unreported while the broker gives it to another agent once the lease lapses. It checkpoints on the
        SIGTERM into the store, where the next run's resume finds it."""
        if self.job is not None and self.job.poll() is None:
            log.error(
                "agent=%s failing; stopping job=%s (up to %.0f s to checkpoint)", self.id, self.job.job_id, self.grace_s
            )
            self.job.stop(self.grace_s)

    def step(self, block_ms: int = 200) -> str | None:
        """One turn of the loop; a string when the agent must end (preempted, stopped)."""
        if time.monotonic() - self._last_beat >= self.heartbeat_s:
            self._last_beat = time.monotonic()
            if not self.contract.renew(self.lease_ms):  # lapsed (a pause, a partition): the broker
                self._end_job("lost", kill=True)  # may have moved our job, so drop it and start afresh
                self._unless_refused()
                log.warning("agent=%s lease lapsed; re-registering", self.id)
                self.register()
            if self.token and time.monotonic() - self._token_polled >= TOKEN_POLL_S:
                self._take_renewed_token()
            if self.job:
                self._check_ownership()
            elif self.for_job and self._own_job_ended():
                self.contract.leave()  # its lease lapses: the broker removes it
                return "its job ended"
        if self._going_away():
            return self._leave(self._notice)
        if self.job:
            self._forward()
            code = self.job.poll()
            if code is not None:
                self._forward()
                self._end_job("finished" if code == 0 else "failed", code=code)
            else:
                time.sleep(0.05)
            return None
        self._take_assignment(block_ms)
        return None

    def _own_job_ended(self) -> bool:
        """Whether the job this agent was started for has ended (its view, once given it, says so): with no job to
        take it leaves, rather than wait for good where its starter (`broker run`) died without stopping it."""
        view = self.store.ownership(self.id, self.for_job)
        return bool(view and view["terminal"])

    def _take_renewed_token(self) -> None:
        """Register with the token the broker renewed for this process from now on, and keep it in the token file:
        a restart after the token it started with ended is admitted."""
        self._token_polled = time.monotonic()
        token = self.contract.renewed_token()
        if token is None or token == self.token or longest(token, self.token) != token:
            return
        self.token = token
        if self.token_file:
            write_file(self.token_file, token)
        log.info(
            "agent=%s took a renewed registration token%s", self.id, f" ({self.token_file})" * bool(self.token_file)
        )

    def _check_ownership(self) -> None:
        """Stop the job when it moved on (fence, cancel), or checkpoint and hand it back when the broker asks; ask
        the job for a checkpoint when the broker does (the job saves at its next step, `sdk.should_save`)."""
        verdict = self.contract.verdict(self.job.job_id, self.fence)
        if verdict == Verdict.checkpoint:
            self.job.request_checkpoint()
            log.info("agent=%s job=%s checkpoint requested", self.id, self.job.job_id)
        elif verdict != Verdict.run:
            log.warning(
                "agent=%s job=%s fence=%s: the broker says %s; stopping it",
                self.id,
                self.job.job_id,
                self.fence,
                verdict.value,
            )
            self._end_job(verdict.value)

    def _take_assignment(self, block_ms: int) -> None:
        try:
            assignment = self.contract.take(block_ms)
        except Unregistered as err:  # refused, or removed as lost (a long pause)
            self._unless_refused()
            log.warning("agent=%s registration removed (%s); re-registering", self.id, err)
            self.register()
            return
        if assignment is None:
            return
        job_id = assignment.job
        process = JobProcess(
            assignment.spec,
            job_id,
            f"{self.checkpoint_root}/{job_id}",
            self.run_root / job_id / assignment.run,
            assignment.resume_from,
        )
        started_at = time.time()  # before the process: its first progress report may be sent before ours
        try:
            process.start()
        except OSError as err:
            self.contract.refuse(assignment, str(err))
            return
        self.job, self.fence = process, assignment.fence
        if hasattr(self.notices, "job_started"):  # a trace replayed from the instance's first job
            self.notices.job_started()
        self.contract.started(assignment, at=started_at, pid=process.pid)  # acked only now: a crash redelivers it

    def _forward(self, flush: bool = False) -> None:
        """Report the job's events; progress at most once per PROGRESS_EVERY_S (the latest wins), in order."""
        for event in self.job.events():
            if self.metrics and "seconds" in event:
                histogram = {
                    "checkpoint": self.metrics.checkpoint_save,
                    "restored": self.metrics.checkpoint_restore,
                }.get(event["type"])
                if histogram:
                    histogram.observe(event["seconds"])
            if event.get("type") == "progress":
                self._progress = event
                if time.monotonic() - self._progress_sent >= PROGRESS_EVERY_S:
                    self._send_progress()
            elif event.get("type") in FORWARDED:
                self._send_progress()  # keep the order: progress made before a checkpoint is reported first
                self._send(event)
        if flush:
            self._send_progress()
        if flush or time.monotonic() - self._output_sent >= OUTPUT_EVERY_S:
            self._output_sent = time.monotonic()
            while lines := self.job.output():  # the job's output, for `broker logs`
                self.contract.log(self.job.job_id, self.fence, lines)
                if not flush:
                    break

    def _send_progress(self) -> None:
        if self._progress is not None:
            self._send(self._progress)
            self._progress, self._progress_sent = None, time.monotonic()

    def _send(self, event: dict) -> None:
        data = {k: v for k, v in event.items() if k not in ("type", "job")}
        self.contract.report(self.job.job_id, self.fence, event["type"], **data)

    def _end_job(self, reason: str, code: int | None = None, kill: bool = False) -> None:
        if self.job is None:
            return
        if self.job.poll() is None:
            self.job.kill() if kill else self._stop_job(self.grace_s)
        self._forward(flush=True)
        code = self.job.poll() if code is None else code
        tail = self.job.log_tail() if reason == "failed" else []
        self.contract.exited(self.job.job_id, self.fence, reason, code=code, log_tail=tail)
        self._forget_old_runs(self.job.run_dir)
        self.job, self.fence = None, None

    def _forget_old_runs(self, ended: Path) -> None:
        """Keep the directories of this agent's newest KEPT_RUN_DIRS ended runs: an instance serving jobs for weeks
        filled its disk with their output and events (others' runs may share the root: only its own go)."""
        self._ended_runs.append(ended)
        while len(self._ended_runs) > KEPT_RUN_DIRS:
            old = self._ended_runs.popleft()
            shutil.rmtree(old, ignore_errors=True)
            with contextlib.suppress(OSError):  # the job's directory, once none of its runs is left
                old.parent.rmdir()

    def _going_away(self) -> bool:
        """Whether the instance is going away: stopped, or a notice seen (the metadata service asked at most once per
        NOTICE_POLL_S). Also asked between the store's retries while Redis is away, so an outage does not keep a
        noticed job running past its notice's lead, nor a stopped agent waiting."""
        if self._notice is None and self.notices and time.monotonic() - self._notice_polled >= NOTICE_POLL_S:
            self._notice_polled = time.monotonic()
            self._notice = self.notices.check()
        return self._stopping or self._notice is not None

    def _stop_job(self, grace_s: float) -> None:
        """Stop the job within `grace_s`, renewing the lease and forwarding its events while it saves: a save longer
        than the lease had the broker take the run for lost and move the job from an older checkpoint meanwhile."""

        def keep_lease() -> None:
            self.contract.renew(self.lease_ms)
            self._forward()

        self.job.stop(grace_s, tick=keep_lease, tick_s=self.heartbeat_s)

    def _leave(self, notice) -> str:
        """The instance is going away: take no more work, checkpoint the job within the notice's lead, report.

        The lease is not deleted: it lapses once the agent has reported the job's exit and left, so the broker
        applies the exit report first.
        """
        self.contract.leave()
        if notice and self.metrics:
            self.metrics.notices.inc()
        if self.job:
            self.contract.report(self.job.job_id, self.fence, "notice", deadline=notice.deadline if notice else None)
            self._stop_job(self._grace_s(notice))
            self._end_job("preempted")
        if notice and hasattr(self.notices, "acknowledge"):
            self.notices.acknowledge(notice)
        return "preempted" if notice else "stopped"

    def _leave_unreachable(self, notice) -> str:
        """`_leave` while Redis cannot be reached: the job still checkpoints (to the checkpoint store) in its grace,
        and nothing is reported; the lease lapses and the broker moves the job from its newest verified checkpoint.
        Waiting for Redis instead kept a stopped agent, and its job, running for as long as Redis was away."""
        if self.job:
            log.warning("agent=%s redis unreachable; stopping job=%s to leave", self.id, self.job.job_id)
            self.job.stop(self._grace_s(notice))
            self.job, self.fence = None, None
        return "preempted" if notice else "stopped"

    def _unless_refused(self) -> None:
        """Raise when the broker refused this agent (its registration token) rather than register it again: it
        would be refused again, round after round."""
        why = self.contract.refused()
        if why is not None:
            raise RefusedError(
                f"token: the broker refused agent {self.id}: {why}; pass it a registration token with --token or "
                f"BROKER_AGENT_TOKEN (`broker agents token --id {self.id}`, where BROKER_AGENT_SECRET is set)"
                + self._drop_kept_token()
            )

    def _drop_kept_token(self) -> str:
        """Remove the token file when it held the refused token (one signed with a secret since replaced, say): it
        would be chosen over --token again, as the one that admits longer."""
        if self.token_file is None or read_file(self.token_file) != self.token:
            return ""
        self.token_file.unlink(missing_ok=True)
        return f"; {self.token_file} held that token and is removed"

    def _grace_s(self, notice) -> float:
        """How long the job has to checkpoint: the notice's lead, else the configured grace."""
        if notice is None:
            return self.grace_s
        return notice_grace_s((notice.deadline - datetime.now(UTC)).total_seconds())
