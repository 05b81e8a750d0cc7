"""Redis persistence for jobs and their state changes, durable before acknowledged; the agent channel (agents,
leases, assignment and report streams, views) is its base class in agents.py, the planning lease the one in lease.py.

Key schema (prefix `broker:`, configurable for tests and multi-tenant Redis; a Store is one shard of a
ShardedStore, and a shard's prefix carries its hash tag, `broker:{3}:`, when there are several or on a cluster):

    {p}job:{id}          STRING  the Job as JSON: spec, quote, state, runs (the source of truth for one job)
    {p}jobs              ZSET    job id -> submitted_at (epoch seconds), for listing in order
    {p}events            STREAM  one entry per job state change: job, state, at (ISO), reason
    {p}pending           ZSET    jobs waiting for capacity -> urgency (priority, then deadline)
    {p}active            SET     jobs with a run under way
    due, due-indexed     unfinished jobs with a deadline -> it, for the count of those past it: see overdue.py
    {p}agent:{id}        STRING  the AgentInfo as JSON: the offer it stands for, its current job, its report key
    {p}agents            SET     registered agent ids
    {p}lease:{id}        STRING  present while the agent's heartbeat lease is alive (PX expiry);
                                 "leaving" once its instance is going away (no new work)
    {p}starting:{id}     STRING  a local agent being started under this id (`broker run`; PX expiry)
    {p}assign:{id}       STREAM  assignments to one agent: job, fence, run, resume_from, spec (JSON); group "agent"
    {p}refused:{id}      STRING  why the broker refused an agent (its token) and which process (JSON; a day)
    {p}admitted:{id}     STRING  the report key of the agent process whose token the broker checked (a day's
                         expiry once the agent is removed: the process may come back in; none once refused)
    {p}removed           ZSET    agent id -> when it was removed (its log stream outlives it: retention.py)
    {p}own:{agent}:{job} STRING  what an agent may know of a job it was given (JSON: fence, mine, started,
                                 move, checkpoint (when asked for one), terminal), rewritten with every change
                                 of the job; agents read nothing else of jobs, so their ACL users need no access
                                 to job keys (broker/acl.py)
    {p}leader            STRING  the broker replica that plans now (PX expiry: the planning lease)
    {p}leader-token      STRING  fencing token, incremented each time the lease changes hands
    {p}agent-events      STREAM  what agents report: agent, job, fence, type, data (JSON), key (the agent's);
                                 consumer group "broker", stale pending entries reclaimed; and a wake per new job
                                 (type "submitted", job; no agent), so a server waiting for reports dispatches it
    {p}log:{agent}       STREAM  the output of the jobs the agent ran, in batches: job, fence, lines (`broker logs`);
                                 capped at about LOG_MAXLEN batches
    {p}published         HASH    tag -> the ids (JSON) of the copies publish_jobs put here with that tag
    price:{offer}, priced, refreshed, evictions   price history: see prices.py
    capacity:{zone}, capacity-zones    the spot capacity our fleet had: see capacity.py
    spot-evidence                      our agents' spot hours and preemptions per market: see evidence.py
    figures                            the figures of every job without a run under way: see figures.py
    totals                             what the jobs without a run under way add up to: see totals.py
    bubbles:{main job}:{stage}         bubble profiles: see profiles.py
    (both event streams are capped at about STREAM_MAXLEN entries; agents send progress at most once a second)

A change to a job writes the job, its event and whatever must go with it (an assignment,
the agent's record) in one MULTI/EXEC transaction under WATCH, so two writers cannot both
move a job and a dispatch is never half done; `update_jobs` does the same for a batch of jobs.
The server runs with AOF on (appendfsync always for the embedded server), so a change is on
disk before the call returns.
"""

from __future__ import annotations

import itertools
import json
import logging
import secrets
from collections.abc import Callable
from datetime import datetime

import redis

