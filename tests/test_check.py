"""`broker check`: each part's finding from the real store, the real SDKs' credential chains and the filesystem."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from broker.agents.contract import Contract
from broker.app.cli.main import app
from broker.pricing.catalog import PriceCatalog
from broker.store.jobs import Store
from broker.store.policy import record_policy
from broker.store.prices import PriceHistory
from conftest import free_port

runner = CliRunner()


@pytest.fixture
def no_clouds(env, monkeypatch, tmp_path):
    """No cloud credentials anywhere the SDKs look (env, files, metadata servers)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ROLE_ARN"):
        monkeypatch.delenv(name, raising=False)
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "AZURE_SUBSCRIPTION_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    monkeypatch.delenv("BROKER_AGENT_SECRET", raising=False)
    return env


def findings(*args) -> tuple[int, dict[str, dict]]:
    result = runner.invoke(app, ["check", "--json", *args])
    return result.exit_code, {row["part"]: row for row in json.loads(result.stdout)}


def test_a_new_machine_is_told_what_works_and_what_to_set_up(no_clouds):
    code, found = findings()
    assert code == 0  # notes only
    assert found["redis"]["status"] == "ok" and "BROKER_REDIS_URL" in found["redis"]["detail"]
    assert found["server"]["status"] == "note" and "start `broker server`" in found["server"]["detail"]
    assert found["agents"]["status"] == "note" and found["prices"]["status"] == "note"
    assert found["aws"]["status"] == "note" and "no credentials in boto3's chain" in found["aws"]["detail"]
    assert found["gcp"]["status"] == "note" and "google-auth" in found["gcp"]["detail"]
    assert found["azure"]["status"] == "note" and found["agent secret"]["status"] == "note"
    assert found["checkpoints"]["status"] == "ok"


def test_a_redis_that_evicts_keys_when_full_is_a_problem_and_a_nearly_full_one_a_note(no_clouds, monkeypatch):
    """Managed Redis often defaults to an LRU policy: full, it deleted jobs and leases (agents taken for lost)."""
    from broker.core.replica import Replica

    client = Store(no_clouds).redis
    saved = client.config_get("maxmemory*")
    monkeypatch.setattr(Replica, "serve", lambda self: (_ for _ in ()).throw(KeyboardInterrupt))  # start, then stop
    try:
        client.config_set("maxmemory-policy", "allkeys-lru")
        code, found = findings()
        detail = found["redis"]["detail"]
        assert code == 2 and found["redis"]["status"] == "problem", detail
        assert "maxmemory-policy is allkeys-lru" in detail and "set it to noeviction" in detail
        started = runner.invoke(app, ["server", "--metrics-port", "0"])  # the server says so as it starts
        assert started.exit_code == 0 and "warning: redis: maxmemory-policy is allkeys-lru" in started.stderr
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", int(client.info("memory")["used_memory"] / 0.85))
        code, found = findings()
        assert code == 0 and found["redis"]["status"] == "note" and "--keep-ended-days" in found["redis"]["detail"]
        assert "% of a node's maxmemory is used" in found["redis"]["detail"]
    finally:
        client.config_set("maxmemory", saved["maxmemory"])
        client.config_set("maxmemory-policy", saved["maxmemory-policy"])
    assert findings()[1]["redis"]["status"] == "ok" and "MB used (no maxmemory)" in findings()[1]["redis"]["detail"]


