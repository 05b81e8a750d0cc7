"""A store split into shards, so Redis Cluster can spread it and server replicas can each plan a share of it.

A shard is a whole Store (jobs with their indexes and events, agents, leases, streams, its own planning lease)
whose keys all carry one hash tag, `{prefix}{n}:` with n in braces: every transaction of a shard stays in one
cluster slot. An agent belongs to the shard its id hashes to (crc32), and a job runs only on agents of its shard.
A new job's id is chosen to land in the shard with the most agents it fits per waiting job (`new_job_id`); a
waiting job whose shard has lost every agent that fits it moves to another (store/moves.py, core/rehoming.py), and
its home shard keeps a route to it, which `of_job` follows. What is
not a job's or an agent's (prices, bubble profiles, the replicas' heartbeats) lives in shard 0; the spot capacity
each shard's server saw stays in its shard (capacity.fleet_seen sums it). ShardedStore is the clients' view: it
writes a job to its shard and reads across all of them.

One shard on a single Redis keeps the untagged keys (`{prefix}job:...`, as before shards): a store written then
still reads. On a cluster every shard is tagged, one shard included.
"""

from __future__ import annotations

import heapq
import zlib
from datetime import datetime

import redis
from redis.cluster import RedisCluster

from broker.domain.errors import BrokerError, NotFoundError
from broker.domain.model import AgentInfo, Job, JobState
from broker.store.connection import patient_retry, redact_url, unreachable
from broker.store.jobs import DEFAULT_PREFIX, Store
from broker.store.layout import shard_count, shard_prefix, tagged
from broker.store.moves import ROUTE, parse_mark


def shard_of(name: str, count: int) -> int:
    """The shard a job or agent id belongs to (stable across processes and Python versions)."""
    return zlib.crc32(name.encode()) % count


def agent_id_in(name: str, shard: int, count: int) -> str:
    """An agent id in shard `shard` of `count`: `name`, or the first of name-1, name-2, ... that hashes there."""
    return next(n for n in (name, *(f"{name}-{k}" for k in range(1, 100 * count))) if shard_of(n, count) == shard)


def connect(url: str, outage_s: float = 0.0) -> redis.Redis | RedisCluster:
    """A client for the URL: a cluster client when the server it names runs in cluster mode."""
    options = {"decode_responses": True, "socket_connect_timeout": 3}
    if outage_s > 0:
        options |= {"retry": patient_retry(outage_s), "socket_keepalive": True}
    client = redis.Redis.from_url(url, **options)
    try:
        clustered = bool(client.execute_command("CLUSTER", "INFO"))
    except redis.ResponseError:  # cluster support disabled (or a user made before agents could ask): one server
        clustered = False
    except redis.ConnectionError as err:
        raise unreachable(url, err) from None
    if not clustered:
        return client
    client.close()
    return RedisCluster.from_url(url, **options)


