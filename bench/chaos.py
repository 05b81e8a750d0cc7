"""Chaos: real jobs on real local agents and a real `broker server`, while instances and the server die.

Submits `--jobs` checkpointing torch jobs (examples/jobs/train_mlp.py) to `--agents` local agents
(processes standing for on-demand L4 instances) and a `broker server` process. Meanwhile it kills
(SIGKILL) one random instance every `--kill-every-s` seconds, agent and job process together as a
lost machine would, and starts a fresh one in its place; and it kills the server once and starts
it again; with `--redis-restart-at-s` it also restarts redis-server (AOF on, same port) under load; with
`--notice-every-s` a local metadata service (one per instance, each cloud's own format) announces a
preemption to a busy instance, 120 s ahead for AWS and 30 s for GCP and Azure, and the instance is
reclaimed once its agent has left. After `--kills` kills and `--notices` notices the fleet drains; the
run waits while jobs advance, not for a wall-clock total.

At the end: how many jobs finished, how many were lost, whether any job ever had two runs at once, and
the most work a run lost, in steps since its last checkpoint (goal: at most one checkpoint interval) and
as the server measures it in seconds (that includes a run's start-up).

    python bench/chaos.py --json [--jobs 50 --agents 10]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from chaos_report import CLOUDS, notice_timing, tail, why_not_done  # bench/chaos_report.py, beside this file
from metadata import Metadata  # bench/metadata.py, beside this file

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "chaos:"
STEPS, CKPT_EVERY, STEP_SLEEP_S = 60, 10, 0.05


def _kill_instance(store, provisioner, agent_id: str) -> None:
    """SIGKILL an agent and its job's process group: the instance is gone."""
    agent = store.get_agent(agent_id)
    if agent and agent.job:
        pid = _job_pid(store, agent.job, agent.fence)
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    process = provisioner.agents.pop(agent_id)
    process.kill()
    process.wait()


def _has_work_to_save(store, agent) -> bool:
    """Whether the agent runs a job that has reported progress in its current run (something to checkpoint)."""
    if agent is None or agent.job is None:
        return False
    run = store.get_job(agent.job).current_run
    return run is not None and run.fence == agent.fence and run.progress_done > 0


def _job_pid(store, job_id: str, fence: int | None) -> int | None:
    """The pid the agent reported when it started the job's current run."""
    for _, fields in store.redis.xrevrange(store.key("agent-events"), count=2000):
        if fields.get("job") == job_id and fields.get("type") == "started" and int(fields.get("fence", -1)) == fence:
            return int(json.loads(fields["data"]).get("pid") or 0) or None
    return None


def _server(redis_url: str, checkpoints: str, home: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "BROKER_REDIS_URL": redis_url,
        "BROKER_PREFIX": PREFIX,
        "BROKER_CHECKPOINTS": checkpoints,
        "BROKER_HOME": str(home),
    }
    log = open(home.parent / "server.log", "ab")  # the process keeps it; read when a run stalls
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "broker",
            "server",
            "--consumer",
            "chaos-server",
            "--leader-lease-s",
            "2",
            "--metrics-port",
            "0",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )


def _resumed_step(run) -> int:
    """The step a run resumed from (its checkpoint URL ends in step-NNNNNNNNNNNN), 0 for a fresh start."""
    return int(run.resume_from.rstrip("/").rsplit("step-", 1)[1]) if run.resume_from else 0


def overlapping(job) -> bool:
    """Whether two runs of the job were ever started and not yet ended at the same moment."""
    spans = sorted((r.started_at, r.ended_at) for r in job.runs if r.started_at is not None)
    return any(end is None or end > later for (_, end), (later, _) in zip(spans, spans[1:]))


def terminal_events(store, job_id: str) -> int:
    """How many terminal state changes the job's event log holds (1 for a job that ended once)."""
    return sum(e["state"] in ("done", "failed", "cancelled") for e in store.events(job_id, count=1_000_000))