def test_credentials_a_server_and_an_agent_are_found(no_clouds, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret" * 6)
    adc = tmp_path / "adc.json"  # gcloud's application-default login writes this kind of file
    adc.write_text(
        json.dumps({"type": "authorized_user", "client_id": "c", "client_secret": "s", "refresh_token": "r"})
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "my-project")
    monkeypatch.setenv("BROKER_AGENT_SECRET", "s" * 16)
    store = Store(no_clouds)
    store.lead("server-a", 60_000)
    Contract(store, "a1").register(PriceCatalog.from_snapshot().offers[0], 60_000)
    PriceHistory(store).mark_refreshed("aws", datetime.now(UTC) - timedelta(hours=3))
    code, found = findings()
    assert code == 0
    assert found["aws"]["status"] == found["gcp"]["status"] == "ok"
    assert found["server"] == {"part": "server", "status": "ok", "detail": "planned by server-a"}
    record_policy(store, "cost-to-go")  # as `broker server --policy cost-to-go` records it
    assert findings()[1]["server"]["detail"] == "planned by server-a with cost-to-go"
    assert found["agents"] == {"part": "agents", "status": "ok", "detail": "1 working, 0 running a job"}
    Contract(store, "a2").register(PriceCatalog.from_snapshot().offers[0], 60_000, for_job="j-1")
    detail = findings()[1]["agents"]["detail"]
    assert detail == "2 working (1 started for one job alone: `broker run`), 0 running a job"
    assert found["agent secret"]["status"] == "ok"
    assert found["prices"] == {"part": "prices", "status": "ok", "detail": "refreshed: aws 3.0 h ago"}
    refused = store.get_agent("a1").model_copy(update={"id": "pool-x.host1"})  # gone from the agents, its reason kept
    store.refuse_agent(refused, "no registration token")
    agents = findings()[1]["agents"]
    assert agents["status"] == "note" and agents["detail"] == (
        "2 working (1 started for one job alone: `broker run`), 0 running a job; refused in the last day: "
        "pool-x.host1 (no registration token): give each a token (`broker agents token --id` or --pool)"
    )


def test_agents_whose_registration_tokens_end_within_a_day_are_named(no_clouds, monkeypatch):
    """Admitted agents run on past their token's end; a spot pool's replacements would be refused after it."""
    from broker.agents.tokens import issue, issue_pool
    from broker.store.renewals import put_pool_token

    store, offer, now = Store(no_clouds), PriceCatalog.from_snapshot().offers[0], datetime.now(UTC)
    Contract(store, "a1").register(offer, 60_000, token=issue("s" * 16, "a1", now + timedelta(days=30)))
    assert findings()[1]["agents"]["status"] == "ok"  # a month left
    ends = now + timedelta(hours=5)
    for host in ("h1", "h2"):  # a pool's two agents: the pool is named once
        Contract(store, f"aws-g6.{host}").register(offer, 60_000, token=issue_pool("s" * 16, "aws-g6", ends))
    agents = findings()[1]["agents"]
    assert agents["status"] == "note" and agents["detail"].count("aws-g6") == 1
    assert (
        f"pool aws-g6's {ends:%Y-%m-%d %H:%M} UTC" in agents["detail"]
        and "`broker agents provision`" in agents["detail"]
    )
    put_pool_token(store, "aws-g6", issue_pool("s" * 16, "aws-g6", now + timedelta(days=7)), now + timedelta(days=7))
    assert findings()[1]["agents"]["status"] == "ok"  # a server renewed the pool's token: its new instances read it


def test_an_unreachable_redis_and_an_unwritable_checkpoint_store_are_problems(no_clouds, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("BROKER_CHECKPOINTS", str(blocker / "checkpoints"))  # under a file: cannot be made
    monkeypatch.setenv("BROKER_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    code, found = findings()
    assert code == 2
    assert found["redis"]["status"] == "problem" and "cannot reach" in found["redis"]["detail"]
    assert "server" not in found  # not looked at without a store
    assert found["checkpoints"]["status"] == "problem" and "cannot make" in found["checkpoints"]["detail"]
    assert found["aws"]["status"] == "note"  # the rest is still told
    shown = runner.invoke(app, ["check"])
    assert shown.exit_code == 2 and "problem redis" in " ".join(shown.stdout.split())


def test_a_shard_without_a_server_is_a_note(no_clouds, monkeypatch):
    from broker.store.shards import ShardedStore

    monkeypatch.setenv("BROKER_SHARDS", "2")
    store = ShardedStore(no_clouds, count=2)
    store.shards[0].lead("server-a", 60_000)
    assert findings()[1]["server"] == {
        "part": "server",
        "status": "note",
        "detail": "planned by server-a; shard 1 of 2 has no server: restart one",
    }
    store.shards[1].lead("server-a", 60_000)
    assert findings()[1]["server"]["status"] == "ok"


def test_on_a_cluster_every_nodes_memory_and_policy_are_read(cluster_url):
    """A cluster client's INFO asks one node: an evicting node beside two that do not went unseen."""
    import redis

    from broker.store.memory import Memory, eviction_problem
    from broker.store.shards import ShardedStore

    cluster = ShardedStore(cluster_url, "broker:", 3).redis
    node = cluster.get_nodes()[-1]
    one = redis.Redis(host=node.host, port=node.port)
    try:
        one.config_set("maxmemory-policy", "volatile-lru")  # evicts keys with a TTL: leases
        nodes = Memory.of(cluster)
        assert len(nodes) == 3 and all(n.used_bytes > 0 for n in nodes)
        assert "maxmemory-policy is volatile-lru" in eviction_problem(nodes)
    finally:
        one.config_set("maxmemory-policy", "noeviction")
    assert eviction_problem(Memory.of(cluster)) is None
