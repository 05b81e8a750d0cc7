"""Provisioners start agents for chosen offers. The local one starts `broker agent` processes
that stand for instances; a spot one is preempted where its trace says capacity was lost.
(Terraform and the cloud SDKs provision real instances: infra/terraform/.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from broker.agents.tokens import issue
from broker.domain.offer import Offer
from broker.domain.stops import stops_held

LOCAL_TOKEN_TTL = timedelta(days=30)  # a local agent lives as long as the command that started it


class LocalProvisioner:
    """Agents as local processes, sharing this machine's Redis and checkpoint store."""

    def __init__(
        self,
        redis_url: str,
        checkpoint_root: str,
        run_root: Path,
        speedup: float = 1.0,
        lease_s: float = 5.0,
        prefix: str = "broker:",
        shards: int = 1,
        agent_secret: str | None = None,
    ):
        self.redis_url, self.checkpoint_root, self.run_root = redis_url, checkpoint_root, Path(run_root)
        self.agent_secret = agent_secret  # the broker's, when it asks agents for tokens: each agent gets its own
        self.prefix, self.shards = prefix, shards  # the agents' namespace: the store they share with the broker
        self.speedup, self.lease_s = speedup, lease_s
        self.agents: dict[str, subprocess.Popen] = {}

    def start(self, agent_id: str, offer: Offer, notices: str = "none", for_job: str | None = None) -> subprocess.Popen:
        """Start an agent standing for an instance of `offer`; `notices` as for `broker agent --notices`; `for_job`:
        it runs that job alone (`broker run`)."""
        self.run_root.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            "-m",
            "broker",
            "agent",
            "--id",
            agent_id,
            "--offer",
            offer.id,
            "--notices",
            notices,
            "--speedup",
            str(self.speedup),
            "--lease-s",
            str(self.lease_s),
            "--checkpoints",
            self.checkpoint_root,
            "--runs",
            str(self.run_root),
            *(["--for-job", for_job] if for_job else []),
        ]
        env = {
            **os.environ,
            "BROKER_REDIS_URL": self.redis_url,
            "BROKER_PREFIX": self.prefix,
            "BROKER_SHARDS": str(self.shards),
        }
        env.pop("BROKER_AGENT_TOKEN", None)  # another agent's, where this shell holds one
        if self.agent_secret:  # the server admits no agent without one (it refused these, and the job waited)
            env["BROKER_AGENT_TOKEN"] = issue(self.agent_secret, agent_id, datetime.now(UTC) + LOCAL_TOKEN_TTL)
        # a stop as it starts would orphan it (domain/stops.py): stop_all stops only the agents kept here
        with open(self.run_root / f"agent-{agent_id}.log", "ab") as log, stops_held():
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
            self.agents[agent_id] = proc
        return proc

    def stop_all(self, timeout_s: float = 10.0) -> None:
        """SIGTERM every agent (each checkpoints its job), then SIGKILL stragglers."""
        for proc in self.agents.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.agents.values():
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
