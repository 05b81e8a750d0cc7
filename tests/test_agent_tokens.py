"""Agents join with an expiring HMAC registration token; the server gives work only to admitted agents."""

from datetime import UTC, datetime, timedelta

from typer.testing import CliRunner

from broker import planning
from broker.agents.checkpoints import CheckpointStore
from broker.agents.tokens import issue, refusal
from broker.app.cli.main import app
from broker.core.broker import Broker
from broker.core.clock import SystemClock
from broker.core.server import BrokerServer
from broker.domain.model import AgentInfo
from conftest import make_spec

NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
SECRET = "a-secret-of-24-characters"  # BROKER_AGENT_SECRET takes 16 or more


def test_a_token_admits_its_agent_until_it_expires_and_nobody_else():
    token = issue("s3cret", "spot-a", NOW + timedelta(hours=1))
    assert refusal("s3cret", "spot-a", token, NOW) is None
    assert "expired" in refusal("s3cret", "spot-a", token, NOW + timedelta(hours=2))
    assert "does not match" in refusal("s3cret", "spot-b", token, NOW)
    assert "does not match" in refusal("other", "spot-a", token, NOW)
    tampered = str(int(token.split(".")[0]) + 3600) + "." + token.split(".")[1]  # a later expiry, same signature
    assert "does not match" in refusal("s3cret", "spot-a", tampered, NOW)
    assert refusal("s3cret", "spot-a", None, NOW) == "no registration token"
    assert "malformed" in refusal("s3cret", "spot-a", "garbage", NOW)


def test_the_server_dispatches_only_to_agents_with_a_valid_token_and_logs_the_rest(store, catalog, tmp_path, caplog):
    offer = next(o for o in catalog.offers if o.accelerator == "A100" and o.accelerator_count == 1)
    now = datetime.now(UTC)
    server = BrokerServer(store, planning.get(), SystemClock(), CheckpointStore(str(tmp_path)), agent_secret="s3cret")
    for agent_id, token in (
        ("intruder", None),
        ("stale", issue("s3cret", "stale", now - timedelta(minutes=1))),
        ("good", issue("s3cret", "good", now + timedelta(hours=1))),
    ):
        store.register_agent(
            AgentInfo(id=agent_id, offer=offer, host="h", pid=1, registered_at=now, token=token), 60_000
        )
    job = Broker(store, catalog, planning.get(), SystemClock()).submit(make_spec())
    assert server.dispatch() == [(job.id, "good")]
    assert sorted(a.id for a in store.agents()) == ["good"]
    assert (
        "agent=intruder refused: no registration token" in caplog.text
        and "agent=stale refused: registration token expired" in caplog.text
    )


def test_cli_issues_tokens_only_with_the_brokers_secret(monkeypatch):
    runner = CliRunner()
    monkeypatch.delenv("BROKER_AGENT_SECRET", raising=False)
    refused = runner.invoke(app, ["agents", "token", "--id", "spot-a"])
    assert refused.exit_code == 2 and "BROKER_AGENT_SECRET" in refused.output
    monkeypatch.setenv("BROKER_AGENT_SECRET", "s3cret")  # a few guesses find it
    short = runner.invoke(app, ["agents", "token", "--id", "spot-a"])
    assert short.exit_code == 2 and "BROKER_AGENT_SECRET: 6 characters is too short" in short.stderr
    assert "s3cret" not in short.output
    monkeypatch.setenv("BROKER_AGENT_SECRET", SECRET)
    token = runner.invoke(app, ["agents", "token", "--id", "spot-a", "--ttl-hours", "2"]).stdout.strip()
    assert refusal(SECRET, "spot-a", token, datetime.now(UTC)) is None
    assert refusal(SECRET, "spot-a", token, datetime.now(UTC) + timedelta(hours=3)) is not None


