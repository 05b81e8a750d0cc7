"""A local metadata service for the chaos harness: each cloud's preemption notice (AWS IMDSv2 spot
instance-action, GCP's preempted flag, Azure Scheduled Events), answered in that cloud's format so the
agents' real notice watchers read it."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Metadata:
    """The instance metadata services of every local instance, at /{agent}/...: AWS IMDSv2 spot
    instance-action, GCE's preempted flag, Azure Scheduled Events; `announce` schedules a preemption."""

    def __init__(self):
        self.notices: dict[str, datetime] = {}  # agent -> when its instance goes away
        metadata = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, body: str = "", kind: str = "text/plain") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def do_PUT(self):
                self._reply(200, "token") if self.path.endswith("/latest/api/token") else self._reply(404)

            def do_POST(self):
                self._reply(200)  # Azure StartRequests: acknowledged

            def do_GET(self):
                agent, _, path = self.path.lstrip("/").partition("/")
                deadline = metadata.notices.get(agent)
                if path.startswith("latest/meta-data/spot/instance-action"):
                    if deadline is None:
                        return self._reply(404)
                    return self._reply(
                        200,
                        json.dumps({"action": "terminate", "time": deadline.strftime("%Y-%m-%dT%H:%M:%SZ")}),
                        "application/json",
                    )
                if path.startswith("computeMetadata/v1/instance/preempted"):
                    return self._reply(200, "TRUE" if deadline else "FALSE")
                if path.startswith("metadata/scheduledevents"):
                    events = (
                        []
                        if deadline is None
                        else [
                            {
                                "EventId": f"{agent}-preempt",
                                "EventType": "Preempt",
                                "ResourceType": "VirtualMachine",
                                "Resources": [agent],
                                "EventStatus": "Scheduled",
                                "NotBefore": format_datetime(deadline, usegmt=True),
                                "Description": "",
                                "EventSource": "Platform",
                                "DurationInSeconds": -1,
                            }
                        ]
                    )
                    return self._reply(
                        200, json.dumps({"DocumentIncarnation": len(events), "Events": events}), "application/json"
                    )
                self._reply(404)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, agent_id: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{agent_id}"

    def announce(self, agent_id: str, lead_s: float) -> datetime:
        """Schedule the instance's preemption `lead_s` from now (whole seconds: AWS's format has no fraction)."""
        deadline = (datetime.now(UTC) + timedelta(seconds=lead_s)).replace(microsecond=0)
        self.notices[agent_id] = deadline
        return deadline

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
