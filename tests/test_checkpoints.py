"""Checkpoints: published with a manifest written last; only verified ones count."""

import hashlib
import threading

import pytest

from broker.agents.checkpoints import MANIFEST, CheckpointStore


def files(tmp_path, name, **contents):
    d = tmp_path / name
    d.mkdir()
    for fname, body in contents.items():
        (d / fname).write_bytes(body)
    return d


@pytest.fixture(params=["file", "memory"])
def store(request, tmp_path):
    root = str(tmp_path / "store") if request.param == "file" else f"memory://ckpt-{tmp_path.name}"
    return CheckpointStore(root, keep=3)


def test_published_checkpoint_verifies_with_the_hashes_of_its_files(store, tmp_path):
    local = files(tmp_path, "c1", **{"state.pt": b"weights" * 1000, "meta.json": b"{}"})
    manifest = store.publish("job-a", 10, local)
    assert {f.name: (f.size, f.sha256) for f in manifest.files} == {
        "state.pt": (7000, hashlib.sha256(b"weights" * 1000).hexdigest()),
        "meta.json": (2, hashlib.sha256(b"{}").hexdigest()),
    }
    latest, skipped = store.latest_verified("job-a")
    assert latest.step == 10 and latest.url == manifest.url and skipped == []


def test_a_checkpoint_without_its_manifest_never_counts(store, tmp_path):
    store.publish("job-a", 10, files(tmp_path, "c1", **{"state.pt": b"old"}))
    partial = store.step_dir("job-a", 20)  # a writer that died before the manifest
    store.fs.makedirs(partial, exist_ok=True)
    store.fs.pipe_file(partial + "/state.pt", b"half")
    latest, _ = store.latest_verified("job-a")
    assert latest.step == 10


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(store, tmp_path):
    store.publish("job-a", 10, files(tmp_path, "c1", **{"state.pt": b"good"}))
    newest = store.publish("job-a", 20, files(tmp_path, "c2", **{"state.pt": b"newer"}))
    store.fs.pipe_file(store.path(newest.url) + "/state.pt", b"newer-but-flipped")
    latest, skipped = store.latest_verified("job-a")
    assert latest.step == 10
    assert skipped == ["step 20: state.pt does not match its manifest (size 17 vs 5)"]


def test_a_missing_file_is_reported(store, tmp_path):
    only = store.publish("job-a", 5, files(tmp_path, "c1", **{"a": b"1", "b": b"2"}))
    store.fs.rm(store.path(only.url) + "/b")
    latest, skipped = store.latest_verified("job-a")
    assert latest is None and skipped == ["step 5: b is missing"]


def test_only_the_newest_checkpoints_are_kept(store, tmp_path):
    partial = store.step_dir("job-a", 15)
    store.fs.makedirs(partial, exist_ok=True)
    store.fs.pipe_file(partial + "/state.pt", b"half")
    for step in (10, 20, 30, 40):
        store.publish("job-a", step, files(tmp_path, f"c{step}", **{"state.pt": str(step).encode()}))
    assert [m.step for m in store.manifests("job-a")] == [40, 30, 20]
    assert len(store.fs.ls(store.job_dir("job-a"))) == 3  # step 10 and the partial step 15 are gone


def test_the_manifest_is_the_last_file_written(store, tmp_path, monkeypatch):
    order = []
    put, pipe = store.fs.put_file, store.fs.pipe_file
    monkeypatch.setattr(
        store.fs, "put_file", lambda src, dst, **kw: (order.append(dst.rsplit("/", 1)[1]), put(src, dst, **kw))
    )
    monkeypatch.setattr(
        store.fs, "pipe_file", lambda path, data, **kw: (order.append(path.rsplit("/", 1)[1]), pipe(path, data, **kw))
    )
    store.publish("job-a", 1, files(tmp_path, "c1", **{"x": b"1", "y": b"2"}))
    assert order[:2] == ["x", "y"] and order[-1].startswith(MANIFEST)


