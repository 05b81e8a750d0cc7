"""The agent side of the broker's contract, written once for every kind of agent: the process agent on an
instance, a training stage's fill agent, and the backtest's simulated fleet.

An agent registers the capacity it stands for and keeps a lease. It takes assignments from its own
stream and acknowledges one only with its report that the job started (one transaction), so a crash before
that redelivers it. It starts an assignment only while the broker's view of the job says the fence is the
newest and the job is its own; it stops a job when the view moves on (a newer fence, a cancel), checkpoints
and hands it back when the view asks for a move, and checkpoints and runs on when the view asks for a
checkpoint. It reports with its own key. It reads nothing of jobs but its assignments and those views, so
its Redis user can be limited to them (broker/store/acl.py).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

import redis
from pydantic import ValidationError

from broker.agents.tokens import longest, pool_of
from broker.domain.jobspec import JobSpec
from broker.domain.model import AgentInfo
from broker.domain.offer import Offer
from broker.store.jobs import Store
from broker.store.renewals import pool_tokens, renewed_token
from broker.store.shards import ShardedStore

log = logging.getLogger(__name__)


class Unregistered(Exception):
    """The broker removed this agent while it read its assignments (Contract.take)."""


@dataclass(frozen=True)
class Assignment:
    """One dispatch of a job to this agent, as the broker wrote it on the agent's stream."""

    entry_id: str
    job: str
    fence: int
    run: str
    spec: JobSpec
    resume_from: str | None
    redelivered: bool = False  # read before and never acked (a restart): others may still wait behind it


class Verdict(StrEnum):
    """What the broker's view says of a job an agent runs."""

    run = "run"  # carry on
    fenced = "fenced"  # stop it: the job moved on (a newer dispatch) or was cancelled
    moved = "moved"  # checkpoint it and hand it back: the deadline guard moves it
    checkpoint = "checkpoint"  # checkpoint it now and carry on: a preemption would lose work its deadline needs


def judge(view: dict | None, fence: int) -> Verdict:
    """The verdict of one view (Store.ownership) on the run with `fence`."""
    if view is None or view["fence"] != fence or not view["mine"] or view["terminal"]:
        return Verdict.fenced
    if view["move"]:
        return Verdict.moved
    return Verdict.checkpoint if view.get("checkpoint") else Verdict.run


