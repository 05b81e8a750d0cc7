"""Preemption notices, each read in its cloud's own format, plus a trace replayer for local agents.

- AWS: IMDSv2. PUT /latest/api/token for a session token, then GET
  /latest/meta-data/spot/instance-action: 404 while none, else {"action": ..., "time": ...}
  about two minutes before the instance is reclaimed.
- GCP: GET /computeMetadata/v1/instance/preempted with `Metadata-Flavor: Google` answers
  TRUE once preemption has begun (about 30 s before the VM stops).
- Azure: Scheduled Events, GET /metadata/scheduledevents with `Metadata: true`; a Preempt
  event carries NotBefore (at least 30 s ahead); POSTing StartRequests acknowledges it.
Each watcher's check() returns a Notice or None and never raises: a metadata service that does not answer as its
cloud's does (another cloud, or a container it is out of reach from) is warned of once and asked less often until it
answers again; the agent works on without notices meanwhile.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path

from broker.domain.offer import NOTICE_LEAD_S

log = logging.getLogger(__name__)

HTTP_TIMEOUT_S = 2.0
UNANSWERED_RETRY_S = 30.0  # the longest wait between asks of a metadata service that does not answer
# what an ask raises when the service is out of reach (OSError) or its body is not in the cloud's format (the rest)
UNANSWERED = (OSError, ValueError, LookupError, TypeError, AttributeError)


class Unanswered(OSError):
    """The metadata service answered, but not as its cloud's does (a status it never gives on that cloud)."""


@dataclass(frozen=True)
class Notice:
    cloud: str
    action: str
    deadline: datetime  # when the instance goes away
    event_id: str | None = None
    raw: dict = field(default_factory=dict)


