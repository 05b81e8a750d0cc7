"""Secrets stay out of what broker writes: a Redis password, the agents' secret and a registration token are
grepped for in every log, output and run file a real server, agent and job produce (debug logging on)."""

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from conftest import start_redis

PASSWORD, SECRET = "s3cret-redis-pass", "agent-secret-0xdeadbeef"


@pytest.fixture
def private_redis(tmp_path):
    proc, port = start_redis(tmp_path, password=PASSWORD)
    yield port
    proc.kill()
    proc.wait()


def broker(env, *args, **popen):
    return [sys.executable, "-m", "broker", "--debug", *args], {"env": env, "text": True, **popen}


def test_no_secret_reaches_a_log_an_output_or_a_run_file(private_redis, tmp_path):
    home = tmp_path / "home"
    env = {
        **os.environ,
        "BROKER_REDIS_URL": f"redis://:{PASSWORD}@127.0.0.1:{private_redis}/0",
        "BROKER_HOME": str(home),
        "BROKER_AGENT_SECRET": SECRET,
        "BROKER_CHECKPOINTS": str(tmp_path / "ckpt"),
    }
    outputs = []

    def cli(*args):
        argv, kw = broker(env, *args)
        done = subprocess.run(argv, capture_output=True, timeout=120, **kw)
        outputs.append(done.stdout + done.stderr)
        return done

    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "run": [sys.executable, "-c", "print('hello from the job')"],
                "resources": {"accelerators": ["L4:1"]},
                "work": {"gpu_hours": 0.01},
                "tiers": ["on_demand"],
            }
        )
    )
    submitted = cli("submit", str(job), "--json")
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["job"]
    issued = cli("agents", "token", "--id", "a1")
    token = issued.stdout.strip()
    assert issued.returncode == 0 and token
    outputs.pop()  # printing the token is that command's job; everything else must not
    offer = json.loads(submitted.stdout)["quote"]["chosen"]["offer"]
    offer_id = f"{offer['cloud']}/{offer['zone'] or offer['region']}/{offer['instance_type']}/on_demand"
    logs = tmp_path / "logs"
    logs.mkdir()
    processes = []
    for name, args in (
        ("agent", ("agent", "--id", "a1", "--offer", offer_id, "--token", token, "--runs", str(tmp_path / "runs"))),
        ("server", ("server", "--consumer", "s1", "--metrics-port", "0")),
    ):
        argv, kw = broker(env, *args, stdout=open(logs / f"{name}.log", "w"), stderr=subprocess.STDOUT)
        processes.append(subprocess.Popen(argv, **kw))
    try:
        deadline = time.monotonic() + 120
        while json.loads(cli("status", job_id, "--json").stdout)["state"] != "done":
            assert time.monotonic() < deadline, (logs / "agent.log").read_text()[-2000:] + (
                logs / "server.log"
            ).read_text()[-2000:]
            time.sleep(0.5)
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)
    cli("list", "--json")
    wrong = dict(env, BROKER_REDIS_URL=f"redis://:wrong-{PASSWORD}@127.0.0.1:{private_redis}/0")
    refused = subprocess.run(broker(wrong, "list")[0], capture_output=True, text=True, env=wrong, timeout=60)
    assert refused.returncode != 0
    outputs.append(refused.stdout + refused.stderr)

    written = [p for p in [*logs.iterdir(), *(tmp_path / "runs").rglob("*"), *home.rglob("*")] if p.is_file()]
    assert any("hello from the job" in p.read_text(errors="replace") for p in written)  # the job's own output is there
    texts = [(str(p), p.read_text(errors="replace")) for p in written] + [("cli output", o) for o in outputs]
    for where, text in texts:
        for secret in (PASSWORD, SECRET, token):
            assert secret not in text, f"{secret[:6]}... leaked into {where}"
