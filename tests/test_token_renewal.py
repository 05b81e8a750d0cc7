"""Token renewal (core/renewal.py): an admitted agent process is given a token of its own before its token ends, and
keeps it where its restarts read it. A pool's token (a week by default) used to end under running instances: any
restart after it (a crash, a Redis outage that outlasted the agent's retries, a reboot) was refused, for good, and its
instance idled on, billed."""

import os
import stat
from datetime import UTC, datetime, timedelta

from typer.testing import CliRunner

from broker import planning
from broker.agents.agent import Agent
from broker.agents.checkpoints import CheckpointStore
from broker.agents.contract import newest_token
from broker.agents.tokens import RENEWED_FOR, due, issue, issue_pool, longest, read_file, refusal
from broker.app.cli.main import app
from broker.app.cli.services import kept_token
from broker.core.broker import Broker
from broker.core.clock import ManualClock
from broker.core.server import BrokerServer
from broker.domain.model import AgentInfo
from broker.store.jobs import Store
from broker.store.renewals import renewed_token
from broker.store.shards import ShardedStore, shard_of
from conftest import make_spec

SECRET = "a-secret-of-24-characters"


def offer_of(catalog):
    return next(o for o in catalog.offers if o.accelerator == "A100" and o.accelerator_count == 1)


def test_a_restart_after_the_pools_token_ended_registers_with_the_token_renewed_for_its_process(
    store, redis_url, catalog, tmp_path
):
    now = datetime.now(UTC)
    clock = ManualClock(now)
    server = BrokerServer(store, planning.get(), clock, CheckpointStore(str(tmp_path)), agent_secret=SECRET)
    pool_token, kept = issue_pool(SECRET, "gpu", now + timedelta(hours=2)), tmp_path / "state" / "agent-token"
    agent = Agent(
        store,
        "gpu.host1",
        offer_of(catalog),
        str(tmp_path / "ckpt"),
        tmp_path / "runs",
        heartbeat_s=0.0,
        lease_s=600.0,
        token=pool_token,
        token_file=kept,
    )
    agent.register()
    server.step()  # admitted
    server.step()  # its token ends within a day: a token of its own
    renewed = renewed_token(store, "gpu.host1")
    assert renewed and refusal(SECRET, "gpu.host1", renewed, now + RENEWED_FOR - timedelta(minutes=1)) is None
    assert 0 < store.redis.ttl(store.key("renewed", "gpu.host1")) <= RENEWED_FOR.total_seconds()
    agent.step(block_ms=10)  # its heartbeat takes it
    assert agent.token == renewed and read_file(kept) == renewed
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600 and os.listdir(kept.parent) == ["agent-token"]
    server.step()
    assert renewed_token(store, "gpu.host1") == renewed  # not issued again while it lasts

    clock.advance(hours=3)  # the pool's token has ended; the agent process dies and its unit restarts it
    store.redis.delete(store.key("lease", "gpu.host1"))
    server.step()  # removed
    restarted = Store(redis_url)  # a new process: a new report key, checked again
    token = kept_token(pool_token, kept)  # `broker agent --token-file` reads the later one
    assert token == renewed
    restarted.register_agent(
        AgentInfo(id="gpu.host1", offer=offer_of(catalog), host="h", pid=9, registered_at=now, token=token), 600_000
    )
    job = Broker(store, catalog, planning.get(), clock).submit(make_spec())
    assert server.dispatch() == [(job.id, "gpu.host1")] and store.refusal("gpu.host1") is None

    Store(redis_url).register_agent(  # the pool's token alone is refused, as before: what the renewal saved it from
        AgentInfo(id="gpu.host2", offer=offer_of(catalog), host="h", pid=10, registered_at=now, token=pool_token),
        600_000,
    )
    server.step()
    assert "expired" in store.refusal("gpu.host2")["why"]


def test_only_live_admitted_processes_whose_token_is_due_are_renewed(store, redis_url, catalog, tmp_path):
    now = datetime.now(UTC)
    clock = ManualClock(now)
    server = BrokerServer(store, planning.get(), clock, CheckpointStore(str(tmp_path)), agent_secret=SECRET)
    for agent_id, hours in (("far", 72), ("near", 2), ("forged", 2)):
        token = issue(
            SECRET if agent_id != "forged" else "another-secret-of-24-chars", agent_id, now + timedelta(hours=hours)
        )
        store.register_agent(
            AgentInfo(id=agent_id, offer=offer_of(catalog), host="h", pid=1, registered_at=now, token=token), 600_000
        )
    server.step()
    server.step()
    assert renewed_token(store, "near") and renewed_token(store, "far") is None  # 3 days left: not due
    assert renewed_token(store, "forged") is None and store.refusal("forged") is not None  # refused, not renewed
    first = renewed_token(store, "near")
    clock.advance(hours=72)  # "far" is due now; "near"'s renewed token is not
    server.step()
    assert renewed_token(store, "far") and renewed_token(store, "near") == first
    clock.advance(hours=RENEWED_FOR / timedelta(hours=1) - 72 - 12)  # "near"'s renewed token ends within a day: another
    server.step()
    assert renewed_token(store, "near") not in (None, first)
    replaced = "a-new-secret-of-24-characters"  # BROKER_AGENT_SECRET replaced: admitted processes get new tokens
    BrokerServer(store, planning.get(), clock, CheckpointStore(str(tmp_path)), agent_secret=replaced).step()
    assert refusal(replaced, "near", renewed_token(store, "near"), clock.now()) is None