def _request(
    url: str, method: str = "GET", headers: dict | None = None, body: bytes | None = None
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


class MetadataWatcher:
    """What the clouds' watchers share: `_read` asks the service once (raising OSError or ValueError when it does not
    answer as it should); check() warns once when it stops answering, and says when it answers again. Meanwhile it
    asks after 1, 2, 4 ... seconds, at most UNANSWERED_RETRY_S: each ask of a service out of reach holds the agent's
    loop for its timeout. A notice missed then is a preempted run found when its lease lapses."""

    cloud = ""

    def __init__(self):
        self._misses, self._retry_at = 0, 0.0

    def _read(self) -> Notice | None:
        raise NotImplementedError

    def check(self) -> Notice | None:
        if self._misses and time.monotonic() < self._retry_at:
            return None
        try:
            notice = self._read()
        except UNANSWERED as err:
            if not self._misses:
                log.warning("notices=%s unanswered error=%r: no preemption notices until it answers", self.cloud, err)
            self._misses += 1
            self._retry_at = time.monotonic() + min(UNANSWERED_RETRY_S, 2.0 ** (self._misses - 1))
            return None
        if self._misses:
            log.warning("notices=%s answering again after %d unanswered asks", self.cloud, self._misses)
        self._misses = 0
        return notice


class AwsSpotNotices(MetadataWatcher):
    """EC2 spot interruption notices through IMDSv2."""

    cloud = "aws"
    lead_s = NOTICE_LEAD_S["aws"]

    def __init__(self, base_url: str = "http://169.254.169.254"):
        super().__init__()
        self.base_url = base_url.rstrip("/")
        self._token: str | None = None
        self._token_expires = 0.0

    def _session_token(self) -> str:
        if self._token is None or time.monotonic() > self._token_expires:
            status, body = _request(
                f"{self.base_url}/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "21600"}
            )
            if status != 200:
                raise Unanswered(f"IMDSv2 token request answered {status}")
            self._token, self._token_expires = body.decode(), time.monotonic() + 21000
        return self._token

    def _read(self) -> Notice | None:
        headers = {"X-aws-ec2-metadata-token": self._session_token()}
        status, body = _request(f"{self.base_url}/latest/meta-data/spot/instance-action", headers=headers)
        if status == 401:  # token expired early: fetch a new one next time
            self._token = None
            return None
        if status == 404:  # no interruption scheduled
            return None
        if status != 200:
            raise Unanswered(f"instance-action answered {status}")
        action = json.loads(body)
        deadline = datetime.fromisoformat(action["time"].replace("Z", "+00:00"))
        return Notice("aws", action["action"], deadline, raw=action)


class GcpPreemptionNotices(MetadataWatcher):
    """GCE preemption through the metadata server's `preempted` flag."""

    cloud = "gcp"
    lead_s = NOTICE_LEAD_S["gcp"]

    def __init__(self, base_url: str = "http://metadata.google.internal"):
        super().__init__()
        self.base_url = base_url.rstrip("/")

    def _read(self) -> Notice | None:
        status, body = _request(
            f"{self.base_url}/computeMetadata/v1/instance/preempted", headers={"Metadata-Flavor": "Google"}
        )
        if status != 200:
            raise Unanswered(f"preempted answered {status}")
        if body.strip().upper() != b"TRUE":
            return None
        return Notice("gcp", "preempted", datetime.now(UTC) + timedelta(seconds=self.lead_s))


class AzureScheduledEvents(MetadataWatcher):
    """Azure spot evictions through Scheduled Events (EventType Preempt)."""

    cloud = "azure"
    lead_s = NOTICE_LEAD_S["azure"]
    api_version = "2020-07-01"

    def __init__(self, base_url: str = "http://169.254.169.254"):
        super().__init__()
        self.url = f"{base_url.rstrip('/')}/metadata/scheduledevents?api-version={self.api_version}"

    def _read(self) -> Notice | None:
        status, body = _request(self.url, headers={"Metadata": "true"})
        if status != 200:
            raise Unanswered(f"scheduledevents answered {status}")
        for event in json.loads(body).get("Events", []):
            if event.get("EventType") == "Preempt":
                not_before = event.get("NotBefore")
                deadline = (
                    parsedate_to_datetime(not_before)
                    if not_before
                    else datetime.now(UTC) + timedelta(seconds=self.lead_s)
                )
                return Notice("azure", "Preempt", deadline, event_id=event["EventId"], raw=event)
        return None

    def acknowledge(self, notice: Notice) -> bool:
        """Tell Azure the VM is ready (checkpoint saved), so the eviction may start now."""
        body = json.dumps({"StartRequests": [{"EventId": notice.event_id}]}).encode()
        try:
            status, _ = _request(self.url, "POST", {"Metadata": "true", "Content-Type": "application/json"}, body)
        except OSError:
            return False
        return status == 200


class TraceNotices:
    """Replays a spot trace (shared/data/traces format) for a local agent standing for a spot instance.

    The instance runs while the trace says capacity is there; the first tick at or after
    `start_tick` with value 0 is its preemption, announced `lead_s` (trace time) ahead.
    Trace time runs `speedup` times faster than the wall clock, from the agent's start, or with
    `from_job` from its first job's (the demo's preemption then lands in the job however long the
    agents and the job took to start on a busy machine).
    """

    cloud = "trace"

    def __init__(
        self, path: Path, start_tick: int = 0, speedup: float = 1.0, lead_s: float = 120.0, from_job: bool = False
    ):
        from broker.pricing.traces import read_ticks  # numpy: only for an agent replaying a trace

        self.gap_s, ticks = read_ticks(Path(path))  # a file of another shape is one line naming it (was a KeyError)
        values = ticks[start_tick:].tolist()
        lost = next((i for i, v in enumerate(values) if v <= 0), None)
        self.preempt_after_s = None if lost is None else lost * self.gap_s  # trace seconds from start
        self.speedup, self.lead_s = speedup, lead_s
        self.started = None if from_job else time.monotonic()

    def job_started(self) -> None:
        """The agent started a job: the trace's clock starts now if it waits for the first one."""
        if self.started is None:
            self.started = time.monotonic()

    def check(self) -> Notice | None:
        if self.preempt_after_s is None or self.started is None:
            return None
        elapsed = (time.monotonic() - self.started) * self.speedup
        if elapsed + self.lead_s < self.preempt_after_s:
            return None
        remaining_wall_s = max(0.0, (self.preempt_after_s - elapsed) / self.speedup)
        return Notice("trace", "terminate", datetime.now(UTC) + timedelta(seconds=remaining_wall_s))


def watches_cloud(notices) -> bool:
    """Whether an agent with these notices is on the cloud instance it stands for: only there do a cloud's own
    notices come. One with none, or a trace's, is a local stand-in."""
    return isinstance(notices, MetadataWatcher)


def watcher(spec: str, speedup: float = 1.0):
    """A watcher from a CLI spec: aws[=URL], gcp[=URL], azure[=URL], trace=PATH[@TICK[@job]] (@job: the trace's
    clock starts with the agent's first job), or none."""
    kind, _, arg = spec.partition("=")
    if kind == "none":
        return None
    if kind == "trace":
        path, _, at = arg.partition("@")
        tick, _, anchor = at.partition("@")
        if anchor not in ("", "job"):
            raise ValueError(f"notices: {spec!r}; after the tick only @job is known (replay from the first job)")
        if not Path(path).is_file():
            raise ValueError(f"notices: no trace file {path!r}; give a trace JSON (Can't Be Late's format)")
        if tick and not tick.isdigit():
            raise ValueError(f"notices: {spec!r}; the tick after @ is a whole number (the trace's tick to start at)")
        return TraceNotices(Path(path), int(tick or 0), speedup, from_job=anchor == "job")
    classes = {"aws": AwsSpotNotices, "gcp": GcpPreemptionNotices, "azure": AzureScheduledEvents}
    if kind not in classes:
        raise ValueError(f"notices: unknown source {spec!r}; use aws, gcp, azure, trace=PATH[@TICK[@job]] or none")
    if arg and not arg.startswith(("http://", "https://")):
        raise ValueError(f"notices: {arg!r} is no URL; give {kind}=http://HOST[:PORT] (its metadata service) or {kind}")
    return classes[kind](arg) if arg else classes[kind]()
