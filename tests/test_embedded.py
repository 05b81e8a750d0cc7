"""The embedded default: a private redis-server that broker starts, reuses and stops."""

import pytest
import redis

from broker.domain.errors import StoreUnavailableError
from broker.store import embedded


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


def test_a_patient_store_rides_out_a_restart_and_an_impatient_one_fails_at_once(tmp_path):
    """The server's and agents' store reconnects with backoff while redis-server restarts (same port, AOF);
    a command's store reports the outage at once."""
    import threading
    import time

    from broker.store.jobs import Store

    server = embedded.ensure(tmp_path)
    patient, impatient = Store(server.url, outage_s=30), Store(server.url)
    patient.redis.set("before", "1")
    embedded.stop(tmp_path)
    with pytest.raises(redis.ConnectionError):
        impatient.redis.get("before")
    restarter = threading.Timer(1.5, embedded.ensure, args=(tmp_path,))
    restarter.start()
    try:
        began = time.monotonic()
        assert patient.redis.get("before") == "1"  # waited for the restart, then read the replayed AOF
        assert time.monotonic() - began >= 1.0
        restarter.join()
        assert embedded.ensure(tmp_path).port == server.port
    finally:
        restarter.join()
        embedded.stop(tmp_path)


def test_a_wrong_or_missing_password_is_one_line_that_says_what_to_set_at_once(tmp_path):
    import time

    from broker.store.jobs import Store
    from broker.store.shards import ShardedStore
    from conftest import start_redis, stop_redis

    proc, port = start_redis(tmp_path, password="right")
    try:
        began = time.monotonic()
        with pytest.raises(StoreUnavailableError, match="invalid username-password"):
            Store(f"redis://:wrong@127.0.0.1:{port}/0", outage_s=30)
        assert time.monotonic() - began < 3
        for opened in (Store, ShardedStore):  # one line that says what to put in the URL, the password never shown
            with pytest.raises(StoreUnavailableError) as wrong:
                opened(f"redis://:wrong@127.0.0.1:{port}/0")
            with pytest.raises(StoreUnavailableError) as missing:
                opened(f"redis://127.0.0.1:{port}/0")
            assert "refuses the password in it" in str(wrong.value) and "wrong" not in str(wrong.value)
            assert "asks for a password" in str(missing.value) and "HELLO" in str(missing.value)
            for error in (wrong, missing):
                assert "BROKER_REDIS_URL: redis://:PASSWORD@host:port" in str(error.value), error.value
    finally:
        stop_redis(proc, port)
