"""Checkpoint storage on any fsspec filesystem, with manifests: a checkpoint counts only once verified.

Layout under the store's root URL (`file://` by default; `s3://`, `gs://`, `az://` with the
s3fs / gcsfs / adlfs extras installed):

    {root}/{job_id}/step-{step:012d}/<files>          the checkpoint's files
    {root}/{job_id}/step-{step:012d}/manifest.json    written last: job, step, files with size and sha256

A checkpoint without a manifest is partial (its writer died or the disk filled) and is
ignored. Resume takes the newest checkpoint whose files match their manifest; a corrupt
one is skipped and reported.
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import threading
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import fsspec

from broker.domain.errors import BrokerError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
_CHUNK = 1 << 20
HASHING_AT_ONCE = 2  # jobs whose checkpoints a server hashes at once, on threads beside its rounds


class CheckpointError(BrokerError):
    """A checkpoint could not be saved or does not verify."""


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    job: str
    step: int
    created_at: str
    files: list[FileEntry] = field(default_factory=list)
    url: str = ""  # where this checkpoint lives (filled in when read)

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files)


def _sha256_file(fs, path: str) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with fs.open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


class CheckpointStore:
    """Checkpoints of many jobs under one root URL."""

    def __init__(self, root: str, keep: int = 3):
        try:
            self.fs, self.root = fsspec.core.url_to_fs(str(root))
        except (ValueError, ImportError) as error:  # an unknown scheme, or its filesystem's package not installed
            raise CheckpointError(
                f"checkpoints: {root} cannot be used here ({error}); give a path, or s3://, gs://, az:// with "
                "s3fs, gcsfs or adlfs installed"
            ) from None
        self.protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self.keep = keep
        self._lock = threading.Lock()
        self._looking: dict[str, tuple[int, Future]] = {}  # job -> (fence, its latest_verified hashing on a thread)
        self._hashers = threading.Semaphore(HASHING_AT_ONCE)

    def ensure_root(self) -> None:
        """Make a local root now (a bucket is the cloud's to have): a folder that cannot be made is the user's one
        line at an agent's start, not a failed save in its first job."""
        if self.protocol in ("file", "local"):
            try:
                self.fs.makedirs(self.root, exist_ok=True)
            except OSError as error:
                raise CheckpointError(
                    f"checkpoints: cannot make {self.root} ({error.strerror}); give a folder this agent can write"
                ) from None

    def url(self, path: str) -> str:
        return path if self.protocol in ("file", "local") else f"{self.protocol}://{path.lstrip('/')}"

    def path(self, url: str) -> str:
        """The filesystem path of a checkpoint URL from this store."""
        return fsspec.core.url_to_fs(url)[1]

    def open_file(self, manifest: Manifest, name: str):
        """Open one file of a checkpoint for reading."""
        return self.fs.open(posixpath.join(self.path(manifest.url), name), "rb")

    def owns(self, url: str, job_id: str) -> bool:
        """Whether a checkpoint URL lies in this store under the job's own directory.

        Not file:///etc, not another bucket: agents report these URLs, and agents are not trusted."""
        try:
            fs, path = fsspec.core.url_to_fs(url)
        except (ValueError, ImportError, TypeError):
            return False
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        inside = posixpath.normpath(path).startswith(posixpath.normpath(self.job_dir(job_id)) + "/")
        return protocol == self.protocol and inside

    def job_dir(self, job_id: str) -> str:
        return posixpath.join(self.root, job_id)

    def remove_job(self, job_id: str) -> None:
        """Delete every checkpoint of the job (a job the store forgot: core/retention.py)."""
        if self.fs.exists(self.job_dir(job_id)):
            self.fs.rm(self.job_dir(job_id), recursive=True)

    def step_dir(self, job_id: str, step: int) -> str:
        return posixpath.join(self.job_dir(job_id), f"step-{step:012d}")

    def publish(self, job_id: str, step: int, local_dir: Path) -> Manifest:
        """Upload the files of `local_dir` as checkpoint `step`, then its manifest (last, atomically)."""
        target = self.step_dir(job_id, step)
        files = sorted(p for p in Path(local_dir).iterdir() if p.is_file() and p.name != MANIFEST)
        if not files:
            raise CheckpointError(f"checkpoint: {local_dir} has no files to save")
        entries = []
        try:
            self.fs.makedirs(target, exist_ok=True)
            for path in files:
                remote = posixpath.join(target, path.name)
                self.fs.put_file(str(path), remote)
                size, digest = _sha256_file(self.fs, remote)  # hash what landed, not what we meant to send
                entries.append(FileEntry(path.name, size, digest))
            manifest = Manifest(job_id, step, datetime.now(UTC).isoformat(), entries)
            self._write_manifest(target, manifest)
        except OSError as err:
            try:  # a partial step never counts (no manifest); remove it so a full disk gets its space back
                self.fs.rm(target, recursive=True)
            except OSError:
                pass
            raise CheckpointError(
                f"checkpoint: saving step {step} of {job_id} failed ({err}); the previous checkpoint stays valid"
            ) from err
        self._prune(job_id)
        return replace(manifest, url=self.url(target))

    def _write_manifest(self, target: str, manifest: Manifest) -> None:
        body = json.dumps(asdict(manifest), indent=1).encode()
        final = posixpath.join(target, MANIFEST)
        if _is_local(self.fs):  # write then rename: readers never see half a manifest
            tmp = final + ".tmp"
            self.fs.pipe_file(tmp, body)
            self.fs.mv(tmp, final)
        else:  # an object PUT is atomic by itself
            self.fs.pipe_file(final, body)

    def manifests(self, job_id: str) -> list[Manifest]:
        """Manifests of the job's published checkpoints, newest first (not verified)."""
        try:
            steps = sorted(self.fs.ls(self.job_dir(job_id), detail=False), reverse=True)
        except FileNotFoundError:
            return []
        out = []
        for step_dir in steps:
            try:
                raw = json.loads(self.fs.cat_file(posixpath.join(step_dir, MANIFEST)))
            except (FileNotFoundError, ValueError):
                continue  # partial: no manifest (or a torn one) means it never counted
            files = [FileEntry(**f) for f in raw.pop("files")]
            raw.pop("url", None)
            out.append(Manifest(**raw, files=files, url=self.url(step_dir)))
        return out

    def verify(self, manifest: Manifest) -> str | None:
        """None when every file matches its size and sha256, else what is wrong."""
        base = self.path(manifest.url)
        for entry in manifest.files:
            path = posixpath.join(base, entry.name)
            try:
                size, digest = _sha256_file(self.fs, path)
            except FileNotFoundError:
                return f"{entry.name} is missing"
            if (size, digest) != (entry.size, entry.sha256):
                return f"{entry.name} does not match its manifest (size {size} vs {entry.size})"
        return None

    def verified_at(self, job_id: str, url: str) -> tuple[Manifest | None, str | None]:
        """The job's published checkpoint at `url` if it verifies: (manifest, None), else (None, what is wrong)."""
        manifest = next((m for m in self.manifests(job_id) if m.url.rstrip("/") == url.rstrip("/")), None)
        problem = "has no manifest" if manifest is None else self.verify(manifest)
        return (None, problem) if problem else (manifest, None)

    def latest_verified(self, job_id: str) -> tuple[Manifest | None, list[str]]:
        """The newest checkpoint that verifies, and a line for each newer one skipped."""
        skipped = []
        for manifest in self.manifests(job_id):
            problem = self.verify(manifest)
            if problem is None:
                return manifest, skipped
            skipped.append(f"step {manifest.step}: {problem}")
            log.warning("checkpoint=skipped job=%s step=%d reason=%r", job_id, manifest.step, problem)
        return None, skipped

    def latest_verified_soon(
        self, job_id: str, fence: int, wait_s: float | None
    ) -> tuple[Manifest | None, list[str]] | None:
        """latest_verified, hashed on a thread: None while it goes on past `wait_s` (ask again later; None waits to
        the end). A server's round hashed gigabytes inline (about 1 s a GB on a local disk), dispatching nothing.
        A hash started for an older `fence` of the job (it ran since, and may have saved) is not the answer."""
        with self._lock:
            started, future = self._looking.get(job_id, (None, None))
            if future is None or started != fence:
                future = Future()
                self._looking[job_id] = (fence, future)
                threading.Thread(target=self._look, args=(job_id, future), daemon=True, name="checkpoint-hash").start()
        try:
            result = future.result(timeout=wait_s)
        except TimeoutError:
            return None
        finally:
            with self._lock:
                if future.done() and self._looking.get(job_id, (None, None))[1] is future:
                    del self._looking[job_id]
        return result

    def _look(self, job_id: str, future: Future) -> None:
        with self._hashers:
            try:
                future.set_result(self.latest_verified(job_id))
            except BaseException as error:  # the caller's, as if it had hashed inline
                future.set_exception(error)

    def _prune(self, job_id: str) -> None:
        """Keep the newest `keep` published checkpoints; drop everything older, partial ones included."""
        kept = self.manifests(job_id)[: self.keep]
        if len(kept) < self.keep:
            return
        oldest_kept = self.path(kept[-1].url).rstrip("/")
        for step_dir in self.fs.ls(self.job_dir(job_id), detail=False):
            if step_dir.rstrip("/") < oldest_kept:
                self.fs.rm(step_dir, recursive=True)


def _is_local(fs) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol or "local" in protocol
