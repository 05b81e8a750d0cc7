"""Redis persistence for jobs and their state changes: one class, durable before acknowledged.

Key schema (prefix `broker:`, configurable for tests and multi-tenant Redis):

    {p}job:{id}     STRING  the Job as JSON: spec, quote, state (the source of truth for one job)
    {p}jobs         ZSET    job id -> submitted_at (epoch seconds), for listing in order
    {p}events       STREAM  one entry per state change: job, state, at (ISO), reason

A state change writes the job and its event in one MULTI/EXEC transaction, under WATCH so
two writers cannot both move a job. The server runs with AOF on (appendfsync always for
the embedded server), so a change is on disk before the call returns.
"""

from __future__ import annotations

import logging
from datetime import datetime

import redis

from broker.errors import BrokerError, NotFoundError, StoreUnavailableError
from broker.model import Job, JobState

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "broker:"


class Store:
    """Jobs and their event log in Redis."""

    def __init__(self, url: str, prefix: str = DEFAULT_PREFIX):
        self.url = url
        self.prefix = prefix
        self.redis = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=3)
        self._ensure_durable()

    def _key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def _ensure_durable(self) -> None:
        try:
            if self.redis.config_get("appendonly").get("appendonly") != "yes":
                self.redis.config_set("appendonly", "yes")
                log.info("store=%s appendonly=enabled", self.url)
        except redis.ResponseError:  # managed Redis often forbids CONFIG; its durability is its own
            log.warning("store=%s appendonly=unknown (CONFIG not allowed)", self.url)
        except redis.ConnectionError as err:
            raise StoreUnavailableError(f"redis: cannot reach {self.url} ({err}); check BROKER_REDIS_URL") from None

    def add_job(self, job: Job) -> bool:
        """Store a new job with its `submitted` event atomically; False if the id already exists."""
        key = self._key("job", job.id)
        with self.redis.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)
                if pipe.exists(key):
                    return False
                pipe.multi()
                pipe.set(key, job.model_dump_json())
                pipe.zadd(self._key("jobs"), {job.id: job.submitted_at.timestamp()})
                self._event(pipe, job, "submitted")
                pipe.execute()
                return True
            except redis.WatchError:  # another writer created it between WATCH and EXEC
                return False

    def _event(self, pipe, job: Job, reason: str | None) -> None:
        pipe.xadd(
            self._key("events"),
            {"job": job.id, "state": job.state.value, "at": job.updated_at.isoformat(), "reason": reason or ""},
        )

    def get_job(self, job_id: str) -> Job:
        """The job with this id, or NotFoundError."""
        raw = self.redis.get(self._key("job", job_id))
        if raw is None:
            raise NotFoundError(f"job: no job {job_id!r}; `broker list` shows the ids")
        return Job.model_validate_json(raw)

    def list_jobs(self, states: set[JobState] | None = None, limit: int | None = None) -> list[Job]:
        """Jobs in submission order (newest last), optionally only those in `states`."""
        ids = self.redis.zrange(self._key("jobs"), 0, -1)
        if not ids:
            return []
        raws = self.redis.mget([self._key("job", i) for i in ids])
        jobs = [Job.model_validate_json(r) for r in raws if r is not None]
        if states:
            jobs = [j for j in jobs if j.state in states]
        return jobs[-limit:] if limit else jobs

    def set_state(self, job_id: str, state: JobState, now: datetime, reason: str | None = None) -> Job:
        """Move a job to `state` with its event, atomically; a terminal job cannot move."""
        key = self._key("job", job_id)
        with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    raw = pipe.get(key)
                    if raw is None:
                        raise NotFoundError(f"job: no job {job_id!r}; `broker list` shows the ids")
                    job = Job.model_validate_json(raw)
                    if job.state.terminal:
                        raise BrokerError(f"job: {job_id} is already {job.state.value}; nothing to change")
                    job = job.model_copy(update={"state": state, "updated_at": now, "reason": reason})
                    pipe.multi()
                    pipe.set(key, job.model_dump_json())
                    self._event(pipe, job, reason)
                    pipe.execute()
                    return job
                except redis.WatchError:
                    continue

    def events(self, job_id: str | None = None, count: int = 1000) -> list[dict]:
        """State-change events, oldest first, optionally for one job."""
        entries = self.redis.xrange(self._key("events"), count=count)
        rows = [{"id": entry_id, **fields} for entry_id, fields in entries]
        return [r for r in rows if job_id is None or r["job"] == job_id]

    def info(self) -> dict:
        """What a user may want to know about the store: where it is and whether AOF is on."""
        aof = self.redis.config_get("appendonly").get("appendonly")
        return {"url": self.url, "appendonly": aof, "jobs": self.redis.zcard(self._key("jobs"))}

