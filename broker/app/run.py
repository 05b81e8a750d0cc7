"""`broker run`: one job end to end, as `sky launch` does it. The job is submitted; a server replica hosted here
plans it (a standby while another server holds the planning lease); a local agent for its chosen offer is started
unless an idle registered agent fits it; its state changes and output are followed until it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from broker.agents.agent import KEPT_RUN_DIRS
from broker.agents.provision import LocalProvisioner
from broker.agents.runner import DEFAULT_GRACE_S
from broker.core.waiting import waiting_for
from broker.domain.errors import BrokerError
from broker.domain.model import Job, JobSpec, JobState, Quote, Tier
from broker.domain.offer import Offer
from broker.store.agents import LOG_MAXLEN
from broker.store.jobs import Store
from broker.store.shards import agent_id_in

if TYPE_CHECKING:
    from broker.core.broker import Broker

AGENT_START_S = 60.0  # a local agent imports torch and the SDKs before it registers
# a job ended under way (cancelled, stopped at its budget) is followed until its agent's exit closes the run: the
# stop signal's grace, a checkpoint's save, and a margin (run_job; the run's cost and checkpoint are counted then)
CLOSE_S = DEFAULT_GRACE_S + 15.0


class LogFollower:
    """Reads a job's output run by run from its agents' log streams, each line once; runs up to fence `after` are
    left out (seen through again, a job's ended runs are history: `broker logs` has them)."""

    def __init__(self, store: Store, job_id: str, after: int = 0):
        self.store, self.job_id, self.after = store, job_id, after
        self.read_to: dict[int, str] = {}  # run's fence -> the newest log entry read
        self.lines = 0

    def read(self, job: Job) -> list[tuple[str, str]]:
        """New ("run", header) and ("out", line) entries since the last call."""
        entries = []
        for run in job.runs:
            if run.fence <= self.after:
                continue
            if run.fence not in self.read_to:
                where = f"{run.offer.tier.value} {run.offer.cloud} {run.offer.instance_type}"
                started = f", started {run.started_at:%H:%M:%S} UTC" if run.started_at else ""
                trimmed = self.store.log_trimmed_after(run.agent, run.started_at or run.dispatched_at)
                gone = (
                    f"; its first lines may be gone here (the store keeps about {LOG_MAXLEN:,} batches of an agent's "
                    f"output): the agent's own log file keeps them (its newest {KEPT_RUN_DIRS} ended runs')"
                    if trimmed
                    else ""
                )
                entries.append(("run", f"run {run.fence} on {run.agent} ({where}){started}{gone}"))
                self.read_to[run.fence] = "0"
            self.read_to[run.fence], lines = self.store.read_log(run.agent, job.id, run.fence, self.read_to[run.fence])
            entries += [("out", line) for line in lines]
            self.lines += len(lines)
        return entries


class StateTeller:
    """Says a followed job's state and what it waits for, each once when it changes (`broker run`, `broker logs
    --follow`): a queued job with no server or agent says so instead of printing nothing."""

    def __init__(self, store: Store, planning_here: bool = False):
        self.store, self.planning_here = store, planning_here
        self.state: JobState | None = None
        self.waiting: str | None = None

    def tell(self, job: Job, show: Callable[[str, str], None]) -> None:
        """Before the job's new output: a new state (not an end: the caller says it with `said`, after the job's
        last output) and a new reason to wait."""
        if job.state != self.state and not job.state.terminal:
            show("state", self.said(job))
        self.state = job.state
        waiting = waiting_for(self.store, job, planning_here=self.planning_here)
        if waiting and waiting != self.waiting:
            show("state", f"waiting: {waiting}")
        self.waiting = waiting

    @staticmethod
    def said(job: Job) -> str:
        return job.state.value + (f" ({job.reason})" if job.reason else "")


def local_offer(quote: Quote, spec: JobSpec) -> Offer | None:
    """The offer a local agent stands for: the first of the quote's choice, its alternatives and their on-demand
    fallbacks that fits the job as the planner sees it (`spec`: the guard's pinned tier) and is no pipeline bubble
    (bubbles come from training jobs, not from a process started here)."""
    from broker.models.fit import fits  # numpy and scipy: only here

    options = [quote.chosen, *quote.alternatives]
    offers = [o.offer for o in options] + [o.fallback for o in options if o.fallback]
    if quote.on_demand_baseline:
        offers.append(quote.on_demand_baseline.offer)
    return next((o for o in offers if o.tier != Tier.bubble and fits(spec, o)), None)


class LocalAgents:
    """The local agents `broker run` starts, each for its job alone (no other queued job takes it): one once the
    job waits and none of these, nor an idle registered agent, fits it as the planner sees it (a job the guard moved
    to on-demand gets an on-demand one; it waited for one no one started)."""

    def __init__(self, broker: Broker, provisioner: LocalProvisioner, job_id: str, show: Callable[[str, str], None]):
        self.store = broker.store.of_job(job_id)  # its shard: its agents register there
        self.shard, self.shards = broker.store.shards.index(self.store), len(broker.store.shards)
        self.provisioner, self.show = provisioner, show
        self.started: dict[str, Offer] = {}  # by agent id
        self.told_starting = False  # that another command starts one: said once

    def serve(self, job: Job) -> None:
        """Start an agent for the waiting job where it needs one (returns once it registered)."""
        from broker.models.fit import fits  # numpy and scipy: only here
        from broker.planning.option_table import PlanItem

        if not job.pending:
            return
        spec = PlanItem.from_job(job).spec  # the guard's pinned tier, zones it did not fit
        ours = self.started.values()  # one that stopped is not started again (a stop by hand stays one)
        if any(fits(spec, o) for o in ours) or idle_agent_fits(self.store, job, spec):
            return
        offer = local_offer(job.quote, spec)
        if offer is None:
            return
        name = f"local-{job.id}" + (f"-{offer.tier.value}" if self.started else "")
        agent_id = agent_id_in(name, self.shard, self.shards)
        if not self.store.claim_agent_start(agent_id, int(AGENT_START_S * 1000)):
            if not self.told_starting:  # another `broker run` of this job: its agent serves it once registered
                self.show("state", f"waiting: another `broker run` starts agent {agent_id} for it")
                self.told_starting = True
            return
        try:
            self.provisioner.start(agent_id, offer, for_job=job.id)
            self.started[agent_id] = offer
            self.show("state", f"started local agent {agent_id} for {offer.id}")
            wait_for_agents(self.store, [agent_id], AGENT_START_S, self.provisioner.run_root)
        finally:
            self.store.release_agent_start(agent_id)


def run_job(
    broker: Broker,
    server,
    provisioner: LocalProvisioner,
    job: Job,
    show: Callable[[str, str], None],
    poll_s: float = 0.2,
) -> Job:
    """Drive `job` to its end: start a local agent once it waits and no idle one fits it (one running already,
    `broker run JOB`, is followed), run server rounds (standing by while another replica plans), and `show(kind,
    text)` each state change ("state") and output line."""
    store = broker.store.of_job(job.id)  # its shard: the server given plans it there, on that shard's agents
    agents = LocalAgents(broker, provisioner, job.id, show)
    agents.serve(job)
    history = [r.fence for r in job.runs if r.ended_at is not None]  # a job taken up again (`broker run JOB`)
    if history:
        show("state", f"{len(history)} earlier run(s) ended: `broker logs {job.id}` has their output")
    follower = LogFollower(broker.store, job.id, after=max(history, default=0))
    teller = StateTeller(store, planning_here=True)
    closing_until = None
    while True:
        server.round(block_ms=int(poll_s * 1000))
        current = broker.store.get_job(job.id)  # wherever it is (a sharded job may move: core/rehoming.py)
        agents.serve(current)  # back in the queue (its agent gone), or pinned elsewhere by the guard
        ended = current.state.terminal  # read before the output: what was sent before the end is read below
        teller.tell(current, show)
        for kind, text in follower.read(current):
            show(kind, text)
        if ended and current.current_run is not None:  # stopped under way (a cancel, the budget cap)
            closing_until = closing_until or time.monotonic() + CLOSE_S
            if time.monotonic() < closing_until:  # its agent saves and reports the exit: this replica folds it
                continue
        if ended:  # the end is said after the job's last output, which was sent before it
            show("state", teller.said(current))
            return current


def fold_exit(broker: Broker, server, job_id: str, timeout_s: float = CLOSE_S, poll_s: float = 0.2) -> Job:
    """Server rounds until the job's run under way has closed (its agent, stopped, reported the exit) or `timeout_s`
    passed: `broker run` stopped with Ctrl-C leaves the job back in the queue, not shown running on a gone agent."""
    until = time.monotonic() + timeout_s
    while (current := broker.store.get_job(job_id)).current_run is not None and time.monotonic() < until:
        server.round(block_ms=int(poll_s * 1000))
    return current


def idle_agent_fits(store: Store, job: Job, spec: JobSpec) -> bool:
    """Whether an idle registered agent can run the job (`spec`: as the planner sees it): else `broker run` starts
    one (an idle agent of another shape, left by an earlier command, kept it from starting one, and the job waited
    for an agent that fits)."""
    from broker.models.fit import fits  # numpy and scipy: only here

    return any(a.job is None and a.may_take(job.id) and fits(spec, a.offer) for a in store.working_agents())


def wait_for_agents(store: Store, agent_ids: list[str], timeout_s: float, logs: Path) -> None:
    """Until every agent holds a lease; one that does not in time is named with its log (a failed start)."""
    deadline = time.monotonic() + timeout_s
    while not all(store.lease_alive(a) for a in agent_ids):
        if time.monotonic() > deadline:
            missing = [a for a in agent_ids if not store.lease_alive(a)]
            raise BrokerError(
                f"agent(s) {', '.join(missing)} did not register within {timeout_s:.0f} s; "
                f"see {logs / f'agent-{missing[0]}.log'}"
            )
        time.sleep(0.1)
