"""Redis persistence: jobs and their events, atomic and durable, against a real redis-server."""

import os
import signal
import time

import pytest
import redis

from broker.app.ledger import Ledger
from broker.domain.errors import BrokerError, NotFoundError, StoreUnavailableError
from broker.domain.model import Job, JobState, Run
from broker.planning import get
from broker.store import embedded, figures
from broker.store.jobs import Store
from broker.store.parsed import ParsedJobs
from conftest import NOW, free_port, make_spec


def new_job(catalog, job_id="job-1", **spec_fields):
    spec = make_spec(**spec_fields)
    quote = get("cheapest").quote(spec, catalog.offers, NOW)
    return Job(id=job_id, spec=spec, submitted_at=NOW, updated_at=NOW, quote=quote)


def test_job_round_trips_through_redis_unchanged(store, catalog):
    job = new_job(catalog, deadline="+30h", budget_usd=50)
    assert store.add_job(job)
    assert store.get_job(job.id) == job


def test_adding_the_same_id_twice_keeps_the_first(store, catalog):
    first = new_job(catalog, budget_usd=50)
    assert store.add_job(first)
    assert not store.add_job(new_job(catalog, budget_usd=99))
    assert store.get_job("job-1").spec.budget_usd == 50
    assert [e["state"] for e in store.events("job-1")] == ["queued"]


def test_jobs_are_listed_in_submission_order_and_filtered_by_state(store, catalog, clock):
    for i in range(3):
        store.add_job(new_job(catalog, job_id=f"j{i}").model_copy(update={"submitted_at": clock.advance(minutes=1)}))
    store.set_state("j1", JobState.cancelled, clock.now())
    assert [j.id for j in store.list_jobs()] == ["j0", "j1", "j2"]
    assert [j.id for j in store.list_jobs({JobState.queued})] == ["j0", "j2"]


def test_a_state_change_writes_the_job_and_its_event_together(store, catalog, clock):
    store.add_job(new_job(catalog))
    moved = store.set_state("job-1", JobState.cancelled, clock.advance(hours=1), reason="cancelled by user")
    assert store.get_job("job-1") == moved and moved.state == JobState.cancelled
    assert [(e["state"], e["reason"]) for e in store.events("job-1")] == [
        ("queued", "submitted"),
        ("cancelled", "cancelled by user"),
    ]


def test_a_terminal_job_cannot_change_state(store, catalog):
    store.add_job(new_job(catalog))
    store.set_state("job-1", JobState.cancelled, NOW)
    with pytest.raises(BrokerError, match="already cancelled"):
        store.set_state("job-1", JobState.running, NOW)
    assert store.get_job("job-1").state == JobState.cancelled


def test_unknown_job_id_says_how_to_find_ids(store):
    with pytest.raises(NotFoundError, match="broker list"):
        store.get_job("nope")


def test_store_turns_append_only_file_on(redis_url):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.config_set("appendonly", "no")
    Store(redis_url)
    assert client.config_get("appendonly")["appendonly"] == "yes"
    deadline = time.monotonic() + 10
    while client.info("persistence")["aof_rewrite_in_progress"] and time.monotonic() < deadline:
        time.sleep(0.02)  # the first AOF is written in the background
    assert client.info("persistence")["aof_enabled"] == 1


def test_unreachable_redis_is_one_clear_error():
    with pytest.raises(StoreUnavailableError, match="cannot reach .*BROKER_REDIS_URL"):
        Store(f"redis://127.0.0.1:{free_port()}/0")


def test_an_acknowledged_job_survives_kill_9_of_the_embedded_server(tmp_path, catalog):
    server = embedded.ensure(tmp_path)
    Store(server.url).add_job(new_job(catalog))
    os.kill(server.pid, signal.SIGKILL)
    restarted = embedded.ensure(tmp_path)
    try:
        assert restarted.started and restarted.pid != server.pid
        assert Store(restarted.url).get_job("job-1").id == "job-1"
    finally:
        embedded.stop(tmp_path)


