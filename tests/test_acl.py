"""Redis ACL users (broker/acl.py) on a real redis-server with auth: the broker and two agents each on their
own user run jobs end to end, and an agent's credentials reach nothing but its own keys."""

import json
import logging
import sys
import time

import pytest
import redis
from test_stage_tokens import stage
from typer.testing import CliRunner

from broker import planning
from broker.agents.agent import Agent
from broker.agents.checkpoints import CheckpointStore
from broker.app.cli.main import app
from broker.app.demo import pick_agents
from broker.bubbles.agent import FillAgent
from broker.bubbles.capacity import bubble_offer
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.core.server import BrokerServer
from broker.domain.bubbles import stage_agent_id
from broker.domain.errors import BrokerError
from broker.domain.model import JobState
from broker.store import acl
from broker.store.jobs import Store
from broker.store.profiles import load_fill_stats, load_profiles, save_profile
from broker.store.shards import ShardedStore, shard_of
from conftest import make_spec, start_redis, stop_redis

P = "broker:"


@pytest.fixture
def admin_url(tmp_path):
    proc, port = start_redis(tmp_path, password="admin-pw")
    yield f"redis://:admin-pw@127.0.0.1:{port}/0"
    stop_redis(proc, port)


def test_broker_and_agents_run_jobs_on_their_own_users_and_an_agent_reaches_only_its_own_keys(
    admin_url, tmp_path, catalog, monkeypatch, caplog
):
    monkeypatch.setenv("BROKER_REDIS_URL", admin_url)
    made = CliRunner().invoke(app, ["acl", "broker", "--name", "planner"])
    assert made.exit_code == 0, made.output
    broker_url = made.output.strip()
    assert broker_url.startswith("redis://planner:") and broker_url.endswith(
        f"@127.0.0.1:{admin_url.rsplit(':', 1)[1]}"
    )
    urls = {name: acl.agent_user(admin_url, P, name) for name in ("alpha", "beta")}

    store = Store(broker_url)
    policy = planning.get()
    broker = Broker(store, catalog, policy, SystemClock())
    server = BrokerServer(store, policy, SystemClock(), CheckpointStore(str(tmp_path / "ckpt")), lease_s=1.0)
    offer = dict((name, o) for name, o, _ in pick_agents(catalog))["ondemand-a"]
    with caplog.at_level(logging.WARNING):  # an agent's user may not CONFIG, by design: nothing to warn of
        agents = {
            name: Agent(
                Store(url, prefix=P),
                name,
                offer,
                str(tmp_path / "ckpt"),
                tmp_path / "runs",
                heartbeat_s=0.2,
                lease_s=5.0,
            )
            for name, url in urls.items()
        }
    assert "appendonly" not in caplog.text
    jobs = {}
    for name, agent in agents.items():  # one job per agent: each registers, then its job is submitted and starts
        agent.register()
        spec = make_spec(
            name=f"job-{name}",
            run=[sys.executable, "-c", "import time; time.sleep(1); print('ok')"],
            env={"API_TOKEN": name},
            resources={"accelerators": ["L4:1"]},
            work={"gpu_hours": 0.1},
        )
        jobs[name] = broker.submit(spec).id
        deadline = time.monotonic() + 30
        while store.get_job(jobs[name]).state != JobState.running and time.monotonic() < deadline:
            server.round(block_ms=10)
            for registered in list(agents.values())[: len(jobs)]:
                registered.step(block_ms=10)
    deadline = time.monotonic() + 60
    while any(store.get_job(j).state != JobState.done for j in jobs.values()) and time.monotonic() < deadline:
        for agent in agents.values():
            agent.step(block_ms=10)
        server.round(block_ms=10)
    for name, job_id in jobs.items():
        job = store.get_job(job_id)
        assert job.state == JobState.done and [r.agent for r in job.runs] == [name]
        assert store.read_log(name, job_id, job.runs[0].fence)[1] == ["ok"]  # its output, by its own user

    alpha = redis.Redis.from_url(urls["alpha"], decode_responses=True)
    assert alpha.xreadgroup(
        "agent", "alpha", {f"{P}assign:alpha": "0"}
    )  # its own assignments (with its job's spec) it reads
    assert alpha.get(f"{P}own:alpha:{jobs['alpha']}") is not None
    assert alpha.get(f"{P}refused:alpha") is None  # why the broker refused it, were it refused, it may read
    assert alpha.get(f"{P}renewed:alpha") is None  # and the token the broker renews for it
    denied = [
        lambda: alpha.set(f"{P}refused:alpha", "{}"),  # ... and not write
        lambda: alpha.get(f"{P}refused:beta"),
        lambda: alpha.set(f"{P}renewed:alpha", "forged"),
        lambda: alpha.get(f"{P}renewed:beta"),  # another agent's token
        lambda: alpha.xrange(f"{P}assign:beta"),  # another agent's assignments
        lambda: alpha.xreadgroup("agent", "alpha", {f"{P}assign:beta": "0"}),
        lambda: alpha.get(f"{P}job:{jobs['beta']}"),  # any job spec, its own job's too
        lambda: alpha.get(f"{P}job:{jobs['alpha']}"),
        lambda: alpha.get(f"{P}own:beta:{jobs['beta']}"),
        lambda: alpha.get(f"{P}agent:beta"),  # another agent's registration (its token)
        lambda: alpha.xrange(f"{P}agent-events"),  # the events stream: write only
        lambda: alpha.set(f"{P}agent-events", "x"),  # ... by XADD only
        lambda: alpha.srem(f"{P}agents", "beta"),
        lambda: alpha.set(f"{P}lease:beta", "1"),
        lambda: alpha.xadd(f"{P}events", {"job": jobs["beta"]}),
        lambda: alpha.xadd(f"{P}log:beta", {"job": jobs["beta"], "fence": 1, "lines": "forged"}),
        lambda: alpha.xrange(f"{P}log:alpha"),  # its own log: write only
        lambda: alpha.keys("*"),
        lambda: alpha.config_set("appendonly", "no"),
        lambda: alpha.flushall(),
        lambda: alpha.acl_setuser("alpha", enabled=True, commands=["+@all"], keys=["*"]),
    ]
    for attempt in denied:
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()
    alpha.set(f"{P}agent:alpha", "{not json")  # its own record it may write: the server skips what does not parse
    server.round(block_ms=10)
    assert [a.id for a in store.agents()] == ["beta"] and store.get_agent("alpha") is None
    planner = redis.Redis.from_url(broker_url)
    for attempt in (
        planner.flushall,
        lambda: planner.acl_setuser("alpha", enabled=True),
        lambda: planner.get("other-app:key"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()


def test_bad_names_and_users_without_acl_rights_are_refused_in_one_line(admin_url, monkeypatch):
    monkeypatch.setenv("BROKER_REDIS_URL", admin_url)
    refused = CliRunner().invoke(app, ["acl", "agent", "--id", "a*"])
    assert refused.exit_code == 2 and "--id" in refused.output and len(refused.output.strip().splitlines()) == 1
    agent_url = acl.agent_user(admin_url, P, "gamma")
    with pytest.raises(BrokerError, match="admin user"):
        acl.agent_user(agent_url, P, "delta")
    assert redis.Redis.from_url(admin_url).acl_getuser("agent-delta") is None  # nothing created by the refused call


def test_a_users_command_run_with_an_agents_user_says_which_user_to_use(admin_url, monkeypatch):
    """On an agent's instance its URL is the one at hand: `broker check` or `broker list` with it was an internal
    error (NoPermissionError)."""
    monkeypatch.setenv("BROKER_REDIS_URL", acl.agent_user(admin_url, P, "gamma"))
    for args in (["check"], ["list"], ["list", "--json"]):
        result = CliRunner().invoke(app, args)
        said = result.stdout if "--json" in args else result.stderr
        assert result.exit_code == 2 and "internal error" not in said, said
        assert "its user 'agent-gamma' may not do this" in said and "`broker acl broker`" in said
    assert json.loads(result.stdout)["error"]["kind"] == "BrokerError"
    result = CliRunner().invoke(app, ["agent", "--id", "delta", "--offer", "aws/use1-az1/g4dn.xlarge/spot"])
    assert result.exit_code == 2 and "its user 'agent-gamma' may not do this" in result.stderr  # not its id's user
    assert "`broker acl agent`" in result.stderr and '{"id"' not in result.stderr  # not the record it tried to write


def test_a_removed_user_is_cut_off_and_its_password_admits_nobody(admin_url, monkeypatch):
    """A destroyed pool's or a retired agent's credentials should stop working: there was no command to do it."""
    monkeypatch.setenv("BROKER_REDIS_URL", admin_url)
    pool_url = CliRunner().invoke(app, ["acl", "agent", "--pool", "aws-g6"]).output.strip()
    pool = redis.Redis.from_url(pool_url)
    pool.set(f"{P}lease:aws-g6.h1", 1)  # connected, and allowed
    removed = CliRunner().invoke(app, ["acl", "remove", "--pool", "aws-g6"])
    assert removed.exit_code == 0 and "removed ACL user pool-aws-g6" in removed.output
    with pytest.raises((redis.exceptions.ConnectionError, redis.exceptions.AuthenticationError)):
        pool.set(f"{P}lease:aws-g6.h1", 1)  # its connection closed, and a new one refused
    with pytest.raises((redis.exceptions.AuthenticationError, redis.exceptions.ResponseError)):
        redis.Redis.from_url(pool_url).ping()
    for args, said in (
        (["--pool", "aws-g6"], "error: user: no ACL user 'pool-aws-g6' here"),
        (["--id", "a", "--pool", "b"], "error: --id/--pool/--name: give one"),
        (["--id", "a*"], "error: --id: 'a*' is not an agent id"),
    ):
        result = CliRunner().invoke(app, ["acl", "remove", *args])
        assert result.exit_code == 2 and result.output.startswith(said), result.output


def test_with_shards_an_agent_s_user_reaches_its_own_shard_s_keys(admin_url, monkeypatch):
    monkeypatch.setenv("BROKER_REDIS_URL", admin_url)
    monkeypatch.setenv("BROKER_SHARDS", "4")
    made = CliRunner().invoke(app, ["acl", "agent", "--id", "gamma"])
    assert made.exit_code == 0, made.output
    store = ShardedStore(made.output.strip(), P, 4).of_agent("gamma")  # as `broker agent` opens it
    assert store.prefix == f"{P}{{{shard_of('gamma', 4)}}}:"
    assert store.renew_lease("gamma", 1000) is False  # its own lease key in its shard: allowed (none yet)
    gamma = redis.Redis.from_url(made.output.strip())
    with pytest.raises(redis.exceptions.NoPermissionError):
        gamma.set(f"{P}lease:gamma", 1)  # the unsharded key is not its own
    redis.Redis.from_url(admin_url).set(f"{P}layout", 4)  # as `broker server` records it
    assert len(ShardedStore(made.output.strip(), P).shards) == 4  # BROKER_SHARDS unset: it follows the store
    with pytest.raises(redis.exceptions.NoPermissionError):
        gamma.set(f"{P}layout", 1)  # which it may read, not write


def test_on_a_cluster_an_agent_s_user_is_made_on_every_node_and_reaches_its_own_keys_there(cluster_url, monkeypatch):
    from redis.cluster import RedisCluster

    monkeypatch.setenv("BROKER_REDIS_URL", cluster_url)
    monkeypatch.setenv("BROKER_SHARDS", "3")
    made = CliRunner().invoke(app, ["acl", "agent", "--id", "delta"])
    assert made.exit_code == 0, made.output
    admin = RedisCluster.from_url(cluster_url)
    try:
        users = admin.execute_command("ACL", "USERS", target_nodes=RedisCluster.ALL_NODES)
        assert len(users) == 3 and all(b"agent-delta" in on_node for on_node in users.values())
        store = ShardedStore(made.output.strip(), P, 3).of_agent("delta")  # as `broker agent` opens it
        assert isinstance(store.redis, RedisCluster)
        assert store.renew_lease("delta", 1000) is False  # its own lease key, on whichever node: allowed
        upgraded = CliRunner().invoke(app, ["acl", "upgrade"])  # on every node, its password kept
        assert upgraded.output == "upgraded ACL users: agent-delta\n" and store.renew_lease("delta", 1000) is False
        prefixes = [shard.prefix for shard in ShardedStore(cluster_url, P, 3).shards]
        assert acl.current_users(cluster_url, prefixes) == {"agent-delta": True}  # asked on every node
        with pytest.raises(redis.exceptions.NoPermissionError):
            store.redis.get(f"{P}lease:delta")  # the unsharded key is not its own
        removed = CliRunner().invoke(app, ["acl", "remove", "--id", "delta"])
        assert removed.exit_code == 0 and removed.output == "removed ACL user agent-delta\n", removed.output
        users = admin.execute_command("ACL", "USERS", target_nodes=RedisCluster.ALL_NODES)
        assert not any(b"agent-delta" in on_node for on_node in users.values())  # gone from every node
    finally:
        admin.execute_command("ACL", "DELUSER", "agent-delta", target_nodes=RedisCluster.ALL_NODES)


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_pool_s_user_serves_every_stage_of_its_training_job_in_any_shard_and_reaches_nothing_else(
    admin_url, tmp_path, monkeypatch
):
    monkeypatch.setenv("BROKER_REDIS_URL", admin_url)
    monkeypatch.setenv("BROKER_SHARDS", "3")
    made = CliRunner().invoke(app, ["acl", "agent", "--pool", "llm"])
    assert made.exit_code == 0, made.output
    pool_url = made.output.strip()
    assert pool_url.startswith("redis://pool-llm:")
    ids = [stage_agent_id("llm", s) for s in range(4)]
    assert len({shard_of(i, 3) for i in ids}) == 3  # the stages' keys are in every shard
    stages = ShardedStore(pool_url, P, 3)  # as attach() opens it, with the one URL every rank is given
    agents = []
    for index, agent_id in enumerate(ids):
        profile = stage("llm", index)
        assert save_profile(stages.shards[0], profile)  # a stage publishes its profile, then serves its bubbles
        offer = bubble_offer(profile, "local", "local", "T4", min_window_s=0.01)
        checkpoints = CheckpointStore(str(tmp_path))
        agents.append(
            FillAgent(stages.of_agent(agent_id), checkpoints, profile, offer, 30.0, profiles=stages.shards[0])
        )
    admin = ShardedStore(admin_url, P, 3)
    try:
        for agent in agents:
            agent.start()
        assert sorted(a.id for a in admin.agents()) == ids
        assert all(admin.of_agent(i).lease_alive(i) for i in ids)
        assert sorted(p.stage for p in load_profiles(admin.shards[0])) == [0, 1, 2, 3]
    finally:
        for agent in agents:
            agent.stop()  # training ends: each leaves, by the pool's user (a failure in its thread fails the test)
    assert [lease for _, lease in admin.agents_with_leases()] == ["leaving"] * 4
    assert sorted(load_fill_stats(admin)) == [("llm", s) for s in range(4)]  # published at the end, for the dashboard

    pool = redis.Redis.from_url(pool_url, decode_responses=True)
    p = [shard.prefix for shard in stages.shards]
    pool.set(f"{p[2]}lease:llm.host-9", 1)  # any member's keys, in any shard
    assert [pool.get(f"{prefix}pool-token:llm") for prefix in p] == [None] * 3  # its renewed token, in any shard
    denied = [
        lambda: pool.set(f"{p[0]}lease:llm2.stage0", 1),  # another pool whose name begins alike
        lambda: pool.set(f"{p[0]}lease:llm-stage0", 1),
        lambda: pool.xrange(f"{p[1]}assign:alpha"),  # a single agent's
        lambda: pool.set(f"{P}lease:llm.stage0", 1),  # the unsharded key
        lambda: pool.set(f"{p[0]}bubbles:gpt:0", "{}"),  # another training job's profiles
        lambda: pool.get(f"{p[0]}bubble-fill:llm:0"),  # its fill statistics: write only
        lambda: pool.get(f"{p[0]}pool-token:llm2"),  # another pool's token
        lambda: pool.set(f"{p[0]}pool-token:llm", "forged"),
        lambda: pool.keys("*"),
    ]
    for attempt in denied:
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()
    for args, field in (
        (["--pool", "l*"], "--pool"),
        (["--pool", "a", "--id", "b"], "--id/--pool"),
        ([], "--id/--pool"),
    ):
        refused = CliRunner().invoke(app, ["acl", "agent", *args])
        assert refused.exit_code == 2 and refused.output.startswith(f"error: {field}: "), refused.output
        assert len(refused.output.strip().splitlines()) == 1


def test_upgrade_gives_users_made_by_an_older_version_this_version_s_rights_and_keeps_their_passwords(
    admin_url, monkeypatch
):
    """A pool's user made before pool tokens could not read them, and `broker acl agent --pool` again would have
    changed the password its instances hold."""
    monkeypatch.setenv("BROKER_REDIS_URL", admin_url)
    monkeypatch.setenv("BROKER_SHARDS", "2")
    p = [shard.prefix for shard in ShardedStore(admin_url, P, 2).shards]
    older = {  # as an older version made them: no pool token, no renewed token
        "pool-llm": [r for r in acl.pool_rules(p, "llm") if "pool-token" not in r],
        "agent-gamma": [r for r in acl.agent_rules([p[shard_of("gamma", 2)]], "gamma") if "renewed" not in r],
    }
    urls = {user: acl.create_user(admin_url, user, rules) for user, rules in older.items()}
    other = acl.create_user(admin_url, "reader", ["+get", "~elsewhere:*"])  # not one `broker acl agent` made
    reads = {
        "pool-llm": lambda client: client.get(f"{p[1]}pool-token:llm"),
        "agent-gamma": lambda client: client.get(f"{p[shard_of('gamma', 2)]}renewed:gamma"),
    }
    for user, read in reads.items():
        with pytest.raises(redis.exceptions.NoPermissionError):
            read(redis.Redis.from_url(urls[user]))
    checked = CliRunner().invoke(app, ["check"])  # as an admin, after upgrading broker
    assert "note    acl users    agent-gamma, pool-llm: made by an older version" in checked.stdout
    assert "`broker acl upgrade`" in checked.stdout and "reader" not in checked.stdout
    admin = redis.Redis.from_url(admin_url)
    for _ in range(2):  # a second upgrade changes nothing (no selector added twice)
        upgraded = CliRunner().invoke(app, ["acl", "upgrade"])
        assert upgraded.exit_code == 0 and upgraded.output == "upgraded ACL users: agent-gamma, pool-llm\n"
        assert len(admin.acl_getuser("pool-llm")["selectors"]) == 6  # 3 for each shard's agents
    for user, read in reads.items():
        assert read(redis.Redis.from_url(urls[user])) is None  # the same password, and now allowed (none yet)
    checked = CliRunner().invoke(app, ["check"])
    assert "ok      acl users    2 agent and pool users, with this version's rights" in checked.stdout
    monkeypatch.setenv("BROKER_REDIS_URL", urls["agent-gamma"])
    assert "acl users" not in CliRunner().invoke(app, ["check"]).stdout  # a user that may not look: nothing said
    with pytest.raises(redis.exceptions.NoPermissionError):
        redis.Redis.from_url(urls["pool-llm"]).set(f"{p[0]}pool-token:llm", "forged")  # still read only
    assert redis.Redis.from_url(other).get("elsewhere:x") is None  # another user: untouched
    assert admin.acl_getuser("reader")["keys"] == ["~elsewhere:*"]
    admin.execute_command("ACL", "SETUSER", "agent-gamma", "off")
    CliRunner().invoke(app, ["acl", "upgrade"])
    assert "off" in admin.acl_getuser("agent-gamma")["flags"]  # a user switched off stays off
