"""The report stream (`{p}agent-events`): agents' reports to the broker, authenticated by the key the agent
registered, and new jobs' wakes; the broker replicas read it as one consumer group. Store inherits it."""

from __future__ import annotations

import hmac
import json
import logging
import time

import redis

from broker.domain.model import AgentInfo
from broker.store.agents import AGENT_GROUP, STREAM_MAXLEN, agent_info

log = logging.getLogger(__name__)

BROKER_GROUP = "broker"
WAKE = "submitted"  # a report-stream entry with no agent: a job joined the queue (ReportStream.wake)


class ReportStream:
    """Reports and wakes in, and the replicas' reads and acks; needs the Store's `redis`, `_key` and `_report_keys`."""

    def report(self, agent_id: str, job_id: str, fence: int, kind: str, ack: str | None = None, **data) -> str:
        """An agent's event for the broker (started, progress, checkpoint, notice, exited); `at` is when it happened.
        With `ack`, that assignment entry is acknowledged in the same transaction (a start's report and its ack:
        one round trip and one write to disk; a connection lost on the way leaves neither)."""
        data.setdefault("at", time.time())
        fields = {"agent": agent_id, "job": job_id, "fence": fence, "type": kind, "data": json.dumps(data, default=str)}
        if agent_id in self._report_keys:
            fields["key"] = self._report_keys[agent_id]
        if ack is None:
            return self.redis.xadd(self._key("agent-events"), fields, maxlen=STREAM_MAXLEN, approximate=True)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self._key("agent-events"), fields, maxlen=STREAM_MAXLEN, approximate=True)
            pipe.xack(self._key("assign", agent_id), AGENT_GROUP, ack)
            return pipe.execute()[0]

    def wake(self, pipe, job_id: str) -> None:
        """Queue a nudge on the report stream, in the transaction that queues the job: a server waiting there for
        reports reads it and dispatches the job now, not at the end of its wait. It is no report (no agent):
        read_reports acks it and leaves it out."""
        pipe.xadd(self._key("agent-events"), {"type": WAKE, "job": job_id}, maxlen=STREAM_MAXLEN, approximate=True)

    def _ensure_broker_group(self) -> None:
        try:
            self.redis.xgroup_create(self._key("agent-events"), BROKER_GROUP, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise

    def read_reports(
        self,
        consumer: str,
        count: int = 200,
        block_ms: int | None = None,
        reclaim_idle_ms: int = 30_000,
        recover: bool = True,
    ) -> list[tuple[str, dict]]:
        """Agent events for this broker replica. With `recover`, first its own unacked ones (a round that failed
        after reading) and stale ones of dead replicas; then, if none, new ones. A server recovers only when it
        may have left some and now and then (core/server.py): each is a round trip of every round otherwise."""
        stream = self._key("agent-events")
        entries = []
        if recover:
            self._ensure_broker_group()
            mine = self.redis.xreadgroup(BROKER_GROUP, consumer, {stream: "0"}, count=count)
            entries = [e for e in (mine[0][1] if mine else []) if e[1]]
            _, claimed, _ = self.redis.xautoclaim(stream, BROKER_GROUP, consumer, reclaim_idle_ms, "0-0", count=count)
            entries += [e for e in claimed if e[1] and e[0] not in {x[0] for x in entries}]
        page = None  # new entries: until a report comes or none are left (a burst of wakes may hide reports)
        while all(is_wake(fields) for _, fields in entries) and (page is None or len(page) == count):
            page = self._read_new(consumer, count, block_ms if page is None else None)
            entries += page
        wakes = [entry_id for entry_id, fields in entries if is_wake(fields)]
        parsed = [(entry_id, _parse_report(fields)) for entry_id, fields in entries if not is_wake(fields)]
        named = sorted({report["agent"] for _, report in parsed if report is not None})
        with self.redis.pipeline(transaction=False) as pipe:  # one round trip: the wakes acked, the agents read
            if wakes:
                pipe.xack(stream, BROKER_GROUP, *wakes)
            if named:  # MGET by name: a cluster's pipeline refuses mget()
                pipe.execute_command("MGET", *(self._key("agent", i) for i in named))
            replies = pipe.execute() if wakes or named else []
        records = dict(zip(named, map(agent_info, replies[-1]))) if named else {}
        reports, dropped = [], []
        for entry_id, report in parsed:
            if report is not None and _authentic(report, records[report["agent"]]):
                reports.append((entry_id, report))
            else:
                dropped.append(entry_id)
        if dropped:  # broken, hostile or forged (another agent's name without its key): drop it, loudly
            log.warning("reports=dropped (malformed or forged) count=%d ids=%s", len(dropped), dropped[:5])
            self.ack_reports(dropped)
        return reports

    def _read_new(self, consumer: str, count: int, block_ms: int | None) -> list:
        """Entries no replica has read yet (waiting up to `block_ms` for one)."""
        try:
            new = self.redis.xreadgroup(
                BROKER_GROUP, consumer, {self._key("agent-events"): ">"}, count=count, block=block_ms
            )
        except redis.ResponseError as err:  # NOGROUP: the stream is new (or was cleared); nothing to read yet
            if "NOGROUP" not in str(err):
                raise
            self._ensure_broker_group()
            return []
        return new[0][1] if new else []

    def ack_reports(self, entry_ids: list[str]) -> None:
        self.redis.xack(self._key("agent-events"), BROKER_GROUP, *entry_ids)


def is_wake(fields: dict) -> bool:
    """Whether a report-stream entry is a new job's wake, not an agent's report."""
    return fields.get("type") == WAKE and "agent" not in fields


def _authentic(report: dict, agent: AgentInfo | None) -> bool:
    """Whether the report carries the key of the agent it names (records without a key predate keys)."""
    return agent is None or agent.report_key is None or hmac.compare_digest(report.get("key", ""), agent.report_key)


def _parse_report(fields: dict) -> dict | None:
    """An agent report with its fence as int and data as a dict, or None when malformed."""
    try:
        data = json.loads(fields["data"])
        report = {
            "agent": fields["agent"],
            "job": fields["job"],
            "type": fields["type"],
            "fence": int(fields["fence"]),
            "data": data,
            "key": str(fields.get("key", "")),
        }
    except (KeyError, TypeError, ValueError):
        return None
    return report if isinstance(data, dict) else None
