"""Preemption notices, read from local HTTP servers that answer exactly like each cloud's metadata service."""

import json
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from broker.agents import notices as notices_module
from broker.agents.notices import AwsSpotNotices, AzureScheduledEvents, GcpPreemptionNotices, TraceNotices, watcher
from broker.domain.errors import BrokerError


class MetadataServer:
    """A loopback HTTP server; `state` decides what it answers, `requests` records what it got."""

    def __init__(self, handler):
        self.state, self.requests = {}, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                outer.requests.append((self.command, self.path, dict(self.headers), body))
                status, payload = handler(outer.state, self.command, self.path, self.headers, body)
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_PUT = do_POST = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def serve():
    servers = []

    def start(handler):
        servers.append(MetadataServer(handler))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def aws_imds(state, method, path, headers, body):
    if path == "/latest/api/token":
        if method != "PUT" or "X-aws-ec2-metadata-token-ttl-seconds" not in headers:
            return 400, b""
        return 200, b"TOKEN-abc"
    if headers.get("X-aws-ec2-metadata-token") != "TOKEN-abc":
        return 401, b""
    if path == "/latest/meta-data/spot/instance-action" and "action" in state:
        return 200, json.dumps(state["action"]).encode()
    return 404, b"<?xml version='1.0'?><Error>Not Found</Error>"


def test_aws_notice_needs_an_imdsv2_token_and_is_absent_until_scheduled(serve):
    server = serve(aws_imds)
    notices = AwsSpotNotices(server.url)
    assert notices.check() is None
    server.state["action"] = {"action": "terminate", "time": "2026-11-22T12:02:00Z"}
    notice = notices.check()
    assert notice.cloud == "aws" and notice.action == "terminate"
    assert notice.deadline == datetime(2026, 11, 22, 12, 2, tzinfo=UTC)
    tokens = [r for r in server.requests if r[1] == "/latest/api/token"]
    assert len(tokens) == 1 and tokens[0][0] == "PUT"  # the session token is reused


def gce_metadata(state, method, path, headers, body):
    if headers.get("Metadata-Flavor") != "Google":
        return 403, b"Missing Metadata-Flavor:Google header."
    if path.startswith("/computeMetadata/v1/instance/preempted"):
        return 200, b"TRUE" if state.get("preempted") else b"FALSE"
    return 404, b""


def test_gcp_notice_follows_the_preempted_flag(serve):
    server = serve(gce_metadata)
    notices = GcpPreemptionNotices(server.url)
    assert notices.check() is None
    server.state["preempted"] = True
    notice = notices.check()
    assert notice.cloud == "gcp"
    assert 25 <= (notice.deadline - datetime.now(UTC)).total_seconds() <= 30


PREEMPT = {
    "EventId": "f020ba2e-3bc0-4c40-a10b-86575a9eabd5",
    "EventType": "Preempt",
    "ResourceType": "VirtualMachine",
    "Resources": ["spot-vm-1"],
    "EventStatus": "Scheduled",
    "NotBefore": "Sun, 22 Nov 2026 12:00:30 GMT",
    "Description": "",
    "EventSource": "Platform",
    "DurationInSeconds": -1,
}


def azure_events(state, method, path, headers, body):
    if headers.get("Metadata") != "true":
        return 400, b'{"error": "Bad request. Required metadata header not specified"}'
    if not path.startswith("/metadata/scheduledevents?api-version="):
        return 404, b""
    if method == "POST":
        state["acked"] = json.loads(body)
        return 200, b""
    events = [PREEMPT] if state.get("preempt") else [dict(PREEMPT, EventType="Freeze", EventId="other")]
    return 200, json.dumps({"DocumentIncarnation": 2, "Events": events}).encode()


def test_azure_preempt_event_is_found_and_acknowledged(serve):
    server = serve(azure_events)
    notices = AzureScheduledEvents(server.url)
    assert notices.check() is None  # a Freeze event is not a preemption
    server.state["preempt"] = True
    notice = notices.check()
    assert notice.event_id == PREEMPT["EventId"]
    assert notice.deadline == datetime(2026, 11, 22, 12, 0, 30, tzinfo=UTC)
    assert notices.acknowledge(notice)
    assert server.state["acked"] == {"StartRequests": [{"EventId": PREEMPT["EventId"]}]}


def test_an_unreachable_metadata_service_is_no_notice():
    assert AwsSpotNotices("http://127.0.0.1:9").check() is None
    assert GcpPreemptionNotices("http://127.0.0.1:9").check() is None
    assert AzureScheduledEvents("http://127.0.0.1:9").check() is None