def test_tokens_are_due_a_day_before_they_end_and_the_longest_one_is_kept():
    now = datetime(2026, 11, 30, tzinfo=UTC)
    week, hour = issue(SECRET, "a", now + timedelta(days=7)), issue(SECRET, "a", now + timedelta(hours=1))
    assert not due(week, now) and due(hour, now) and due(hour, now + timedelta(hours=2)) and not due(None, now)
    assert longest(hour, week) == week == longest(week, None, hour) and longest(None, None) is None
    assert longest(issue_pool(SECRET, "p", now + timedelta(days=8)), week).startswith("pool:p:")


def test_an_unreadable_token_file_is_one_line_naming_the_option(tmp_path):
    result = CliRunner().invoke(app, ["agent", "--id", "a", "--offer", "x", "--token-file", str(tmp_path)])
    assert result.exit_code == 2 and "--token-file: cannot read" in result.stderr, result.output
    assert "Traceback" not in result.output


def test_a_refused_token_kept_in_the_token_file_is_removed_so_the_next_start_uses_token(store, catalog, tmp_path):
    """A kept token signed with a secret since replaced would be chosen over a new --token (it lasts longer)."""
    import pytest

    from broker.agents.tokens import write_file
    from broker.domain.errors import RefusedError

    now = datetime.now(UTC)
    kept, given = tmp_path / "agent-token", issue(SECRET, "a", now + timedelta(hours=1))
    write_file(kept, issue("the-secret-before-this-one", "a", now + timedelta(days=5)))
    server = BrokerServer(store, planning.get(), ManualClock(now), CheckpointStore(str(tmp_path)), agent_secret=SECRET)
    agent = Agent(
        store,
        "a",
        offer_of(catalog),
        str(tmp_path / "ckpt"),
        tmp_path / "runs",
        heartbeat_s=0.0,
        token=kept_token(given, kept),
        token_file=kept,
    )
    agent.register()
    server.step()
    with pytest.raises(
        RefusedError, match=f"does not match this agent id; .*{kept.name} held that token and is removed"
    ):
        agent.step(block_ms=10)
    assert not kept.exists() and kept_token(given, kept) == given


def test_a_pool_s_new_instance_after_the_pool_s_token_ended_registers_with_the_token_renewed_for_the_pool(
    redis_url, catalog, tmp_path
):
    """A spot pool replaces the instances it loses; each new one boots with the token `broker agents provision` wrote
    into the pool's boot data, a week's: after that week every instance the pool started was refused, billed idle."""
    now = datetime.now(UTC)
    clock = ManualClock(now)
    store = ShardedStore(redis_url, "broker:", 2)
    servers = [
        BrokerServer(shard, planning.get(), clock, CheckpointStore(str(tmp_path)), agent_secret=SECRET)
        for shard in store.shards
    ]
    names = [f"gpu.host{i}" for i in range(20)]
    member = names[0]
    newcomer = next(n for n in names if shard_of(n, 2) != shard_of(member, 2))  # the token is read in any shard
    pool_token = issue_pool(SECRET, "gpu", now + timedelta(hours=2))
    for agent_id, token in ((member, pool_token), ("solo", issue(SECRET, "solo", now + timedelta(hours=2)))):
        store.of_agent(agent_id).register_agent(
            AgentInfo(id=agent_id, offer=offer_of(catalog), host="h", pid=1, registered_at=now, token=token), 600_000
        )
    for _ in range(2):  # admitted, then renewed: a day is left
        for server in servers:
            server.step()
    assert renewed_token(store.of_agent("solo"), "solo").startswith(f"{int((now + RENEWED_FOR).timestamp())}.")

    clock.advance(hours=3)  # the pool's token has ended; the pool starts a new instance, with it in its boot data
    token = newest_token(store, newcomer, pool_token)
    assert token != pool_token and refusal(SECRET, newcomer, token, clock.now()) is None
    assert refusal(SECRET, "cpu.host1", token, clock.now()) is not None  # another pool's agents: not admitted
    assert token == renewed_token(store.of_agent(member), member)  # what its running members restart with
    store.of_agent(newcomer).register_agent(
        AgentInfo(id=newcomer, offer=offer_of(catalog), host="h2", pid=2, registered_at=now, token=token), 600_000
    )
    servers[shard_of(newcomer, 2)].step()
    assert store.of_agent(newcomer).refusal(newcomer) is None and newcomer in {a.id for a in store.agents()}
    solo = newest_token(store, "solo", issue(SECRET, "solo", now + timedelta(hours=2)))  # no --token-file: Redis's
    assert solo == renewed_token(store.of_agent("solo"), "solo") and refusal(SECRET, "solo", solo, clock.now()) is None

    replaced = "a-new-secret-of-24-characters"  # BROKER_AGENT_SECRET replaced: the pool's token is issued again
    for server in servers:
        server.agent_secret = replaced
        server.step()
    assert refusal(replaced, names[-1], newest_token(store, names[-1], pool_token), clock.now()) is None


