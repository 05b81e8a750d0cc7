"""The store's shard count is the servers' (store/layout.py): a client with BROKER_SHARDS unset follows it, one set
otherwise is told the count. A CLI left at the default 1 beside servers with 4 wrote jobs no server reads."""

import json

from test_cli import job_file, run

from broker.core.replica import Replica
from broker.store.shards import ShardedStore


def started_server(monkeypatch) -> None:
    """`broker server` as it starts (it records the layout), stopped at once."""
    monkeypatch.setattr(Replica, "serve", lambda self: (_ for _ in ()).throw(KeyboardInterrupt))
    result = run("server", "--metrics-port", "0")
    assert result.exit_code == 0, result.output


def test_a_client_with_broker_shards_unset_splits_the_store_as_its_servers_do(env, monkeypatch, tmp_path):
    monkeypatch.setenv("BROKER_SHARDS", "4")
    started_server(monkeypatch)
    monkeypatch.delenv("BROKER_SHARDS")  # a laptop's shell
    submitted = run("submit", job_file(tmp_path), "--json")
    assert submitted.exit_code == 0, submitted.output
    job_id = json.loads(submitted.stdout)["job"]
    assert [j.id for j in ShardedStore(env, "broker:", 4).list_jobs()] == [job_id]  # where the servers plan
    assert [j["id"] for j in json.loads(run("list", "--json").stdout)] == [job_id]
    found = {row["part"]: row for row in json.loads(run("check", "--json").stdout)}
    assert "1 job in 4 shards" in found["redis"]["detail"]


def test_a_broker_shards_that_differs_from_the_servers_is_refused_naming_the_count(env, monkeypatch, tmp_path):
    monkeypatch.setenv("BROKER_SHARDS", "4")
    started_server(monkeypatch)
    monkeypatch.setenv("BROKER_SHARDS", "2")
    refused = run("submit", job_file(tmp_path))  # a client: never, the store empty or not
    assert refused.exit_code == 2 and "set BROKER_SHARDS=4 (or unset it" in refused.stderr, refused.output
    assert ShardedStore(env, "broker:", 4).job_count() == 0 and run("list").exit_code == 2
    started_server(monkeypatch)  # a server may split an empty store otherwise: it records 2
    assert run("submit", job_file(tmp_path)).exit_code == 0
    monkeypatch.setenv("BROKER_SHARDS", "3")  # and no longer once it holds a job
    monkeypatch.setattr(Replica, "serve", lambda self: None)
    moved = run("server", "--metrics-port", "0")
    assert moved.exit_code == 2 and "split into 2 shards; set BROKER_SHARDS=2" in moved.stderr, moved.output


def test_a_split_otherwise_than_an_unrecorded_stores_jobs_is_refused(env, monkeypatch, tmp_path):
    """A store used by `broker run` alone (its hosted server records nothing) holds one shard's untagged keys: a
    server started with BROKER_SHARDS=4 hid its jobs under keys no reader used, and a client listed none."""
    assert run("submit", job_file(tmp_path)).exit_code == 0  # no server yet: nothing recorded
    monkeypatch.setenv("BROKER_SHARDS", "4")
    hidden = run("list")  # a client too: it listed no job ("no jobs yet")
    assert hidden.exit_code == 2 and "holds the jobs or agents of one shard" in hidden.stderr, hidden.output
    monkeypatch.setattr(Replica, "serve", lambda self: None)
    refused = run("server", "--metrics-port", "0")
    assert refused.exit_code == 2 and "holds the jobs or agents of one shard" in refused.stderr, refused.output
    monkeypatch.delenv("BROKER_SHARDS")
    assert run("server", "--metrics-port", "0").exit_code == 0 and len(json.loads(run("list", "--json").stdout)) == 1