def test_a_redis_password_never_shows_in_errors():
    with pytest.raises(StoreUnavailableError) as err:
        Store(f"redis://agent:s3cret-pass@127.0.0.1:{free_port()}/0")
    assert "s3cret-pass" not in str(err.value) and "redis://agent:***@127.0.0.1:" in str(err.value)


def test_clearing_a_namespace_deletes_only_its_own_keys(redis_url, catalog):
    demo, live = Store(redis_url, prefix="demo-ns:"), Store(redis_url)
    for i in range(3):
        demo.add_job(new_job(catalog, f"d{i}"))
    live.add_job(new_job(catalog, "keep"))
    assert demo.clear_namespace() > 3
    assert demo.list_jobs() == [] and [j.id for j in live.list_jobs()] == ["keep"]


def test_a_demos_ended_jobs_are_copied_tagged_and_replace_the_last_demos(redis_url, catalog):
    demo, live = Store(redis_url, prefix="demo-ns:"), Store(redis_url)
    live.add_job(new_job(catalog, "mine"))
    for round_ in ("a", "b"):
        demo.clear_namespace()
        demo.add_job(new_job(catalog, f"{round_}-open"))
        done = new_job(catalog, f"{round_}-done")
        run = Run(fence=1, agent="spot-a", offer=done.quote.chosen.offer, dispatched_at=NOW, ended_at=NOW)
        demo.add_job(done.model_copy(update={"runs": [run]}))
        demo.set_state(done.id, JobState.cancelled, NOW, reason="finished here")
        demo.append_log("spot-a", done.id, 1, ["hello"])
        assert live.publish_jobs(demo, [f"{round_}-done", f"{round_}-open"], tag="demo") == 1  # ended ones only
        Ledger(live).figures(NOW)  # a reader keeps the copy's figures beside it
    listed = {j.id: j.tags for j in live.list_jobs()}
    assert listed == {"mine": [], "b-done": ["demo"]}  # round a's copy was replaced; the user's job untouched
    assert sorted(live.redis.hkeys(live.key(figures.KEY))) == ["b-done", "mine"]  # a's copy's figures went with it
    assert [e["reason"] for e in live.events("b-done")] == ["submitted", "finished here"]
    assert live.read_log("spot-a", "b-done", 1)[1] == ["hello"]
    assert live.pending_count() == 1  # only the user's own job waits: no server acts on a copy


def test_a_demo_finds_the_copies_it_replaces_without_reading_every_job(redis_url, catalog, monkeypatch):
    demo, live = Store(redis_url, prefix="demo-ns:"), Store(redis_url)
    live.add_job(new_job(catalog, "mine"))
    older = new_job(catalog, "older").model_copy(update={"state": JobState.done, "tags": ["demo"]})
    live.add_job(older)  # a copy from before the record of what was published
    read = []
    monkeypatch.setattr(
        Store, "jobs_by_id", lambda self, ids, real=Store.jobs_by_id: read.append(ids) or real(self, ids)
    )
    for round_ in ("a", "b"):
        done = new_job(catalog, f"{round_}-done").model_copy(update={"state": JobState.done})
        demo.add_job(done)
        read.clear()
        assert live.publish_jobs(demo, [done.id], tag="demo") == 1
        ids = {i for ids in read[1:] for i in ids}  # what was read here (the first read is the source's)
        assert {j.id for j in live.list_jobs()} == {"mine", done.id}  # the last round's copies are gone
    assert ids == {"a-done", "b-done"}  # only the copies, old and new: not every job
    assert live.totals_and_running()[0].jobs[JobState.done] == 1