def test_a_hash_left_waiting_is_not_the_answer_once_the_job_ran_again(store, tmp_path, monkeypatch):
    """A dispatch that stopped waiting left its hash behind; the job, dispatched later, saved a newer checkpoint."""
    store.publish("job-a", 10, files(tmp_path, "c1", **{"state.pt": b"one"}))
    hashed, verify = threading.Event(), store.verify
    monkeypatch.setattr(store, "verify", lambda manifest: (hashed.wait(), verify(manifest))[1])
    assert store.latest_verified_soon("job-a", fence=1, wait_s=0.0) is None  # still hashing: ask again later
    hashed.set()
    store.publish("job-a", 20, files(tmp_path, "c2", **{"state.pt": b"two"}))  # the job ran again (fence 2), saved
    latest, _ = store.latest_verified_soon("job-a", fence=2, wait_s=None)
    assert latest.step == 20


def test_no_checkpoints_means_none(store):
    assert store.latest_verified("never-saved") == (None, [])


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs: a checkpoint store whose disk fills up (needs root, as CI runs; skipped elsewhere)."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    if (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True).returncode
        != 0
    ):
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_mid_save_fails_that_save_cleanly_and_the_job_goes_on(small_disk, tmp_path):
    """A real job process saves a small checkpoint, then one larger than the disk, then finishes: the big save
    is reported with its reason, leaves no partial files, and the small one stays the one to resume from."""
    import sys

    from broker.agents.runner import JobProcess
    from conftest import make_spec

    script = tmp_path / "job.py"
    script.write_text(
        "import torch\nfrom broker import sdk\n"
        "sdk.save({'w': torch.zeros(1000)}, step=1)\n"  # 4 KB
        "assert sdk.save({'w': torch.zeros(2_000_000)}, step=2) is None\n"  # 8 MB: more than the disk
        "sdk.progress(3, 3)\n"
    )
    spec = make_spec(name="full-disk", run=[sys.executable, str(script)])
    job = JobProcess(spec, "full-disk", f"{small_disk}/full-disk", tmp_path / "run")
    job.start()
    assert job.wait(timeout=120) == 0, job.log_tail()  # the job went on past the failed save
    events = job.events()
    failed = [e for e in events if e["type"] == "checkpoint_failed"]
    assert [e["step"] for e in failed] == [2] and "No space left on device" in failed[0]["reason"]
    assert [e["step"] for e in events if e["type"] == "checkpoint"] == [1]
    store = CheckpointStore(str(small_disk))
    newest, skipped = store.latest_verified("full-disk")
    assert newest.step == 1 and skipped == []
    assert sorted(p.name for p in (small_disk / "full-disk").iterdir()) == ["step-000000000001"]  # no partial step 2


def test_a_root_that_cannot_hold_checkpoints_is_one_line_at_an_agents_start(env, tmp_path):
    """Saves failed only in the agent's first job (a scheme not known, its package missing, a folder not makeable);
    `broker server` ended in an internal error."""
    from test_cli import run

    from broker.agents.checkpoints import CheckpointError

    with pytest.raises(CheckpointError, match="foo://x cannot be used here \\(Protocol not known: foo\\)"):
        CheckpointStore("foo://x")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(CheckpointError, match="cannot make .*a-file/ck"):
        CheckpointStore(str(tmp_path / "a-file" / "ck")).ensure_root()
    CheckpointStore(str(tmp_path / "new" / "ck")).ensure_root()
    assert (tmp_path / "new" / "ck").is_dir()
    unknown_offer = "gcp/nowhere/g2-standard-4/spot"  # refused after the checkpoints' check: without it, a failure
    result = run("agent", "--id", "a1", "--offer", unknown_offer, "--checkpoints", str(tmp_path / "a-file" / "ck"))
    assert result.exit_code == 2 and "error: checkpoints: cannot make" in result.stderr  # (not an agent that runs)