class ShardedStore:
    """Jobs and agents over `count` shards (Store each); the methods clients use, routed or gathered."""

    def __init__(
        self,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        count: int | None = None,
        outage_s: float = 0.0,
        claim: bool = False,
    ):
        """`count`: BROKER_SHARDS, None when unset: the store's recorded layout then; `claim`: a server's, which
        records it (store/layout.py)."""
        if count is not None and count < 1:
            raise BrokerError(f"BROKER_SHARDS: {count} is not a shard count; set a whole number of at least 1")
        client = connect(url, outage_s)
        count = shard_count(client, prefix, count, claim)
        self.url, self.prefix, self.redis = redact_url(url), prefix, client
        keys = [shard_prefix(prefix, i, tagged(client, count)) for i in range(count)]
        self.shards = [Store(url, shard, outage_s, client=client) for shard in keys]
        self.key = self.shards[0].key  # prices, replicas' heartbeats and bubble profiles live in shard 0
        self.shards[0]._ensure_durable()

    def of_job(self, job_id: str) -> Store:
        """The shard the job is in: its home shard, or where the routes of its moves lead."""
        return self._route(job_id)[-1]

    def _route(self, job_id: str) -> list[Store]:
        """The shards from the job's home to where it is now (one read a shard: only moved jobs have routes)."""
        path, arrived = [self.shards[shard_of(job_id, len(self.shards))]], 0
        while len(self.shards) > 1 and len(path) <= len(self.shards):
            route = path[-1].redis.hget(path[-1].key(ROUTE), job_id)
            if route is None:
                break
            to, epoch = parse_mark(route)
            if arrived and epoch <= arrived:  # the route of an earlier stay: the job came back here since
                break
            path.append(self.shards[to])
            arrived = epoch
        return path

    def of_agent(self, agent_id: str) -> Store:
        return self.shards[shard_of(agent_id, len(self.shards))]

    def new_job_id(self, name: str, fitting: list[AgentInfo]) -> str:
        """An id for a new job (its name plus a random suffix) in the shard with the most of the `fitting` working
        agents per job waiting there: a job runs only on its own shard's agents, and a small fleet leaves some shards
        without any of a kind. Any shard when none fits."""
        job_id = self.shards[0].new_job_id(name, fitting)
        best = self.roomiest(fitting) if len(self.shards) > 1 else None
        while best is not None and shard_of(job_id, len(self.shards)) != best:  # one in `count` suffixes lands there
            job_id = self.shards[0].new_job_id(name, fitting)
        return job_id

    def roomiest(self, fitting: list[AgentInfo], waiting: list[int] | None = None) -> int | None:
        """The shard with the most of the `fitting` agents per job waiting there (`waiting`: the counts, when the
        caller has them); None when no shard has one."""
        agents = [0] * len(self.shards)
        for agent in fitting:
            agents[shard_of(agent.id, len(self.shards))] += 1
        waiting = waiting or [shard.pending_count() for shard in self.shards]
        room = [n / (1 + w) for n, w in zip(agents, waiting)]
        return room.index(max(room)) if any(agents) else None

    # -- one job or agent: its shard --------------------------------------------------------

    def add_job(self, job: Job) -> bool:
        return self.of_job(job.id).add_job(job)

    def get_job(self, job_id: str) -> Job:
        return self._at_job(job_id, lambda shard: shard.get_job(job_id))

    def _at_job(self, job_id: str, act):
        """act(shard) on the job's shard, and where its routes lead now if a move handed the job over between the
        routes' read and the act (the job is not gone: its client would say it is, and a cancel would be lost)."""
        shard = self.of_job(job_id)
        try:
            return act(shard)
        except NotFoundError:
            moved = self.of_job(job_id)
            if moved is shard:
                raise
            return act(moved)

    def job_id_for(self, given: str) -> str:
        """The id of the job a user named: the id itself, or the one job whose id starts with it (its name without
        the random suffix, say). Several such jobs, or none, is a one-line error that says what to give."""
        home = self.of_job(given)
        if home.redis.exists(home.key("job", given)):
            return given
        found = sorted({job_id for s in self.shards for job_id in s.redis.zrange(s.key("jobs"), 0, -1)})
        ids = [job_id for job_id in found if job_id.startswith(given)]
        if len(ids) == 1:
            return ids[0]
        if ids:
            shown = ", ".join(ids[:4]) + (f" and {len(ids) - 4} more" if len(ids) > 4 else "")
            raise NotFoundError(f"job: {given!r} begins {len(ids)} jobs' ids ({shown}); give more of the one you mean")
        raise NotFoundError(f"job: no job {given!r}; `broker list` shows the ids")

    def update_job(self, job_id: str, change, also=None, reason=None, emit=True, leader=None) -> Job | None:
        return self._at_job(job_id, lambda shard: shard.update_job(job_id, change, also, reason, emit, leader))

    def set_state(self, job_id: str, state: JobState, now: datetime, reason: str | None = None) -> Job:
        return self._at_job(job_id, lambda shard: shard.set_state(job_id, state, now, reason))

    def get_agent(self, agent_id: str) -> AgentInfo | None:
        return self.of_agent(agent_id).get_agent(agent_id)

    def ownership(self, agent_id: str, job_id: str) -> dict | None:
        return self.of_agent(agent_id).ownership(agent_id, job_id)

    def lease_alive(self, agent_id: str) -> bool:
        return self.of_agent(agent_id).lease_alive(agent_id)

    def read_log(self, agent_id: str, job_id: str, fence: int, after: str = "0") -> tuple[str, list[str]]:
        return self.of_agent(agent_id).read_log(agent_id, job_id, fence, after)

    def log_trimmed_after(self, agent_id: str, since: datetime) -> bool:
        return self.of_agent(agent_id).log_trimmed_after(agent_id, since)

    # -- all shards -------------------------------------------------------------------------

    def list_jobs(self, states: set[JobState] | None = None, limit: int | None = None) -> list[Job]:
        jobs = list(heapq.merge(*(s.list_jobs(states) for s in self.shards), key=lambda j: j.submitted_at))
        return jobs[-limit:] if limit else jobs

    def job_count(self) -> int:
        return sum(s.job_count() for s in self.shards)

    def recent_jobs(self, count: int = 200) -> list[Job]:
        """The `count` newest jobs of all shards, in submission order."""
        return self._read(self._ranked("jobs", count, lowest=False))

    def active_jobs(self) -> list[Job]:
        return [job for shard in self.shards for job in shard.active_jobs()]

    def unfinished_jobs(self) -> list[Job]:
        return sorted((job for shard in self.shards for job in shard.unfinished_jobs()), key=lambda j: j.submitted_at)

    def pending_jobs(self, start: int = 0, count: int = 200) -> list[Job]:
        """The most urgent waiting jobs of all shards, a page of them."""
        return self._read(self._ranked("pending", start + count, lowest=True)[start:])

    def _ranked(self, index: str, n: int, lowest: bool) -> list[tuple[float, str, Store]]:
        """The n lowest (or highest) scored ids of a sorted job index over all shards, in score order, as
        (score, id, shard): ids and scores are merged first, so only the page's jobs are read and parsed."""
        ranked = []
        for shard in self.shards if n > 0 else []:
            window = (0, n - 1) if lowest else (-n, -1)
            members = shard.redis.zrange(shard.key(index), *window, withscores=True)
            ranked += [(score, job_id, shard) for job_id, score in members]
        ranked.sort(key=lambda r: r[:2])
        return ranked[:n] if lowest else ranked[-n:]

    def _read(self, ranked: list[tuple[float, str, Store]]) -> list[Job]:
        found = {
            job.id: job for shard in self.shards for job in shard.jobs_by_id([i for _, i, s in ranked if s is shard])
        }
        return [found[job_id] for _, job_id, _ in ranked if job_id in found]

    def pending_count(self) -> int:
        return sum(s.pending_count() for s in self.shards)

    def events(self, job_id: str | None = None, count: int = 1000) -> list[dict]:
        """State-change events, oldest first (by stream id: milliseconds, then sequence)."""
        order = lambda e: tuple(map(int, e["id"].split("-")))  # noqa: E731
        shards = list(dict.fromkeys(self._route(job_id))) if job_id is not None else self.shards  # a moved job's too
        return list(heapq.merge(*(s.events(job_id, count) for s in shards), key=order))[:count]

    def agents(self) -> list[AgentInfo]:
        return [agent for shard in self.shards for agent in shard.agents()]

    def agents_with_leases(self) -> list[tuple[AgentInfo, str | None]]:
        return [pair for shard in self.shards for pair in shard.agents_with_leases()]

    def working_agents(self) -> list[AgentInfo]:
        return [agent for shard in self.shards for agent in shard.working_agents()]

    def refusals(self) -> dict[str, str]:
        return {agent: why for shard in self.shards for agent, why in shard.refusals().items()}

    def leases(self, agent_ids: list[str]) -> dict[str, str | None]:
        found: dict[str, str | None] = {}
        for index, shard in enumerate(self.shards):
            found |= shard.leases([a for a in agent_ids if shard_of(a, len(self.shards)) == index])
        return found

    def publish_jobs(self, source: Store, job_ids: list[str], tag: str) -> int:
        """Copy a namespace's ended jobs here, each to its shard (Store.publish_jobs)."""
        return sum(
            shard.publish_jobs(source, [j for j in job_ids if self.of_job(j) is shard], tag) for shard in self.shards
        )

    def clear_namespace(self) -> int:
        return sum(shard.clear_namespace() for shard in self.shards)
