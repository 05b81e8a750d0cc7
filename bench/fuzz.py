"""Fuzzing the broker's inputs with hypothesis: job specs, CLI arguments, and messages read from Redis.

Each target generates near-valid and hostile inputs and checks what the standards ask: no unhandled
exception, user errors as one line per problem naming the input, and nothing stored by a refused input.

- specs: a valid job spec with fields replaced, dropped or added (or raw text) -> specfile.load_spec
- cli: `broker submit/quote/status/cancel/list/prices/layout` with generated arguments (typer's runner)
- messages: generated entries on the agent-events stream (the server folds them) and on an agent's
  assignment stream (the agent reads them): neither crashes, no other job changes

    python bench/fuzz.py --json [--cases 10000]    # split over the three targets
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
VALID = {
    "name": "fuzz",
    "run": ["python", "train.py"],
    "resources": {"accelerators": ["L4:1"]},
    "work": {"gpu_hours": 2},
    "deadline": "+24h",
    "budget_usd": 20,
    "checkpoint": {"size_gb": 1},
}
FIELDS = [
    "name",
    "run",
    "resources",
    "work",
    "deadline",
    "budget_usd",
    "checkpoint",
    "env",
    "tier",
    "priority",
    "shell",
    "max_restarts",
    "transformer",
    "fill_task",
    "accelerators",
    "gpu_hours",
    "size_gb",
    "unknown",
]
SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["+36h", "-1h", "2026-13-01", "L4:1", "H100:0", "A100:99", "1e308", "nan"]),
)
VALUE = st.recursive(
    SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(FIELDS), inner, max_size=4)),
    max_leaves=8,
)
SETTINGS = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck), derandomize=False)


def _mutated(changes: list) -> dict:
    """The valid spec with each (path, value-or-None-to-drop) change applied; paths may go one level deep."""
    spec = json.loads(json.dumps(VALID))
    for key, sub, value, drop in changes:
        target = spec.get(key) if sub and isinstance(spec.get(key), dict) else spec
        name = sub if sub and isinstance(spec.get(key), dict) else key
        if drop:
            target.pop(name, None)
        else:
            target[name] = value
    return spec


SPEC = st.one_of(
    st.lists(
        st.tuples(st.sampled_from(FIELDS), st.one_of(st.none(), st.sampled_from(FIELDS)), VALUE, st.booleans()),
        max_size=4,
    ).map(_mutated),
    VALUE,
)
RAW_YAML = st.one_of(st.text(max_size=200), st.binary(max_size=100).map(lambda b: b.decode("latin-1")))


def one_line_per_problem(message: str, source: str) -> bool:
    """Each line of a user error names its input and is a single sentence-like line."""
    return bool(message) and all(line.startswith(source) and len(line) < 2000 for line in message.splitlines())


def fuzz_specs(cases: int, workdir: Path) -> dict:
    """load_spec on generated files: a JobSpec or a SpecError, one line per problem, each naming the file."""
    from broker.domain.errors import BrokerError
    from broker.domain.specfile import load_spec

    seen = {"cases": 0, "accepted": 0, "refused": 0}
    path = workdir / "job.yaml"

    @settings(SETTINGS, max_examples=cases)
    @given(data=st.one_of(SPEC.map(lambda d: yaml.safe_dump(d, allow_unicode=True)), RAW_YAML))
    def check(data):
        path.write_text(data, encoding="utf-8", errors="surrogatepass")
        seen["cases"] += 1
        try:
            load_spec(path, NOW)
            seen["accepted"] += 1
        except BrokerError as err:
            assert one_line_per_problem(str(err), str(path)), str(err)
            seen["refused"] += 1

    check()
    return seen


CLI = st.one_of(
    st.tuples(
        st.just("submit"), st.sampled_from(["--deadline", "--budget", "--quote", "--json"]), st.text(max_size=20)
    ),
    st.tuples(st.sampled_from(["status", "cancel"]), st.text(max_size=30), st.sampled_from(["", "--json"])),
    st.tuples(st.just("list"), st.sampled_from(["--state", "--limit"]), st.text(max_size=15)),
    st.tuples(
        st.just("prices"), st.sampled_from(["--accelerator", "--cloud", "--tier", "--region"]), st.text(max_size=15)
    ),
    st.tuples(st.sampled_from(["layout", "submit", "run"]), st.text(max_size=40), st.sampled_from(["", "--json"])),
    st.tuples(st.just("logs"), st.text(max_size=30), st.sampled_from(["", "--follow"])),
    st.tuples(st.sampled_from(["cost-report", "policies"]), st.sampled_from(["", "--json", "--state"])),
    st.tuples(st.just("agents"), st.sampled_from(["list", "provision", "", "--json"]), st.text(max_size=20)),
    st.tuples(st.just("prices"), st.sampled_from(["risk", "history"]), st.text(max_size=15), st.just("--json")),
    # numbers at the edges of what an option parses (inf, nan, past 64 bits): they overflowed deep inside, exit 1
    st.tuples(
        st.sampled_from(["list", "status", "cost-report", "prices", "submit --budget", "submit --quote --budget"]),
        st.sampled_from(["inf", "-inf", "nan", "1e308", "-1", "0", "1" + "0" * 20, "0.5"]),
    ).map(lambda pair: (*pair[0].split(), *(["--limit"] if " " not in pair[0] else []), pair[1])),
)


def fuzz_cli(cases: int, workdir: Path, redis_url: str) -> dict:
    """Generated command lines: exit 0 or a usage/user error (2), never a traceback; a refused one stores nothing."""
    import os

    from typer.testing import CliRunner

    from broker.app.cli.main import app
    from broker.store.jobs import Store

    os.environ.update(
        {"BROKER_REDIS_URL": redis_url, "BROKER_HOME": str(workdir / "home"), "BROKER_PREFIX": "fuzz-cli:"}
    )
    store, runner = Store(redis_url, prefix="fuzz-cli:"), CliRunner()
    (workdir / "job.yaml").write_text(yaml.safe_dump(VALID))
    seen = {"cases": 0, "ok": 0, "refused": 0}

    @settings(SETTINGS, max_examples=cases)
    @given(args=CLI)
    @example(args=("policies", "--json"))  # one that must succeed and one that must be refused, whatever is drawn
    @example(args=("status", "no-such-job", ""))
    def check(args):
        argv = [a for a in args if a != ""]
        if argv[0] == "submit" and (len(argv) == 1 or argv[1].startswith("--")):
            argv.insert(1, str(workdir / "job.yaml"))
        before = len(store.list_jobs())
        result = runner.invoke(app, argv)
        seen["cases"] += 1
        assert result.exception is None or isinstance(result.exception, SystemExit), (argv, repr(result.exception))
        assert "Traceback" not in result.output, (argv, result.output)
        assert result.exit_code in (0, 2), (argv, result.exit_code, result.output)
        if result.exit_code:
            assert len(store.list_jobs()) == before, argv
        if "--json" in argv and result.stdout.strip():  # one document: the result or the error
            json.loads(result.stdout)
        seen["ok" if result.exit_code == 0 else "refused"] += 1

    check()
    return seen


FIELD_TEXT = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        [
            "started",
            "progress",
            "checkpoint",
            "checkpoint_failed",
            "exited",
            "notice",
            "victim",
            "own",
            "mallory",
            "honest",
            "1",
            "-1",
            "",
            "null",
            "{}",
        ]
    ),
)
DATA = st.one_of(
    st.dictionaries(
        st.sampled_from(["at", "done", "total", "url", "step", "reason", "code", "deadline", "log_tail", "pid"]),
        VALUE,
        max_size=5,
    ),
    VALUE,
).map(lambda d: json.dumps(d, allow_nan=True))
MESSAGE = st.one_of(
    st.dictionaries(
        st.sampled_from(["agent", "job", "fence", "type", "data", "junk"]), st.one_of(FIELD_TEXT, DATA), max_size=6
    ),
    st.fixed_dictionaries(
        {
            "agent": st.just("mallory"),
            "job": st.just("own"),
            "fence": st.just("own-fence"),  # passes the fence check
            "type": st.sampled_from(["started", "progress", "checkpoint", "checkpoint_failed", "exited", "notice"]),
            "data": st.one_of(
                DATA,
                st.fixed_dictionaries(
                    {
                        "reason": st.sampled_from(["failed", "preempted", "lost"]),
                        "code": st.integers(-9, 9),
                        "log_tail": st.lists(st.text(max_size=9), max_size=2),
                    }
                ).map(json.dumps),
            ),
        }
    ),
)


def fuzz_messages(cases: int, workdir: Path, redis_url: str) -> dict:
    """Hostile stream entries: the server folds agent-events, the agent reads its assignment stream; both survive
    every entry, every entry is acknowledged or dropped, and the job of another agent does not change."""
    from broker import planning
    from broker.agents.agent import Agent
    from broker.agents.checkpoints import CheckpointStore
    from broker.core.broker import Broker
    from broker.core.clock import SystemClock
    from broker.core.server import BrokerServer
    from broker.domain.model import Tier
    from broker.domain.specfile import validate_spec
    from broker.pricing.catalog import PriceCatalog
    from broker.store.jobs import Store

    prefix = "fuzz-msg:"
    store = Store(redis_url, prefix=prefix)
    catalog = PriceCatalog.from_snapshot()
    offer = next(
        o for o in catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1 and o.tier == Tier.on_demand
    )
    broker = Broker(store, catalog, planning.get(), SystemClock())
    server = BrokerServer(store, planning.get(), SystemClock(), CheckpointStore(str(workdir / "ckpt")), consumer="fuzz")
    honest = Agent(store, "honest", offer, str(workdir / "ckpt"), workdir / "runs", lease_s=3600)  # no lapse mid-fuzz
    mallory = Agent(store, "mallory", offer, str(workdir / "ckpt"), workdir / "runs", lease_s=3600)
    jobs = {}
    for name, agent in (("victim", honest), ("own", mallory)):  # the victim runs on the honest agent, "own" on mallory
        agent.register()
        jobs[name] = broker.submit(
            validate_spec({**VALID, "name": name, "run": ["sleep", "600"]}, SystemClock().now())
        ).id
        while store.get_job(jobs[name]).state.value != "running":
            server.round(block_ms=10)
            agent.step(block_ms=10)
    before = store.get_job(jobs["victim"])
    mallory_key = store.get_agent("mallory").report_key
    seen = {
        "cases": 0,
        "own_job_changes": 0,
    }  # cases after which mallory's own job differs: the entries reached the fold

    @settings(SETTINGS, max_examples=cases)
    @given(
        entries=st.lists(
            st.tuples(st.sampled_from(["agent-events", "assign:mallory"]), MESSAGE), min_size=1, max_size=3
        )
    )
    @example(
        entries=[
            ("agent-events", {"agent": "mallory", "job": "own", "fence": "own-fence", "type": "notice", "data": "{}"})
        ]
    )  # reaches the fold whatever is drawn
    @example(
        entries=[
            (
                "agent-events",
                {"agent": "honest", "job": "victim", "fence": "1", "type": "exited", "data": '{"reason": "failed"}'},
            )
        ]
    )  # speaks for another agent
    def check(entries):
        own = store.get_job(jobs["own"])
        for stream, fields in entries:
            fields = {
                k: jobs.get(v, v) for k, v in fields.items()
            }  # aim at the real jobs, with whatever else was generated
            if fields.get("fence") == "own-fence":
                fields["fence"] = str(own.fence)
            if fields.get("agent") == "mallory":  # a compromised agent knows its own report key, not another's
                fields.setdefault("key", mallory_key)
            store.redis.xadd(prefix + stream, fields or {"junk": "1"})
        seen["cases"] += 1
        server.round(block_ms=1)
        mallory.step(block_ms=1)
        seen["own_job_changes"] += store.get_job(jobs["own"]) != own

    try:
        check()
        after = store.get_job(jobs["victim"])
        assert after.state == before.state and after.runs == before.runs and after.fence == before.fence, (
            "the victim changed"
        )
        assert store.redis.xpending(prefix + "agent-events", "broker")["pending"] == 0, (
            "a report was left unacknowledged"
        )
    finally:
        for agent in (honest, mallory):
            agent._end_job("stopped", kill=True)
    return seen


def run(redis_url: str, cases: int = 10_000, workdir: Path | None = None) -> dict:
    """All three targets, `cases` split between them (specs and messages are cheap, CLI calls less so)."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="broker-fuzz-"))
    split = {"specs": cases * 5 // 10, "cli": cases * 2 // 10, "messages": cases - cases * 5 // 10 - cases * 2 // 10}
    began, out = time.monotonic(), {}
    out["specs"] = fuzz_specs(split["specs"], workdir)
    out["messages"] = fuzz_messages(split["messages"], workdir, redis_url)
    out["cli"] = fuzz_cli(split["cli"], workdir, redis_url)
    out["cases"] = sum(v["cases"] for v in out.values())
    out["seconds"] = round(time.monotonic() - began, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from broker.store import embedded

    with embedded.scratch() as url:
        result = run(url, args.cases)
    print(json.dumps(result, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