def test_a_batch_of_job_changes_is_one_transaction_that_never_overwrites_a_concurrent_write(store, catalog, clock):
    for i in range(3):
        store.add_job(new_job(catalog, f"j{i}"))
    other = Store(redis_url_of(store))
    calls = []

    def cancel(job):
        calls.append(job.id)
        if calls == ["j0"]:  # another writer changes j1 after the batch read it: the batch must re-read
            other.set_state("j1", JobState.cancelled, clock.now(), reason="by the other writer")
        return job.model_copy(update={"state": JobState.cancelled, "reason": "batch"})

    def keep(job):
        return None

    changes = [("j0", cancel, None), ("j1", cancel, None), ("j2", keep, None), ("gone", cancel, None)]
    done = store.update_jobs(changes)
    assert set(done) == {"j0", "j1", "j2"} and done["j2"] is None  # a missing job is left out
    assert calls == ["j0", "j1", "j0", "j1"]  # the first attempt was refused (WATCH) and the batch read again
    assert store.get_job("j0").reason == "batch" and store.get_job("j2").state == JobState.queued
    assert [e["reason"] for e in store.events("j0")] == ["submitted", "batch"]  # written once, with its event
    assert [e["reason"] for e in store.events("j1")] == ["submitted", "by the other writer"]  # cancelled once


def redis_url_of(store):
    kwargs = store.redis.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs.get('db', 0)}"


def test_a_batch_that_other_writers_keep_touching_falls_back_to_one_transaction_per_job(store, catalog):
    for i in range(2):
        store.add_job(new_job(catalog, f"j{i}"))
    other, calls = Store(redis_url_of(store)), []

    def note(job):
        calls.append(job.id)
        if job.id == "j0":  # every time: another writer touches j1, which the batch watches
            other.redis.set(other.key("job", "j1"), other.redis.get(other.key("job", "j1")))
        return job.model_copy(update={"reason": f"seen {job.id}"})

    done = store.update_jobs([("j0", note, None), ("j1", note, None)])
    assert calls == ["j0", "j1"] * 3 + ["j0", "j1"]  # three refused batches, then each job alone
    assert {i: j.reason for i, j in done.items()} == {"j0": "seen j0", "j1": "seen j1"}
    assert store.get_job("j0").reason == "seen j0" and store.get_job("j1").reason == "seen j1"


def test_parsed_jobs_are_kept_by_text_the_newest_only(catalog):
    parsed = ParsedJobs(size=2)
    jobs = [new_job(catalog, f"job-{i}") for i in range(3)]
    texts = [job.model_dump_json() for job in jobs]
    for text, job in zip(texts, jobs):
        parsed.put(text, job)
    assert list(parsed.jobs) == texts[1:]  # the oldest went
    assert parsed.get(texts[1]) is jobs[1]  # kept: not parsed again
    assert parsed.get(texts[0]) == jobs[0] and parsed.get(texts[0]) is not jobs[0]  # gone: parsed afresh
    assert list(parsed.jobs) == [texts[1], texts[0]]  # a read makes it the newest


def test_a_run_whose_first_lines_the_log_cap_dropped_says_so(redis_url, catalog, monkeypatch):
    """An agent's log stream keeps about LOG_MAXLEN batches: a long run's output read back lacked its beginning,
    and nothing said so."""
    from datetime import UTC, datetime, timedelta

    from broker.app.run import LogFollower
    from broker.store import agents

    monkeypatch.setattr(agents, "LOG_MAXLEN", 10)
    store = Store(redis_url)
    started = datetime.now(UTC) - timedelta(seconds=1)
    job = new_job(catalog, "long")
    run = Run(fence=1, agent="spot-a", offer=job.quote.chosen.offer, dispatched_at=started, started_at=started)
    job = job.model_copy(update={"runs": [run]})
    store.add_job(job)
    store.append_log("spot-a", job.id, 1, ["the first line"])
    (kind, header), line = LogFollower(store, job.id).read(job)
    assert kind == "run" and "may be gone" not in header and line == ("out", "the first line")
    for i in range(300):
        store.append_log("spot-a", job.id, 1, [f"line {i}"])
    (kind, header), *lines = LogFollower(store, job.id).read(job)
    assert "its first lines may be gone here" in header and ("out", "the first line") not in lines
    assert lines[-1] == ("out", "line 299")
    assert not store.log_trimmed_after("spot-a", datetime.now(UTC))  # a run starting now has lost nothing