from broker.domain.errors import BrokerError, NotFoundError
from broker.domain.model import AgentInfo, Job, JobState
from broker.store import evidence, figures, overdue, recount, totals
from broker.store.agents import LOG_MAXLEN, STREAM_MAXLEN, AgentChannels
from broker.store.connection import patient_retry, redact_url, unreachable
from broker.store.lease import PlanningLease
from broker.store.parsed import ParsedJobs
from broker.store.report_stream import ReportStream

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "broker:"


class Store(AgentChannels, ReportStream, PlanningLease):
    """Jobs and their event log in Redis."""

    def __init__(self, url: str, prefix: str = DEFAULT_PREFIX, outage_s: float = 0.0, client=None):
        """`outage_s` > 0 (the server and agents): every command rides out a Redis restart or fail-over of
        about that long, reconnecting with backoff, instead of failing at once (what a CLI command wants).
        `client`: a connection to share (the shards of a ShardedStore, a cluster client among them)."""
        self.url = redact_url(url)  # for messages and logs; the client keeps the real one
        self.prefix = prefix
        patience = {"retry": patient_retry(outage_s), "socket_keepalive": True} if outage_s > 0 else {}
        self.redis = client or redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=3, **patience)
        self.shards = [self]  # a store of one shard, as ShardedStore's clients see it
        self._report_keys: dict[str, str] = {}  # agent id -> the key its reports carry (agents registered here)
        self._parsed = ParsedJobs()
        self._stored_jobs = False  # whether this store held a job when this process last added one (add_job)
        if client is None:  # a shared client's owner (ShardedStore) checks once
            self._ensure_durable()

    def _key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    key = _key  # for the store's other modules, which keep their keys beside these (prices.py, profiles.py)

    def of_job(self, job_id: str) -> Store:
        return self  # the shard a job belongs to (shards.py): here, this one

    of_agent = of_job

    def clear_namespace(self) -> int:
        """Delete every key under this store's prefix (a demo's or a backtest's own); returns how many."""
        keys = list(self.redis.scan_iter(self.prefix + "*", count=1000))
        for i in range(0, len(keys), 500):
            self.redis.delete(*keys[i : i + 500])
        self._stored_jobs = False  # the next job is an empty store's first (add_job)
        return len(keys)

    def _ensure_durable(self) -> None:
        try:
            if self.redis.config_get("appendonly").get("appendonly") != "yes":
                self.redis.config_set("appendonly", "yes")
                log.info("store=%s appendonly=enabled", self.url)
        except (
            redis.exceptions.NoPermissionError
        ):  # an ACL user made for an agent (store/acl.py): the broker's user checks
            log.info("store=%s appendonly=unchecked (this user may not CONFIG)", self.url)
        except redis.ResponseError:  # managed Redis often forbids CONFIG; its durability is its own
            log.warning("store=%s appendonly=unknown (CONFIG not allowed)", self.url)
        except redis.ConnectionError as err:
            raise unreachable(self.url, err) from None

    def new_job_id(self, name: str, fitting: list[AgentInfo]) -> str:
        """An id for a new job: its name plus a random suffix (`fitting`, the working agents it can run on, matters
        only to a sharded store)."""
        return f"{name}-{secrets.token_hex(3)}"

    def add_job(self, job: Job) -> bool:
        """Store a new job with its `submitted` event atomically; False if the id already exists. The first job of
        an empty store starts the counters beside the jobs as counted (recount.py): no job came before it."""
        key, index = self._key("job", job.id), self._key("jobs")
        while True:
            with self.redis.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(key)
                    if pipe.exists(key):
                        return False
                    first = not self._stored_jobs and not pipe.exists(index)
                    if first:  # asked again under watch: another first job meanwhile would start the totals too
                        pipe.watch(index)
                        first = not pipe.exists(index)
                    pipe.multi()
                    if first:  # the jobs of an empty store add up to nothing; runs of jobs that moved away stay
                        pipe.delete(self._key(totals.KEY))
                        pipe.hset(self._key(totals.KEY), recount.COUNTED, 1)
                        pipe.hsetnx(self._key(evidence.KEY), recount.COUNTED, 1)
                        pipe.set(self._key(overdue.INDEXED), 1)
                    pipe.set(key, job.model_dump_json())
                    pipe.zadd(index, {job.id: job.submitted_at.timestamp()})
                    self._index(pipe, job)
                    evidence.count(pipe, self._key(evidence.KEY), None, job)  # a job stored with ended runs (an import)
                    totals.count(pipe, self._key(totals.KEY), None, job)
                    figures.track(pipe, self._key(figures.KEY), None, job)
                    self._event(pipe, job, "submitted")
                    self.wake(pipe, job.id)
                    pipe.execute()
                    self._stored_jobs = True  # no need to ask again (another process clearing it: a recount)
                    return True
                except redis.WatchError:  # changed between WATCH and EXEC: the job created, or the store's first
                    continue

    def _index(self, pipe, job: Job) -> None:
        """Keep the pending, active and deadline indexes in step with the job, in the same transaction."""
        if job.pending:
            pipe.zadd(self._key("pending"), {job.id: job.urgency})
        else:
            pipe.zrem(self._key("pending"), job.id)
        if job.current_run is not None:
            pipe.sadd(self._key("active"), job.id)
        else:
            pipe.srem(self._key("active"), job.id)
        overdue.index(pipe, self._key(overdue.KEY), job)

    def jobs_by_id(self, ids: list[str]) -> list[Job]:
        """The jobs with these ids, in that order (an id no longer stored is left out)."""
        raws = self.redis.mget([self._key("job", i) for i in ids]) if ids else []
        return [self._parsed.get(r) for r in raws if r is not None]

    def pending_jobs(self, start: int = 0, count: int = 200) -> list[Job]:
        """Jobs waiting for capacity, most urgent first (a page of them)."""
        return self.jobs_by_id(self.redis.zrange(self._key("pending"), start, start + count - 1))

    def pending_count(self) -> int:
        return self.redis.zcard(self._key("pending"))

    def job_count(self) -> int:
        return self.redis.zcard(self._key("jobs"))

    def job_index(self) -> dict[str, float]:
        """Every job's id and submission time (epoch seconds): an id with another time is another job (a namespace
        cleared and filled again)."""
        return dict(self.redis.zrange(self._key("jobs"), 0, -1, withscores=True))

    def recent_jobs(self, count: int = 200) -> list[Job]:
        """The `count` newest jobs, in submission order."""
        return self.jobs_by_id(self.redis.zrange(self._key("jobs"), -count, -1))

    def active_jobs(self) -> list[Job]:
        """Jobs with a run under way."""
        return self.jobs_by_id(sorted(self.redis.smembers(self._key("active"))))

    def unfinished_jobs(self) -> list[Job]:
        """Jobs not yet ended, in submission order: those waiting and those with a run under way (both indexes read
        at once: a job moves between them), without reading the ones that ended."""
        with self.redis.pipeline(transaction=True) as pipe:
            waiting, running = pipe.zrange(self._key("pending"), 0, -1).smembers(self._key("active")).execute()
        return sorted(self.jobs_by_id(sorted({*waiting, *running})), key=lambda j: j.submitted_at)

    def totals_and_running(self) -> tuple[totals.Totals, list[Job]]:
        """What the jobs without a run under way add up to (store/totals.py), and the jobs with one: a job that
        starts or ends a run meanwhile is in one or the other, once (the counters and the index read at once)."""

        def read() -> list:
            with self.redis.pipeline(transaction=True) as pipe:
                return pipe.hgetall(self._key(totals.KEY)).smembers(self._key("active")).execute()

        counters, running = read()
        if recount.COUNTED not in counters and recount.recount(self, totals.KEY, totals.count):
            counters, running = read()
        return totals.Totals.parse(counters), self.jobs_by_id(sorted(running))

    def _event(self, pipe, job: Job, reason: str | None) -> None:
        self.event(pipe, job.id, job.state, job.updated_at, reason)

    def event(self, pipe, job_id: str, state: JobState, at: datetime, reason: str | None) -> None:
        """Queue a job state-change event on a transaction pipeline."""
        fields = {"job": job_id, "state": state.value, "at": at.isoformat(), "reason": reason or ""}
        pipe.xadd(self._key("events"), fields, maxlen=STREAM_MAXLEN, approximate=True)

    def get_job(self, job_id: str) -> Job:
        """The job with this id, or NotFoundError."""
        raw = self.redis.get(self._key("job", job_id))
        if raw is None:
            raise NotFoundError(f"job: no job {job_id!r}; `broker list` shows the ids")
        return self._parsed.get(raw)

    def list_jobs(self, states: set[JobState] | None = None, limit: int | None = None) -> list[Job]:
        """Jobs in submission order (newest last), optionally only those in `states`."""
        jobs = self.jobs_by_id(self.redis.zrange(self._key("jobs"), 0, -1))
        if states:
            jobs = [j for j in jobs if j.state in states]
        return jobs[-limit:] if limit else jobs

    def update_job(
        self,
        job_id: str,
        change: Callable[[Job], Job | None],
        also: Callable[[Store, redis.client.Pipeline, Job], None] | None = None,
        reason: str | None = None,
        emit: bool = True,
        leader: str | None = None,
    ) -> Job | None:
        """Apply `change` to the job atomically (None means no change); `also` adds commands to the same transaction
        (given this store: in a sharded store, the shard the job is in as it is written, which a move may change).

        With `emit`, a change of state writes its event; callers that fold several changes write their own.
        With `leader`, the change applies only while that replica holds the planning lease (the lease key is
        watched too: a replica that lost it mid-change writes nothing).
        """
        return self.update_jobs([(job_id, change, also)], reason, emit, leader, missing_ok=False)[job_id]

    def update_jobs(
        self,
        changes: list[
            tuple[str, Callable[[Job], Job | None], Callable[[Store, redis.client.Pipeline, Job], None] | None]
        ],
        reason: str | None = None,
        emit: bool = True,
        leader: str | None = None,
        missing_ok: bool = True,
    ) -> dict[str, Job | None]:
        """`update_job` for many jobs in one transaction (WATCH all, one MGET, one MULTI/EXEC): a server round's
        folds or dispatches cost three round trips and one fsync instead of that many per job. Returns each job
        after its change (None: no change, or a lost lease); a missing job is left out with `missing_ok`. When
        other writers keep touching the batch, it falls back to one transaction per job."""
        if not changes:
            return {}
        keys = [self._key("job", job_id) for job_id, _, _ in changes]
        watched = keys + ([self._key("leader")] if leader else [])
        for _ in itertools.count() if len(changes) == 1 else range(3):  # one job: until it applies, as before
            with self.redis.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(*watched)
                    raws = pipe.execute_command("MGET", *watched)  # the jobs, and the lease's holder last
                    if leader is not None and raws.pop() != leader:
                        return dict.fromkeys((job_id for job_id, _, _ in changes), None)
                    results, writes = {}, []
                    for (job_id, change, also), raw in zip(changes, raws):
                        if raw is None:
                            if missing_ok:
                                continue
                            raise NotFoundError(f"job: no job {job_id!r}; `broker list` shows the ids")
                        before = self._parsed.get(raw)
                        results[job_id] = job = change(before)
                        if job is not None:
                            writes.append((before, job, also))
                    if writes:
                        pipe.multi()
                        for before, job, also in writes:
                            self._write(pipe, before, job, reason, emit, also)
                        pipe.execute()
                    return results
                except redis.WatchError:
                    continue
        results = {}
        for job_id, change, also in changes:
            try:
                results[job_id] = self.update_job(job_id, change, also, reason, emit, leader)
            except NotFoundError:
                if not missing_ok:
                    raise
        return results

    def _write(self, pipe, before: Job, job: Job, reason: str | None, emit: bool, also) -> None:
        """Queue a job's new state and all that goes with it (indexes, agents' views, its event, `also`)."""
        text = job.model_dump_json()
        pipe.set(self._key("job", job.id), text)
        self._parsed.put(text, job)  # what this process wrote, it need not parse when it reads it back
        self._index(pipe, job)
        evidence.count(pipe, self._key(evidence.KEY), before, job)
        totals.count(pipe, self._key(totals.KEY), before, job)
        figures.track(pipe, self._key(figures.KEY), before, job)
        self._tell_agents(pipe, before, job)
        if emit and job.state != before.state:
            self._event(pipe, job, reason or job.reason)
        if also:
            also(self, pipe, job)

    def set_state(self, job_id: str, state: JobState, now: datetime, reason: str | None = None) -> Job:
        """Move a job to `state` with its event, atomically; a terminal job cannot move."""

        def move(job: Job) -> Job:
            if job.state.terminal:
                raise BrokerError(f"job: {job_id} is already {job.state.value}; nothing to change")
            return job.model_copy(update={"state": state, "updated_at": now, "reason": reason})

        return self.update_job(job_id, move, reason=reason)

    def events(self, job_id: str | None = None, count: int = 1000) -> list[dict]:
        """State-change events, oldest first, optionally for one job."""
        entries = self.redis.xrange(self._key("events"), count=count)
        rows = [{"id": entry_id, **fields} for entry_id, fields in entries]
        return [r for r in rows if job_id is None or r["job"] == job_id]

    def publish_jobs(self, source: Store, job_ids: list[str], tag: str) -> int:
        """Copy ended jobs of another namespace (a demo's) here, tagged, with their events and output, replacing
        the ones this tag put here before: so `broker list`, `status`, `logs` and the dashboard show them. Only
        ended jobs, their last runs with them (Job.final): no server acts on them. Returns how many were copied."""
        jobs = [j.model_copy(update={"tags": [*j.tags, tag]}) for j in source.jobs_by_id(job_ids) if j.final]
        copies = {j.id: j for j in jobs}
        record = self.redis.hget(self._key("published"), tag)
        if record is None:  # a store from before the record: the tag's copies found among every job, once
            stored = {j.id: j for j in self.list_jobs()}
            old = [i for i, j in stored.items() if tag in j.tags]
        else:  # a store keeps every job it ever ran: read only the copies, old and new
            old = json.loads(record)
            stored = {j.id: j for j in self.jobs_by_id(sorted({*old, *copies}))}
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._key("published"), tag, json.dumps(sorted(copies)))
            if old:
                pipe.execute_command("DEL", *(self._key("job", i) for i in old))
                pipe.zrem(self._key("jobs"), *old)
            for job_id in sorted({*old, *copies}):  # each copy from what it replaces (None: nothing) to itself
                totals.count(pipe, self._key(totals.KEY), stored.get(job_id), copies.get(job_id))
                figures.track(pipe, self._key(figures.KEY), stored.get(job_id), copies.get(job_id))
            for job in jobs:
                pipe.set(self._key("job", job.id), job.model_dump_json())
                pipe.zadd(self._key("jobs"), {job.id: job.submitted_at.timestamp()})
            for event in source.events():
                if event["job"] in copies:
                    fields = {k: v for k, v in event.items() if k != "id"}
                    pipe.xadd(self._key("events"), fields, maxlen=STREAM_MAXLEN, approximate=True)
            for agent in sorted({r.agent for j in jobs for r in j.runs}):
                for _, fields in source.redis.xrange(source._key("log", agent)):
                    if fields["job"] in copies:
                        pipe.xadd(self._key("log", agent), fields, maxlen=LOG_MAXLEN, approximate=True)
            pipe.execute()
        return len(jobs)