def run(
    redis_url: str,
    jobs: int = 50,
    agents: int = 10,
    kill_every_s: float = 4.0,
    server_kill_at_s: float = 8.0,
    instance_kills: int = 12,
    seed: int = 0,
    restart_redis=None,
    redis_restart_at_s: float = 12.0,
    notice_every_s: float | None = None,
    notices_wanted: int = 3,
    stall_s: float = 120.0,
) -> dict:
    """The chaos lasts until `instance_kills` instances were killed, the server once, Redis restarted (with
    `restart_redis`: a callable that stops redis-server and starts it on the same port and data) and, with
    `notice_every_s`, `notices_wanted` preemptions were announced to busy instances (clouds in turn). Then
    the fleet drains: the run waits while any job advances (a new run, state, progress or checkpoint) and
    gives up only when none has for `stall_s` seconds, so a slow machine makes it slower, never red."""
    from broker import planning
    from broker.agents.checkpoints import CheckpointStore
    from broker.agents.provision import LocalProvisioner
    from broker.core.broker import Broker
    from broker.core.clock import SystemClock
    from broker.domain.model import Tier
    from broker.domain.specfile import validate_spec
    from broker.pricing.catalog import PriceCatalog
    from broker.store.jobs import Store

    rng = random.Random(seed)
    store = Store(redis_url, prefix=PREFIX, outage_s=60)
    for key in store.redis.scan_iter(f"{PREFIX}*"):
        store.redis.delete(key)
    work = Path(tempfile.mkdtemp(prefix="broker-chaos-"))
    checkpoints = str(work / "checkpoints")
    catalog = PriceCatalog.from_snapshot()
    offer = min(
        (o for o in catalog.offers if o.tier == Tier.on_demand and o.accelerator == "L4" and o.accelerator_count == 1),
        key=lambda o: o.price_usd_per_h,
    )
    provisioner = LocalProvisioner(redis_url, checkpoints, work / "runs", lease_s=2.0, prefix=PREFIX)
    clock = SystemClock()
    broker = Broker(store, catalog, planning.get(), clock)
    spec = {
        "run": [sys.executable, str(ROOT / "examples" / "jobs" / "train_mlp.py")],
        "resources": {"accelerators": ["L4:1"]},
        "work": {"gpu_hours": 0.01},
        "checkpoint": {"size_gb": 0.001, "restore_minutes": 0.1},
        "max_restarts": 20,
        "env": {
            "STEPS": str(STEPS),
            "CKPT_EVERY": str(CKPT_EVERY),
            "STEP_SLEEP_S": str(STEP_SLEEP_S),
            "OUTPUT": "/dev/null",
        },
    }
    server = _server(redis_url, checkpoints, work / "home")
    count, kills, server_kills, redis_restarts = 0, 0, 0, 0
    metadata = Metadata() if notice_every_s else None
    clouds: dict[str, str] = {}
    notices: list[dict] = []  # one per announced preemption: agent, cloud, job, fence, posted, deadline
    failures: list[dict] = []  # agents that exited with an error (and were restarted): id, exit code, log tail
    logs = work / "runs"

    def start_instance() -> None:
        nonlocal count
        count += 1
        agent_id = f"agent-{count:03d}"
        clouds[agent_id] = list(CLOUDS)[count % len(CLOUDS)]
        provisioner.start(
            agent_id, offer, notices=f"{clouds[agent_id]}={metadata.url(agent_id)}" if metadata else "none"
        )

    try:
        for _ in range(agents):
            start_instance()
        ids = [broker.submit(validate_spec({**spec, "name": f"chaos-{i:03d}"}, clock.now())).id for i in range(jobs)]
        began = last_kill = last_notice = last_change = time.monotonic()
        seen = None
        while True:
            current = [store.get_job(i) for i in ids]
            if all(j.state.terminal for j in current):
                break
            now = time.monotonic()
            if _advance(current) != seen:
                seen, last_change = _advance(current), now
            elif now - last_change >= stall_s:
                break  # nothing moved for stall_s: the result's not_done says what each job was doing
            chaotic = (
                kills < instance_kills
                or server_kills == 0
                or (restart_redis and redis_restarts == 0)
                or (metadata and len(notices) < notices_wanted)
            )
            if server_kills == 0 and now - began >= server_kill_at_s:
                server.kill()
                server.wait()
                server, server_kills = _server(redis_url, checkpoints, work / "home"), 1
            if restart_redis and redis_restarts == 0 and now - began >= redis_restart_at_s:
                restart_redis()
                redis_restarts = 1
            noticed = {n["agent"] for n in notices}
            if kills < instance_kills and now - last_kill >= kill_every_s:
                victim = rng.choice(sorted(set(provisioner.agents) - noticed))
                _kill_instance(store, provisioner, victim)
                kills, last_kill = kills + 1, now
                start_instance()
            if chaotic and metadata and now - last_notice >= notice_every_s:
                infos = {a: store.get_agent(a) for a in sorted(set(provisioner.agents) - noticed)}
                busy = [a for a, info in infos.items() if _has_work_to_save(store, info)]
                if busy:
                    agent_id = rng.choice(busy)
                    info, posted = infos[agent_id], datetime.now(UTC)  # the run that had work to save
                    deadline = metadata.announce(agent_id, CLOUDS[clouds[agent_id]])
                    notices.append(
                        {
                            "agent": agent_id,
                            "cloud": clouds[agent_id],
                            "job": info.job,
                            "fence": info.fence,
                            "posted": posted,
                            "deadline": deadline,
                        }
                    )
                    last_notice = now
            for notice in notices:  # the cloud reclaims an instance once its agent has left (or at the deadline)
                process = provisioner.agents.get(notice["agent"])
                if process and (process.poll() is not None or datetime.now(UTC) >= notice["deadline"]):
                    _kill_instance(store, provisioner, notice["agent"])
                    start_instance()
            noticed = {n["agent"] for n in notices}
            for agent_id, process in list(provisioner.agents.items()):  # systemd's Restart=on-failure, as on
                if agent_id not in noticed and process.poll() not in (None, 0):  # the Terraform-made instances
                    failures.append(
                        {"agent": agent_id, "code": process.poll(), "log": tail(logs / f"agent-{agent_id}.log", 8)}
                    )
                    provisioner.agents.pop(agent_id)
                    provisioner.start(
                        agent_id, offer, notices=f"{clouds[agent_id]}={metadata.url(agent_id)}" if metadata else "none"
                    )
            time.sleep(0.2)
        elapsed = time.monotonic() - began
        final = [store.get_job(i) for i in ids]
        server_exit = server.poll()  # None: still running, as it should be
        agents_alive = {a: p.poll() is None for a, p in provisioner.agents.items()}
    finally:
        server.kill()
        provisioner.stop_all()
        if metadata:
            metadata.close()
    timing = notice_timing(notices, {j.id: j for j in final}, CheckpointStore(checkpoints))
    interval_s = CKPT_EVERY * STEP_SLEEP_S
    lost_s = [r.work_lost_s for j in final for r in j.runs]
    lost_steps = [
        r.progress_done - (r.checkpoint_step or _resumed_step(r))
        for j in final
        for r in j.runs
        if r.end_reason not in (None, "finished")
    ]
    return {
        "submitted": jobs,
        "finished": sum(j.state.value == "done" for j in final),
        "lost": sum(not j.state.terminal or j.state.value != "done" for j in final),
        "duplicated": sum(overlapping(j) for j in final),
        "max_work_lost_s": round(max(lost_s, default=0.0), 2),
        "max_work_lost_steps": max(lost_steps, default=0.0),
        "checkpoint_interval_steps": CKPT_EVERY,
        "checkpoint_interval_s": interval_s,
        "instances_killed": kills,
        "server_kills": server_kills,
        "migrations": sum(j.migrations for j in final),
        "seconds": round(elapsed, 1),
        "redis_restarts": redis_restarts,
        "duplicate_terminal": sum(terminal_events(store, j.id) > 1 for j in final),
        **timing,
        "stalled": not all(j.state.terminal for j in final),
        "server_exited": server_exit,
        "server_log_tail": tail(work / "server.log") if not all(j.state.terminal for j in final) else "",
        "agents_alive": agents_alive,
        "agent_failures": failures,
        "agent_log_tails": {a: tail(work / "runs" / f"agent-{a}.log", 8) for a in agents_alive}
        if not all(j.state.terminal for j in final)
        else {},
        "not_done": [why_not_done(store, j) for j in final if j.state.value != "done"],
    }


