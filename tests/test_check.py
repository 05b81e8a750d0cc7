"""`broker check`: each part's finding from the real store, the real SDKs' credential chains and the filesystem."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from broker.agents.contract import Contract
from broker.app.cli.main import app
from broker.pricing.catalog import PriceCatalog
from broker.store.jobs import Store
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
