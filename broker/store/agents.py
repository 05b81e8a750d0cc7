"""The store's side of the agent channel: agent records and their leases, each agent's assignment stream and log
stream, and agents' views of their jobs (the report stream they answer on: report_stream.py). Store inherits it;
the key schema is at the top of jobs.py."""

from __future__ import annotations

import functools
import hmac
import json
import logging
import os
import secrets
import time
from datetime import datetime

import redis

from broker.domain.model import AgentInfo, Job
from broker.domain.offer import Offer

log = logging.getLogger(__name__)

AGENT_GROUP = "agent"
STREAM_MAXLEN = 1_000_000  # the event streams are capped (approximately) so Redis memory stays bounded
LOG_MAXLEN = 20_000  # batches of output lines kept per agent (approximately)
OWN_TTL_S = 7 * 24 * 3600  # an agent's view of a job outlives any run of it
REFUSAL_TTL_S = 24 * 3600  # why an agent was refused is kept for it (and a restart of it) to read
ADMISSION_KEPT_S = 24 * 3600  # a removed agent's admission waits this long for its process to register again
# The server's write of an agent's job and fence (ARGV[2]: the record it read, ARGV[1], with them): the record as
# given if the stored one is still the one read; else, if it is still that registration's (report key ARGV[3], JSON:
# a string or null), the stored one with the job and fence set (the agent changed its offer since the read).
SET_AGENT_JOB = """
local raw = redis.call('GET', KEYS[1])
if raw == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
local parsed, record = pcall(cjson.decode, raw or '')
if parsed and type(record) == 'table' and cjson.encode(record['report_key']) == ARGV[3] then
  local given = cjson.decode(ARGV[2])
  record['job'], record['fence'] = given['job'], given['fence']
  redis.call('SET', KEYS[1], cjson.encode(record))
  return 1
end
return 0
"""


