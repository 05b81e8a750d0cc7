"""Start-up time of the `broker` command: --help and the read commands, each run as a fresh process (median of 5)
against an embedded store holding one finished job. Prints one JSON object: seconds per command."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BROKER = [sys.executable, "-m", "broker"]


def timed(args: list[str], env: dict) -> float:
    started = time.perf_counter()
    subprocess.run([*BROKER, *args], env=env, capture_output=True, check=False)
    return time.perf_counter() - started


def main() -> None:
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "BROKER_HOME": home}
        env.pop("BROKER_REDIS_URL", None)
        spec = ROOT / "examples" / "finetune-lora.yaml"
        job = json.loads(
            subprocess.run(
                [*BROKER, "submit", str(spec), "--json"], env=env, capture_output=True, text=True, check=True
            ).stdout
        )["job"]
        commands = {
            "--help": ["--help"],
            "list": ["list"],
            "status": ["status", job],
            "logs": ["logs", job],
            "agents list": ["agents", "list"],
            "policies": ["policies"],
            "cost-report": ["cost-report"],
            "submit --quote": ["submit", str(spec), "--quote"],
        }
        figures = {
            name: round(statistics.median(timed(args, env) for _ in range(5)), 3) for name, args in commands.items()
        }
        subprocess.run([*BROKER, "stop"], env=env, capture_output=True, check=False)
    print(json.dumps({"seconds": figures, "cpus": os.cpu_count()}, indent=2))


if __name__ == "__main__":
    main()