def test_a_service_that_stops_answering_is_warned_of_once_asked_less_often_and_heard_again(serve, clock, caplog):
    """An agent on another cloud, or in a container out of the metadata service's reach, warned at every poll (once a
    second, for good) and, where the service timed out, held its loop for that timeout each time. Azure's and GCP's
    errors were not even warned of: they read as "no notice"."""
    answers = {"aws": aws_imds, "gcp": gce_metadata, "azure": azure_events}
    made = {"aws": AwsSpotNotices, "gcp": GcpPreemptionNotices, "azure": AzureScheduledEvents}
    for cloud, answer in answers.items():
        server = serve(
            lambda state, *request, answer=answer: (403, b"") if state.get("down") else answer(state, *request)
        )
        notices = made[cloud](server.url)
        server.state["down"] = True
        caplog.clear()
        asked = []
        for _ in range(40):  # 40 polls a second apart
            before = len(server.requests)
            assert notices.check() is None
            asked.append(len(server.requests) > before)
            clock[0] += 1.0
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == 1 and f"notices={cloud} unanswered" in warned[0], warned
        assert [i for i, a in enumerate(asked) if a] == [0, 1, 3, 7, 15, 31], (cloud, asked)  # 1, 2, 4 ... 16 s apart
        server.state["down"] = False
        server.state.update(action={"action": "stop", "time": "2026-11-22T12:02:00Z"}, preempted=True, preempt=True)
        clock[0] += 30.0
        assert notices.check() is not None, cloud  # heard again once asked, and the notice is read
        assert "answering again" in caplog.records[-1].getMessage()


def test_a_body_not_in_the_clouds_format_is_no_notice_and_no_crash(serve):
    server = serve(lambda state, method, path, headers, body: (200, b"<html>a captive portal</html>"))
    for watcher_class in (AwsSpotNotices, GcpPreemptionNotices, AzureScheduledEvents):
        assert watcher_class(server.url).check() is None


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    """The watchers' monotonic clock, moved by hand (`clock[0] += s`): no sleep a busy machine could stretch."""
    now = [1000.0]
    monkeypatch.setattr(notices_module.time, "monotonic", lambda: now[0])
    return now


def test_trace_notice_comes_lead_seconds_before_the_first_lost_tick(tmp_path, clock):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 30}, "data": [1, 1, 0, 1, 1, 1, 0]}))
    # from tick 3 the next loss is 3 ticks = 90 trace seconds away; at 600x that is 0.15 s
    notices = TraceNotices(trace, start_tick=3, speedup=600, lead_s=30)
    clock[0] += 0.09  # 54 trace seconds: not yet within the 30 s lead of second 90
    assert notices.check() is None
    clock[0] += 0.02  # 66 trace seconds: inside it
    before = datetime.now(UTC)
    notice = notices.check()
    assert notice is not None
    assert 0.039 <= (notice.deadline - before).total_seconds() <= 0.041 + (datetime.now(UTC) - before).total_seconds()
    assert TraceNotices(trace, start_tick=3, speedup=600).preempt_after_s == 90


def test_a_trace_replayed_from_the_first_job_waits_for_it(tmp_path, clock):
    """An agent that starts slowly must not lose its instance before its first job: the demo's preemption lands in
    the job, whatever the start-up took."""
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 100}, "data": [1, 1, 0, 1, 1, 1, 0]}))
    # from tick 3 the loss is 300 trace seconds away: 0.5 s at 600x, its notice 30 trace seconds (0.05 s) ahead
    notices = TraceNotices(trace, start_tick=3, speedup=600, lead_s=30, from_job=True)
    clock[0] += 0.7  # past the loss, counted from the agent's start
    assert notices.check() is None
    notices.job_started()
    assert notices.check() is None  # the loss is 0.5 s into the job
    clock[0] += 0.44
    assert notices.check() is None  # not yet within the notice's lead
    clock[0] += 0.02
    assert notices.check() is not None
    assert watcher(f"trace={trace}@3@job").started is None and watcher(f"trace={trace}@3").started is not None
    with pytest.raises(ValueError, match="@job"):
        watcher(f"trace={trace}@3@boot")


def test_watcher_specs():
    assert isinstance(watcher("aws"), AwsSpotNotices)
    assert watcher("gcp=http://127.0.0.1:1").base_url == "http://127.0.0.1:1"
    assert watcher("none") is None
    with pytest.raises(ValueError, match="unknown source 'ibm'"):
        watcher("ibm")


def test_watcher_specs_that_cannot_work_are_refused_before_the_agent_starts(tmp_path):
    """A missing trace file and a metadata URL without a scheme were internal errors (one when the agent polled)."""
    with pytest.raises(ValueError, match="no trace file"):
        watcher(f"trace={tmp_path / 'no-such.json'}")
    trace = tmp_path / "t.json"
    trace.write_text("{}")
    with pytest.raises(ValueError, match="the tick after @ is a whole number"):
        watcher(f"trace={trace}@soon")
    with pytest.raises(ValueError, match="'169.254.169.254' is no URL; give aws=http://"):
        watcher("aws=169.254.169.254")
    assert watcher("azure=https://example.test").url.startswith("https://example.test/metadata/")
    for body in ("{}", "not json"):  # a KeyError (an internal error) and a JSON error that named no file
        trace.write_text(body)
        with pytest.raises(BrokerError, match=f"trace {trace}: not a spot trace .*expected {{metadata"):
            watcher(f"trace={trace}@3")