def test_broker_run_with_the_brokers_secret_set_admits_the_agent_it_starts(redis_url, monkeypatch, tmp_path):
    """It started its agent without a token, its own server refused it, and the job waited for good ("no agent is
    registered: start one (... `broker run JOB`)"). An agent token in the shell (another agent's) is not passed on."""
    import sys

    from test_run import spec_file

    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    monkeypatch.setenv("BROKER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("BROKER_AGENT_SECRET", SECRET)
    monkeypatch.setenv("BROKER_AGENT_TOKEN", issue(SECRET, "someone-else", NOW + timedelta(days=3650)))
    monkeypatch.chdir(tmp_path)
    path = spec_file(tmp_path, run=[sys.executable, "-c", "print('ran on an admitted agent')"])
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 0, result.output
    assert "ran on an admitted agent" in result.stdout and "refused" not in result.output


def test_a_refused_agent_ends_saying_why_and_a_refusal_of_another_process_is_not_its_own(store, catalog, tmp_path):
    """The server deleted a refused agent's stream under its blocking read, and the agent crashed ("internal error:
    ResponseError: UNBLOCKED the stream key no longer exists"); between reads it registered again, round after round.
    It now ends with the server's reason and what to pass."""
    import threading
    import time

    import pytest

    from broker.agents.agent import Agent
    from broker.domain.errors import BrokerError, RefusedError

    offer = next(o for o in catalog.offers if o.accelerator == "A100" and o.accelerator_count == 1)
    server = BrokerServer(store, planning.get(), SystemClock(), CheckpointStore(str(tmp_path)), agent_secret=SECRET)
    agent = Agent(store, "no-token", offer, str(tmp_path / "ckpt"), tmp_path / "runs")
    agent.register()
    Broker(store, catalog, planning.get(), SystemClock()).submit(make_spec())
    raised: list[Exception] = []

    def take() -> None:
        try:
            agent.step(block_ms=10_000)  # blocked in its assignment read while the server refuses it
        except Exception as error:  # noqa: BLE001 - the test reads what it was
            raised.append(error)

    reader = threading.Thread(target=take)
    reader.start()
    deadline = datetime.now(UTC) + timedelta(seconds=5)
    while not store.redis.execute_command("CLIENT", "LIST").count("cmd=xreadgroup") and datetime.now(UTC) < deadline:
        time.sleep(0.01)
    assert server.dispatch() == []  # refused: no token
    reader.join(timeout=15)
    assert len(raised) == 1 and isinstance(raised[0], RefusedError) and raised[0].exit_code == 3, raised
    assert str(raised[0]).startswith("token: the broker refused agent no-token: no registration token; pass it")
    assert "broker agents token --id no-token" in str(raised[0])
    with pytest.raises(BrokerError, match="refused agent no-token"):
        agent.step()  # and again at once: its registration is gone and the reason stays

    other = AgentInfo(id="twin", offer=offer, host="elsewhere", pid=1, registered_at=datetime.now(UTC))
    store.refuse_agent(other, "registration token expired")  # an earlier process of the same id
    twin = Agent(store, "twin", offer, str(tmp_path / "ckpt"), tmp_path / "runs", heartbeat_s=0.0)
    twin.register()
    store.redis.delete(store.key("lease", "twin"))  # its lease lapses (a pause): not refused, it registers again
    twin.step(block_ms=10)
    assert store.redis.exists(store.key("lease", "twin"))


def test_an_agent_without_a_valid_token_is_refused_with_no_job_waiting(store, catalog, tmp_path):
    """Each round checks the idle agents, a job waiting or not: an agent without a valid token is refused at once."""
    offer = next(o for o in catalog.offers if o.accelerator == "A100" and o.accelerator_count == 1)
    server = BrokerServer(store, planning.get(), SystemClock(), CheckpointStore(str(tmp_path)), agent_secret=SECRET)
    now = datetime.now(UTC)
    for agent_id, token in (("intruder", None), ("good", issue(SECRET, "good", now + timedelta(hours=1)))):
        store.register_agent(
            AgentInfo(id=agent_id, offer=offer, host="h", pid=7, registered_at=now, token=token), 60_000
        )
    server.round(block_ms=10)
    assert [a.id for a in store.agents()] == ["good"]
    assert store.refusal("intruder") == {"why": "no registration token", "host": "h", "pid": 7}


def test_an_admitted_agent_runs_on_past_its_tokens_expiry_and_a_new_registration_is_checked_again(
    store, redis_url, catalog, tmp_path
):
    """A token bounds when an agent may join, not how long it runs: checked at every round, a pool's token (a week by
    default) refused every agent of the pool once it expired, each as it finished its job, and their instances
    restarted into refusals for good. The process stays admitted, back after a partition too; a new one is checked."""
    from broker.core.clock import ManualClock
    from broker.store.jobs import Store

    offer = next(o for o in catalog.offers if o.accelerator == "A100" and o.accelerator_count == 1)
    now = datetime.now(UTC)
    clock = ManualClock(now)
    server = BrokerServer(store, planning.get(), clock, CheckpointStore(str(tmp_path)), agent_secret=SECRET)
    token = issue(SECRET, "weekly", now + timedelta(hours=1))
    info = AgentInfo(id="weekly", offer=offer, host="h", pid=7, registered_at=now, token=token)
    store.register_agent(info, 600_000)
    server.step()  # admitted: its token verifies
    clock.advance(hours=2)  # past the token's expiry
    server.step()
    assert [a.id for a in store.agents()] == ["weekly"] and store.refusal("weekly") is None
    job = Broker(store, catalog, planning.get(), clock).submit(make_spec())
    assert server.dispatch() == [(job.id, "weekly")]  # and it gets work
    registered = store.get_agent("weekly")
    assert store.admitted([registered.model_copy(update={"report_key": "f" * 32})]) == set()  # not another process's

    store.redis.delete(store._key("lease", "weekly"))  # a partition longer than its lease: it lapses
    server.step()  # the agent is removed and its job goes back in the queue
    assert store.get_agent("weekly") is None
    store.register_agent(info, 600_000)  # the same process, back: the report key it was admitted with
    server.step()
    assert store.get_agent("weekly") is not None and store.refusal("weekly") is None  # admitted still
    assert store.redis.ttl(store._key("admitted", "weekly")) == -1  # for as long as it stays

    store.redis.delete(store._key("lease", "weekly"))  # its instance gone this time
    server.step()
    Store(redis_url).register_agent(info.model_copy(update={"pid": 8}), 600_000)  # a new process, the same id
    server.step()  # its token is checked: ended
    assert store.get_agent("weekly") is None and store.refusal("weekly")["pid"] == 8
    assert "expired" in store.refusal("weekly")["why"] and not store.redis.exists(store._key("admitted", "weekly"))


def test_admissions_on_a_cluster_stay_in_their_agents_slot(cluster_url, catalog):
    """The admission's reads (one pipeline) and its writes in the removal's transaction, on a Redis Cluster."""
    from broker.store.shards import ShardedStore

    store = ShardedStore(cluster_url, "broker:", 3).of_agent("c1")
    offer = catalog.offers[0]
    store.register_agent(AgentInfo(id="c1", offer=offer, host="h", pid=1, registered_at=NOW), 60_000)
    agent = store.get_agent("c1")
    store.admit(agent)
    assert store.admitted([agent]) == {"c1"}
    store.remove_agent("c1")  # lapsed: kept a day for the process to come back
    assert 0 < store.redis.ttl(store._key("admitted", "c1")) <= 24 * 3600
    assert store.admitted([agent]) == {"c1"} and store.redis.ttl(store._key("admitted", "c1")) == -1
    store.refuse_agent(agent, "registration token expired")
    assert store.admitted([agent]) == set()
