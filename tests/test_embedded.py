"""The embedded default: a private redis-server that broker starts, reuses and stops."""

import redis

from broker import embedded
from broker.errors import StoreUnavailableError

import pytest


def test_starts_a_private_server_then_reuses_it(tmp_path):
    first = embedded.ensure(tmp_path)
    try:
        again = embedded.ensure(tmp_path)
        assert first.started and not again.started
        assert again.port == first.port and again.pid == first.pid
        client = redis.Redis(port=first.port, decode_responses=True)
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        assert (tmp_path / "redis").is_dir()
    finally:
        assert embedded.stop(tmp_path)
    assert not embedded.stop(tmp_path)


def test_data_outlives_a_stop_and_start(tmp_path):
    server = embedded.ensure(tmp_path)
    redis.Redis(port=server.port).set("k", "v")
    embedded.stop(tmp_path)
    server = embedded.ensure(tmp_path)
    try:
        assert redis.Redis(port=server.port).get("k") == b"v"
    finally:
        embedded.stop(tmp_path)


def test_missing_redis_server_binary_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StoreUnavailableError, match="apt-get install redis-server"):
        embedded.ensure(tmp_path)