def test_a_renewed_token_an_agent_is_refused_with_is_not_chosen_at_its_next_start(store, redis_url, catalog, tmp_path):
    """One signed with a secret since replaced, where no process of the agent or pool was alive to be given another,
    outlasts the token given: each restart would be refused with it, for good."""
    from broker.store.renewals import put_pool_token, put_renewed

    now = datetime.now(UTC)
    server = BrokerServer(store, planning.get(), ManualClock(now), CheckpointStore(str(tmp_path)), agent_secret=SECRET)
    stale, until = "the-secret-before-this-one", now + timedelta(days=5)
    put_renewed(store, "solo", issue(stale, "solo", until), until)
    put_pool_token(store, "gpu", issue_pool(stale, "gpu", until), until)
    sharded = ShardedStore(redis_url, "broker:", 1)
    given = {"solo": issue(SECRET, "solo", now + timedelta(hours=1)), "gpu.h1": issue_pool(SECRET, "gpu", now)}
    for agent_id, token in given.items():
        chosen = newest_token(sharded, agent_id, token)
        assert chosen != token  # the stale one outlasts it
        store.register_agent(
            AgentInfo(id=agent_id, offer=offer_of(catalog), host="h", pid=1, registered_at=now, token=chosen), 600_000
        )
    server.step()
    assert store.refusal("solo") and store.refusal("gpu.h1")
    assert all(newest_token(sharded, agent_id, token) == token for agent_id, token in given.items())
    good = issue_pool(SECRET, "gpu", until)  # one refused for its name, not its pool's token: the pool keeps it
    put_pool_token(store, "gpu", good, until)
    store.register_agent(
        AgentInfo(id="gpuhost", offer=offer_of(catalog), host="h", pid=2, registered_at=now, token=good), 600_000
    )
    server.step()
    assert "named gpu.<host>" in store.refusal("gpuhost")["why"] and newest_token(sharded, "gpu.h2", None) is None
    assert newest_token(sharded, "gpu.h2", given["gpu.h1"]) == good


def test_a_refused_pool_token_is_forgotten_in_every_shard(redis_url, catalog, tmp_path):
    """A pool's agent takes the longest of its pool's tokens over all shards: one signed with a secret since replaced
    and left in another shard was taken again at each start, refused each time, until that shard renewed it."""
    from broker.store.renewals import pool_tokens, put_pool_token

    now = datetime.now(UTC)
    store = ShardedStore(redis_url, "broker:", 2)
    stale, good, until = "the-secret-before-this-one", issue_pool(SECRET, "gpu", now + timedelta(days=1)), now
    old = issue_pool(stale, "gpu", now + timedelta(days=5))
    for shard in store.shards:
        put_pool_token(shard, "gpu", old, until + timedelta(days=5))
    agent_id = next(f"gpu.host{i}" for i in range(20) if shard_of(f"gpu.host{i}", 2) == 1)
    assert newest_token(store, agent_id, good) == old  # the stale one outlasts the one given
    server = BrokerServer(
        store.of_agent(agent_id),
        planning.get(),
        ManualClock(now),
        CheckpointStore(str(tmp_path)),
        agent_secret=SECRET,
        shards=store.shards,
    )
    store.of_agent(agent_id).register_agent(
        AgentInfo(id=agent_id, offer=offer_of(catalog), host="h", pid=1, registered_at=now, token=old), 600_000
    )
    server.step()
    assert store.of_agent(agent_id).refusal(agent_id) is not None
    assert pool_tokens(store.shards, "gpu") == [None, None]  # in its own shard and the other
    assert newest_token(store, agent_id, good) == good  # its next start registers with the one it was given