class AgentChannels:
    """Agents, leases, assignments, reports and views; needs the Store's `redis`, `_key` and `_report_keys`."""

    def ownership(self, agent_id: str, job_id: str) -> dict | None:
        """The agent's view of a job (see _tell_agents), or None when it was never given the job."""
        return _view(self.redis.get(self._key("own", agent_id, job_id)))

    def ownerships(self, pairs: list[tuple[str, str]]) -> list[dict | None]:
        """The views of many (agent, job) pairs in one round trip (a simulated fleet's agents)."""
        raws = self.redis.mget([self._key("own", agent, job) for agent, job in pairs]) if pairs else []
        return [_view(raw) for raw in raws]

    def _tell_agents(self, pipe, before: Job, job: Job) -> None:
        """Rewrite the view of the job held by each agent it runs or ran on (in the job's transaction)."""
        run = job.current_run
        for agent in {r.agent for r in (before.current_run, run) if r is not None}:
            mine = run is not None and run.agent == agent
            view = {
                "fence": job.fence,
                "mine": mine,
                "started": mine and run.started_at is not None,
                "move": job.move_requested,
                "checkpoint": run.checkpoint_requested_at.isoformat() if mine and run.checkpoint_requested_at else None,
                "terminal": job.state.terminal,
            }
            pipe.set(self._key("own", agent, job.id), json.dumps(view), ex=OWN_TTL_S)

    def tell_never_given_ended(self, agent_id: str, job_id: str) -> None:
        """Give an agent started for a job that ended before the agent was given it a view that says so (it has
        none to leave by: Agent._own_job_ended); a view it holds already is kept."""
        view = {"fence": 0, "mine": False, "started": False, "move": False, "checkpoint": None, "terminal": True}
        self.redis.set(self._key("own", agent_id, job_id), json.dumps(view), ex=OWN_TTL_S, nx=True)

    # -- agents -------------------------------------------------------------------------

    def register_agent(self, agent: AgentInfo, lease_ms: int) -> None:
        """Record the agent, its lease and its assignment stream's consumer group. The record gets the key
        this process's reports will carry: agent-events names no writer, so the broker checks the key."""
        key = self._report_keys.setdefault(agent.id, secrets.token_hex(16))
        agent = agent.model_copy(update={"report_key": key})
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self._key("agent", agent.id), agent.model_dump_json())
            pipe.sadd(self._key("agents"), agent.id)
            pipe.set(self._key("lease", agent.id), agent.pid, px=lease_ms)
            pipe.execute()
        try:
            self.redis.xgroup_create(self._key("assign", agent.id), AGENT_GROUP, id="0", mkstream=True)
        except redis.ResponseError as err:  # BUSYGROUP: it exists (a restarted agent)
            if "BUSYGROUP" not in str(err):
                raise

    def set_agent_offer(self, agent_id: str, offer: Offer) -> bool:
        """Replace a registered agent's offer (its measured speed changed), keeping the rest of its record and
        its lease; False when the agent is not registered. The server's writes of its job and fence keep it
        (set_agent_job)."""
        key = self._key("agent", agent_id)

        def replace(pipe) -> bool:
            agent = agent_info(pipe.get(key))
            if agent is None:
                return False
            pipe.multi()
            pipe.set(key, agent.model_copy(update={"offer": offer}).model_dump_json())  # the key watched: as read
            return True

        return self.redis.transaction(replace, key, value_from_callable=True)

    def refuse_agent(self, agent: AgentInfo, why: str) -> None:
        """Remove an agent the broker will not give work, leaving it why for a day (`refusal`): it exits saying so,
        where it crashed on its deleted stream or registered again and again. The host and pid name the process
        refused, so a later one of the same id does not read an old refusal as its own."""
        self.remove_agent(agent.id, refusal={"why": why, "host": agent.host, "pid": agent.pid})

    def refusal(self, agent_id: str) -> dict | None:
        """Why the broker refused this agent id (refuse_agent), or None."""
        raw = self.redis.get(self._key("refused", agent_id))
        return json.loads(raw) if raw else None

    def refusals(self) -> dict[str, str]:
        """Why each agent refused in the last day was refused (agent id -> reason): `broker check` names them, since
        a refused agent is gone from the agents and its own output may be on a machine nobody reads."""
        keys = sorted(self.redis.scan_iter(match=self._key("refused", "*"), count=1000))
        raws = self.redis.mget(keys) if keys else []
        start = len(self._key("refused", ""))
        return {key[start:]: json.loads(raw)["why"] for key, raw in zip(keys, raws) if raw}

    def renew_lease(self, agent_id: str, lease_ms: int, leaving: bool = False) -> bool:
        """Extend the agent's lease (marked leaving, as `mark_leaving`, when it is going away); False if it had
        already expired (the broker may have moved its job)."""
        return bool(self.redis.set(self._key("lease", agent_id), "leaving" if leaving else 1, px=lease_ms, xx=True))

    def claim_agent_start(self, agent_id: str, ttl_ms: int) -> bool:
        """Whether this process may start agent `agent_id`: False while another holds the claim (two `broker run JOB`
        of one waiting job started one id twice, the second's record taking the first's). Held until the agent has
        registered (release_agent_start), or `ttl_ms` if its starter dies first."""
        return bool(self.redis.set(self._key("starting", agent_id), os.getpid(), nx=True, px=ttl_ms))

    def release_agent_start(self, agent_id: str) -> None:
        self.redis.delete(self._key("starting", agent_id))

    def lease_alive(self, agent_id: str) -> bool:
        return bool(self.redis.exists(self._key("lease", agent_id)))

    def leases(self, agent_ids: list[str]) -> dict[str, str | None]:
        """Each agent's lease value in one round trip: None when lapsed, "leaving" when going away."""
        values = self.redis.mget([self._key("lease", i) for i in agent_ids]) if agent_ids else []
        return dict(zip(agent_ids, values))

    def mark_leaving(self, agent_id: str) -> None:
        """The agent's instance is going away: keep its lease (its reports still count) but give it no work."""
        self.redis.set(self._key("lease", agent_id), "leaving", xx=True, keepttl=True)

    def agents(self) -> list[AgentInfo]:
        """Every registered agent (alive or not: check lease_alive)."""
        return [agent for agent, _ in self.agents_with_leases()]

    def agents_with_leases(self) -> list[tuple[AgentInfo, str | None]]:
        """Every registered agent with its lease's value (as `leases`), records and leases in one MGET (a server
        round reads them every time it dispatches)."""
        ids = sorted(self.redis.smembers(self._key("agents")))
        if not ids:
            return []
        raws = self.redis.mget([self._key("agent", i) for i in ids] + [self._key("lease", i) for i in ids])
        records = map(agent_info, raws[: len(ids)])
        return [(agent, lease) for agent, lease in zip(records, raws[len(ids) :]) if agent is not None]

    def admitted(self, agents: list[AgentInfo]) -> set[str]:
        """The ids of those agents whose process (its report key) the broker admitted already. One back after its
        removal (its lease lapsed: a partition, a pause) is admitted again, for as long as it stays."""
        if not agents:
            return set()
        with self.redis.pipeline(transaction=False) as pipe:
            for agent in agents:
                pipe.get(self._key("admitted", agent.id))
                pipe.ttl(self._key("admitted", agent.id))
            replies = pipe.execute()
        found = set()
        for agent, key, ttl in zip(agents, replies[::2], replies[1::2]):
            if key and agent.report_key and hmac.compare_digest(key, agent.report_key):
                found.add(agent.id)
                if ttl >= 0:  # kept since its removal: registered again, it keeps it (a write only then)
                    self.redis.persist(self._key("admitted", agent.id))
        return found

    def admit(self, agent: AgentInfo) -> None:
        """Remember that this process's token verified: it is not asked again while the process lives (a new process
        of the same id is: its report key differs)."""
        if agent.report_key:
            self.redis.set(self._key("admitted", agent.id), agent.report_key)

    def working_agents(self) -> list[AgentInfo]:
        """The registered agents that take work: lease alive and not leaving."""
        return [agent for agent, lease in self.agents_with_leases() if lease not in (None, "leaving")]

    def get_agent(self, agent_id: str) -> AgentInfo | None:
        """The agent's record; None when there is none or it does not parse (an agent writes its own)."""
        return agent_info(self.redis.get(self._key("agent", agent_id)))

    def get_agents(self, agent_ids: list[str]) -> dict[str, AgentInfo]:
        """The records of these agents (one MGET); ids without a parsable record are left out."""
        raws = self.redis.mget([self._key("agent", i) for i in agent_ids]) if agent_ids else []
        return {a.id: a for a in map(agent_info, raws) if a is not None}

    def set_agent_job(self, pipe, agent: AgentInfo, job: str | None, fence: int | None) -> None:
        """Queue, on a transaction pipeline (with the job's change), the server's part of an agent's record: the job
        it runs and its fence, on `agent` as the server read it. Written only while the stored record is still that
        registration's (the same report key): a process that registered again since (a restart) keeps its own record,
        and the key its reports carry; an offer the agent changed since the read is kept (SET_AGENT_JOB)."""
        given = agent.model_copy(update={"job": job, "fence": fence}).model_dump_json()
        pipe.execute_command(  # EVAL by name: a cluster's pipeline has no eval()
            "EVAL",
            SET_AGENT_JOB,
            1,
            self._key("agent", agent.id),
            agent.model_dump_json(),
            given,
            json.dumps(agent.report_key),
        )

    def remove_agent(self, agent_id: str, refusal: dict | None = None, lapsed: bool = False) -> bool:
        """Delete the agent's record, lease and stream; its admission is kept a day for the process to come back in.
        With `refusal` the admission goes, and the agent is left why, in the same transaction. When it went is kept
        (`{p}removed`): its log stream goes with the jobs it ran (store/retention.py). With `lapsed`, only while its
        lease is still lapsed (False: the agent registered again since the lapse was read)."""
        with self.redis.pipeline(transaction=True) as pipe:
            if lapsed:
                pipe.watch(self._key("lease", agent_id))
                if pipe.exists(self._key("lease", agent_id)):
                    return False
                pipe.multi()
            keys = [self._key(kind, agent_id) for kind in ("agent", "lease", "assign")]
            pipe.execute_command("DEL", *keys)  # one command: a cluster pipeline's delete takes one key
            pipe.srem(self._key("agents"), agent_id)
            pipe.zadd(self._key("removed"), {agent_id: time.time()})
            if refusal is not None:
                pipe.delete(self._key("admitted", agent_id))
                pipe.set(self._key("refused", agent_id), json.dumps(refusal), ex=REFUSAL_TTL_S)
            else:
                pipe.expire(self._key("admitted", agent_id), ADMISSION_KEPT_S)
            try:
                pipe.execute()
            except redis.WatchError:
                return False
        return True

    # -- streams ------------------------------------------------------------------------

    def assign(self, pipe, agent_id: str, job: Job) -> None:
        """Queue an assignment on a transaction pipeline (with the job's new run): all the agent needs to run it."""
        run = job.current_run
        fields = {
            "job": job.id,
            "fence": job.fence,
            "run": run.id,
            "resume_from": run.resume_from or "",
            "spec": job.spec.model_dump_json(),
        }
        pipe.xadd(self._key("assign", agent_id), fields)

    def read_assignment(self, agent_id: str, block_ms: int, pending: bool = True) -> tuple[str, dict, bool] | None:
        """The next assignment for the agent, as (entry id, fields, whether it was read before): with `pending`,
        redelivered ones (read, never acked) first; then new ones. `pending=False` skips that read, for an agent
        that holds none (it found none and took none since)."""
        stream = self._key("assign", agent_id)
        for start in ("0", ">") if pending else (">",):
            reply = self.redis.xreadgroup(
                AGENT_GROUP, agent_id, {stream: start}, count=1, block=None if start == "0" else block_ms
            )
            entries = reply[0][1] if reply else []
            if entries and entries[0][1]:
                return entries[0][0], entries[0][1], start == "0"
        return None

    def ack_assignment(self, agent_id: str, entry_id: str) -> None:
        self.redis.xack(self._key("assign", agent_id), AGENT_GROUP, entry_id)

    def append_log(self, agent_id: str, job_id: str, fence: int, lines: list[str]) -> None:
        """A batch of the job's output lines, to the agent's own log stream (its ACL user may write nothing else)."""
        if lines:
            fields = {"job": job_id, "fence": fence, "lines": "\n".join(lines)}
            self.redis.xadd(self._key("log", agent_id), fields, maxlen=LOG_MAXLEN, approximate=True)

    def log_trimmed_after(self, agent_id: str, since: datetime) -> bool:
        """Whether the agent's log stream, capped at about LOG_MAXLEN batches, dropped batches newer than `since`:
        a run that started then may lack its first lines there (the agent's own log file keeps them all)."""
        try:
            info = self.redis.xinfo_stream(self._key("log", agent_id))
        except redis.ResponseError:  # nothing logged yet
            return False
        first = info.get("first-entry")
        trimmed = int(info.get("entries-added") or 0) > int(info.get("length") or 0)  # Redis 7 counts the added
        return trimmed and first is not None and int(str(first[0]).split("-")[0]) > since.timestamp() * 1000

    def read_log(self, agent_id: str, job_id: str, fence: int, after: str = "0") -> tuple[str, list[str]]:
        """Output lines of one run (the job's `fence` on this agent) logged after the entry id `after`; returns the
        newest entry id read (to continue from) and the lines."""
        entries = self.redis.xrange(self._key("log", agent_id), f"({after}" if after != "0" else "-", "+")
        lines = []
        for entry_id, fields in entries:
            after = entry_id
            if fields.get("job") == job_id and fields.get("fence") == str(fence):
                lines += fields.get("lines", "").split("\n")
        return after, lines


@functools.lru_cache(maxsize=4096)
def agent_info(raw: str | None) -> AgentInfo | None:
    """The record parsed, once for each stored text: a server reads every idle agent's record every round."""
    try:
        return AgentInfo.model_validate_json(raw) if raw else None
    except ValueError:
        log.warning("agent record malformed: %.80r", raw)
        return None


def _view(raw: str | None) -> dict | None:
    try:
        view = json.loads(raw) if raw else None
        return view if isinstance(view, dict) and isinstance(view.get("fence"), int) else None
    except ValueError:
        return None