class Contract:
    """One agent's dealings with the broker through the store."""

    def __init__(self, store: Store, agent_id: str):
        self.store, self.id = store, agent_id
        self._started: set[tuple[str, int]] = set()  # (job, fence) this agent started: never twice
        self._asked: dict[str, tuple[int, str]] = {}  # job -> (fence, request) of the checkpoint last acted on
        self._may_hold = True  # assignments read but maybe not acked (a restart, a failed start): read them first
        self._leaving = False  # once the instance is going away, a renewed lease stays marked leaving
        self._host, self._pid = None, None  # the registration's, as refusals name them
        self._told_no_renewals = False

    def register(
        self,
        offer: Offer,
        lease_ms: int,
        token: str | None = None,
        host: str | None = None,
        pid: int | None = None,
        at: datetime | None = None,
        on_cloud: bool = True,
        for_job: str | None = None,
    ) -> None:
        info = AgentInfo(
            id=self.id,
            offer=offer,
            host=host or socket.gethostname(),
            pid=os.getpid() if pid is None else pid,
            registered_at=at or datetime.now(UTC),
            token=token,
            on_cloud=on_cloud,
            for_job=for_job,
        )
        self.store.register_agent(info, lease_ms)
        self._host, self._pid = info.host, info.pid
        self._may_hold = True
        log.info("agent=%s registered offer=%s", self.id, offer.id)

    def refused(self) -> str | None:
        """Why the broker refused this agent's registration (its token: the server removed it), or None. Checked
        where the registration is found gone: a refusal of another process of the same id is not this one's."""
        refusal = self.store.refusal(self.id)
        if refusal is None or (refusal.get("host"), refusal.get("pid")) != (self._host, self._pid):
            return None
        return refusal.get("why")

    def renewed_token(self) -> str | None:
        """The registration token the broker renewed for this agent (core/renewal.py), or None. None too where its
        ACL user was made before renewals (`broker acl upgrade` lets it read it)."""
        try:
            return renewed_token(self.store, self.id)
        except redis.exceptions.NoPermissionError:
            if not self._told_no_renewals:
                log.warning(
                    "agent=%s its Redis user may not read renewed tokens: `broker acl upgrade` (as an admin)", self.id
                )
                self._told_no_renewals = True
            return None

    def offer(self, offer: Offer) -> None:
        """What this agent offers changed (a fill agent's measured speed): quotes see the new one."""
        if self.store.set_agent_offer(self.id, offer):
            log.info("agent=%s offers speed=%.3f", self.id, offer.speed_factor)

    def renew(self, lease_ms: int) -> bool:
        """Extend the lease (still leaving, once `leave` said so); False when it had lapsed (the broker may have
        moved this agent's job)."""
        return self.store.renew_lease(self.id, lease_ms, leaving=self._leaving)

    def leave(self) -> None:
        """The instance is going away: no new work. The lease lapses once the agent stops renewing it, after its job's
        exit report."""
        self._leaving = True
        self.store.mark_leaving(self.id)

    def remove(self) -> None:
        self.store.remove_agent(self.id)

    def take(self, block_ms: int | None) -> Assignment | None:
        """The next assignment to start, or None. Entries not to start are settled here: a malformed one is
        dropped, a stale or repeated one skipped, and a job cancelled since its dispatch closed with `exited`.
        Raises Unregistered when the broker removed this agent (its stream is gone: `refused` says whether it was
        refused, else it was taken for lost and may register again)."""
        pending, self._may_hold = self._may_hold, True  # until a read says otherwise (its reply may be lost)
        try:
            entry = self.store.read_assignment(self.id, block_ms, pending=pending)
        except redis.ResponseError as err:  # UNBLOCKED: deleted under a waiting read; NOGROUP: before a read
            if "UNBLOCKED" not in str(err) and "NOGROUP" not in str(err):
                raise
            raise Unregistered(str(err)) from None
        self._may_hold = entry is not None  # none held, none taken: an idle agent's next turn is one read, not two
        if entry is None:
            return None
        entry_id, fields, redelivered = entry
        try:
            job, fence, run = fields["job"], int(fields["fence"]), fields["run"]
            spec = JobSpec.model_validate_json(fields["spec"])
        except (KeyError, ValueError, ValidationError):  # not an assignment the broker wrote: drop it, loudly
            log.warning("agent=%s dropped malformed assignment %s", self.id, entry_id)
            self._settle(entry_id, redelivered)
            return None
        view = self.store.ownership(self.id, job)  # only the broker writes it: an entry it did not send is stale
        if (
            view is None
            or view["fence"] != fence
            or not view["mine"]
            or view["started"]
            or (job, fence) in self._started
        ):
            log.info("agent=%s skip job=%s fence=%d (stale or already started)", self.id, job, fence)
            self._settle(entry_id, redelivered)
            return None
        if view["terminal"]:  # cancelled between dispatch and now: close the run so the broker frees us
            self.exited(job, fence, "cancelled")
            self._settle(entry_id, redelivered)
            return None
        return Assignment(entry_id, job, fence, run, spec, fields.get("resume_from") or None, redelivered)

    def _settle(self, entry_id: str, redelivered: bool) -> None:
        """Acknowledge an assignment taken and done with. A new one (read when none was held) leaves none held
        once acked: the next turn reads only new ones."""
        self.store.ack_assignment(self.id, entry_id)
        self._may_hold = redelivered

    def started(self, assignment: Assignment, at: float | None = None, **data) -> None:
        """The job runs: report it and acknowledge the assignment, in one transaction."""
        self._started.add((assignment.job, assignment.fence))
        data.update(resume_from=assignment.resume_from)
        self.report(assignment.job, assignment.fence, "started", at=at, ack=assignment.entry_id, **data)
        self._may_hold = assignment.redelivered

    def refuse(self, assignment: Assignment, why: str) -> None:
        """The job could not start here: it failed with `why`, and the assignment is done."""
        self._started.add((assignment.job, assignment.fence))
        self.exited(assignment.job, assignment.fence, "failed", log_tail=[why])
        self._settle(assignment.entry_id, assignment.redelivered)

    def verdict(self, job: str, fence: int) -> Verdict:
        """What the broker's view says of the job this agent runs with `fence`."""
        return self.verdict_of(self.store.ownership(self.id, job), job, fence)

    def verdict_of(self, view: dict | None, job: str, fence: int) -> Verdict:
        """The verdict of a view read already (Store.ownerships, for many jobs at once). A checkpoint request is
        the verdict once: until the checkpoint's report reaches the broker the view still holds it."""
        verdict = judge(view, fence)
        if verdict == Verdict.checkpoint:
            request = (fence, view["checkpoint"])
            if self._asked.get(job) == request:
                return Verdict.run
            self._asked[job] = request
        return verdict

    def report(self, job: str, fence: int, kind: str, at: float | None = None, ack: str | None = None, **data) -> None:
        """Tell the broker what happened; `at` (epoch seconds) for a simulated clock, else the broker's now; `ack`:
        an assignment entry acknowledged with it (Store.report)."""
        if at is not None:
            data["at"] = at
        self.store.report(self.id, job, fence, kind, ack=ack, **data)

    def log(self, job: str, fence: int, lines: list[str]) -> None:
        """The job's output lines, to this agent's log stream (`broker logs` reads them)."""
        self.store.append_log(self.id, job, fence, lines)

    def exited(
        self, job: str, fence: int, reason: str, code: int | None = None, log_tail=(), at: float | None = None
    ) -> None:
        self._asked.pop(job, None)
        self.report(job, fence, "exited", at=at, reason=reason, code=code, log_tail=list(log_tail))


def newest_token(store: ShardedStore, agent_id: str, token: str | None) -> str | None:
    """The token an agent process registers with: the one it was given, or one the server renewed (core/renewal.py)
    where that admits longer: its own id's (a restart after the token it was given ended, without its --token-file),
    or its pool's (a spot pool's new instance boots with the token of the pool's boot data, a restarted training
    job's stages with the one it was launched with)."""
    pool = pool_of(token)
    try:
        pools = pool_tokens(store.shards, pool) if pool else []
        return longest(token, renewed_token(store.of_agent(agent_id), agent_id), *pools)
    except redis.exceptions.NoPermissionError:  # an ACL user made before renewals
        log.warning("agent=%s its Redis user may not read renewed tokens: `broker acl upgrade` (as an admin)", agent_id)
        return token