def _advance(jobs) -> tuple:
    """What changes while a job moves on: its state, its runs, its newest run's progress and checkpoint."""
    return tuple(
        (j.state, len(j.runs), j.runs[-1].progress_done if j.runs else 0, j.runs[-1].checkpoint_step if j.runs else 0)
        for j in jobs
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--kill-every-s", type=float, default=4.0)
    parser.add_argument("--kills", type=int, default=40, help="Instances killed before the fleet drains.")
    parser.add_argument("--notices", type=int, default=10, help="Preemptions announced before the fleet drains.")
    parser.add_argument(
        "--notice-every-s", type=float, default=3.0, help="Announce a timed preemption this often (0: never)."
    )
    parser.add_argument(
        "--redis-restart-at-s", type=float, default=12.0, help="Restart redis-server this far in (0: never)."
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from broker.store import embedded

    home = Path(tempfile.mkdtemp(prefix="broker-chaos-redis-"))
    url = embedded.ensure(home).url  # AOF with fsync always, as the product runs it

    def restart_redis() -> None:
        embedded.stop(home)
        embedded.ensure(home)  # the same port and data

    try:
        result = run(
            url,
            args.jobs,
            args.agents,
            args.kill_every_s,
            instance_kills=args.kills,
            notices_wanted=args.notices,
            restart_redis=restart_redis if args.redis_restart_at_s else None,
            redis_restart_at_s=args.redis_restart_at_s,
            notice_every_s=args.notice_every_s or None,
        )
    finally:
        embedded.stop(home)
    print(json.dumps(result, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
