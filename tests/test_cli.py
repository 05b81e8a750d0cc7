"""The `broker` command, through typer's runner and once as a real process."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml
from typer.testing import CliRunner

from broker.app.cli.main import app
from conftest import EXAMPLES, NOW

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def job_file(tmp_path, **fields):
    data = {
        "name": "cli-job",
        "run": ["python", "train.py"],
        "resources": {"accelerators": ["L4:1", "A10G:1"]},
        "work": {"gpu_hours": 2},
        "deadline": "+24h",
        "budget_usd": 20,
    }
    data.update(fields)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def stored_keys(url):
    return redis.Redis.from_url(url).keys("broker:*")


def test_submit_stores_the_job_and_prints_its_quote(env, tmp_path):
    result = run("submit", job_file(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    chosen = body["quote"]["chosen"]
    assert body["stored"] and body["job"].startswith("cli-job-")
    price = chosen["offer"]["price_usd_per_h"]  # billed for its hours of work, not for waits for spot capacity
    assert price * chosen["exclusive_h"] < chosen["expected_cost_usd"] <= price * chosen["expected_wall_h"] + 1e-9
    assert chosen["offer"]["accelerator"] in {"L4", "A10G"} and chosen["feasible"]
    assert len(body["quote"]["alternatives"]) == 4 and body["quote"]["savings_pct"] > 0
    assert all(alt["forecast"]["futures"] == 250 for alt in body["quote"]["alternatives"])  # each played out
    status = json.loads(run("status", body["job"], "--json").stdout)
    assert status["state"] == "queued" and status["quote"]["chosen"] == chosen
    assert [e["state"] for e in status["events"]] == ["queued"]
    # not run yet: its outlook is the quote made again now, at the same odds
    assert status["outlook"]["futures"] == 1000
    assert status["outlook"]["p_meet_deadline"] == pytest.approx(body["quote"]["forecast"]["p_meet_deadline"], abs=0.05)
    assert json.loads(run("status", body["job"], "--json", "--no-outlook").stdout)["outlook"] is None
    assert "outlook now" in run("status", body["job"]).stdout


def test_quote_only_stores_nothing(env, tmp_path):
    result = run("submit", job_file(tmp_path), "--quote", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stored"] is False
    assert stored_keys(env) == []


def test_flags_override_the_files_deadline_and_budget(env, tmp_path):
    result = run("submit", job_file(tmp_path), "--deadline", "+200h", "--budget", "3.5", "--json")
    body = json.loads(result.stdout)
    spec = json.loads(run("status", body["job"], "--json").stdout)["spec"]
    assert spec["budget_usd"] == 3.5
    assert body["quote"]["chosen"]["expected_cost_usd"] <= 3.5


def test_human_output_is_a_table_with_the_savings(env, tmp_path):
    result = run("submit", job_file(tmp_path))
    assert result.exit_code == 0
    assert "chosen" in result.stdout and "on-demand" in result.stdout and "savings vs on-demand on " in result.stdout


def test_list_and_cancel(env, tmp_path):
    first = json.loads(run("submit", job_file(tmp_path), "--json").stdout)["job"]
    second = json.loads(run("submit", job_file(tmp_path), "--json").stdout)["job"]
    assert run("cancel", first).exit_code == 0
    jobs = json.loads(run("list", "--json").stdout)
    assert [(j["id"], j["state"]) for j in jobs] == [(first, "cancelled"), (second, "queued")]
    queued = json.loads(run("list", "--state", "queued", "--json").stdout)
    assert [j["id"] for j in queued] == [second]
    assert [j["id"] for j in json.loads(run("list", "--limit", "1", "--json").stdout)] == [second]  # the newest
    shown = run("list", "--limit", "1").stdout
    assert "the newest 1 of 2 jobs" in shown and second in shown and first not in shown
    assert "2 jobs" in run("status").stdout and "newest" not in run("list").stdout  # fewer than the default 50
    refused = run("list", "--limit", "-1")
    assert refused.exit_code == 2 and "greater than or equal to 0" in refused.output
    again = run("cancel", first)
    assert again.exit_code == 2 and "already cancelled" in again.stderr


def test_a_job_is_named_by_the_start_of_its_id_when_no_other_id_begins_so(env, tmp_path):
    """A user types the name they gave (`broker status demo-train`); the id adds a random suffix, so it was 'no job'."""
    first = json.loads(run("submit", job_file(tmp_path, name="alpha"), "--json").stdout)["job"]
    second = json.loads(run("submit", job_file(tmp_path, name="alpha-two"), "--json").stdout)["job"]
    assert json.loads(run("status", "alpha-t", "--json", "--no-outlook").stdout)["id"] == second
    ambiguous = run("logs", "alpha")
    assert ambiguous.exit_code == 2
    assert f"'alpha' begins 2 jobs' ids ({first}, {second}); give more of the one you mean" in ambiguous.stderr
    assert run("cancel", first[:-2]).stdout.strip() == f"{first} cancelled"
    assert json.loads(run("status", first, "--json").stdout)["state"] == "cancelled"  # an id is itself
    assert "no job 'beta'" in run("status", "beta").stderr


def test_empty_list_says_what_to_do(env, tmp_path):
    assert "no jobs yet: run `broker submit" in run("list").stdout
    run("submit", job_file(tmp_path))  # queued: none cancelled, and there is a job
    assert run("list", "--state", "cancelled").stdout.strip() == "no cancelled jobs; `broker list` shows every state"


BAD_INPUTS = {
    "deadline in the past": (dict(deadline="2020-01-01T00:00Z"), "deadline: 2020-01-01 00:00 UTC is in the past"),
    "zero budget": (dict(budget_usd=0), "budget_usd: 0 is out of range; give a number above 0"),
    "odds as a percentage": (
        dict(deadline_probability=95),
        "deadline_probability: 95 is out of range; give a number below 1.0 (did you mean 0.95?)",
    ),
    "unknown accelerator": (
        dict(resources={"accelerators": ["A1000"]}),
        "unknown accelerator 'A1000'; did you mean A100",
    ),
    "infeasible": (dict(work={"gpu_hours": 500}, budget_usd=5), "deadline/budget: no offer meets both"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_exit_2_and_stores_nothing(env, tmp_path, case):
    fields, message = BAD_INPUTS[case]
    result = run("submit", job_file(tmp_path, **fields))
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert stored_keys(env) == []


def test_oversized_or_non_yaml_files_are_refused(env, tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("#" * 1_000_001)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [x\n")
    for path, message in ((big, "over the 1 MB limit"), (bad, "not valid YAML")):
        result = run("submit", path)
        assert result.exit_code == 2 and message in result.stderr
    result = run("run", "\x00")  # a NUL byte in the path was an internal error (ValueError)
    assert result.exit_code == 2 and "no such file" in result.stderr, result.output
    assert stored_keys(env) == []


def test_submit_notes_input_where_no_offer_of_its_cloud_is(env, tmp_path):
    data = {"url": "s3://b/x", "region": "us-eas-1", "size_gb": 200}
    result = run("submit", job_file(tmp_path, data=data), "--quote", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["stored"] is False  # the JSON document stays whole
    assert "note: data.region: no aws offer is in us-eas-1 (did you mean us-east-1" in result.stderr


def test_bad_deadline_flag_is_refused(env, tmp_path):
    """The option is named, not the file, which says something else (it named the file's deadline: field)."""
    result = run("submit", job_file(tmp_path), "--deadline", "tomorrow")
    assert result.exit_code == 2 and result.stderr.startswith("error: --deadline: 'tomorrow' is not a time")
    result = run("submit", job_file(tmp_path), "--deadline", "2020-01-01T00:00Z")
    assert result.exit_code == 2 and result.stderr.startswith("error: --deadline: 2020-01-01 00:00 UTC is in the past")
    result = run("submit", job_file(tmp_path), "--budget", "0")
    assert result.exit_code == 2 and result.stderr.startswith("error: --budget: 0.0 is out of range")


def test_embedded_redis_is_started_by_the_cli_and_stopped_by_broker_stop(monkeypatch, tmp_path):
    monkeypatch.delenv("BROKER_REDIS_URL", raising=False)
    monkeypatch.setenv("BROKER_HOME", str(tmp_path))
    first = run("submit", job_file(tmp_path), "--json")
    assert first.exit_code == 0 and "started private redis-server" in first.stderr
    second = run("list", "--json")
    assert "using private redis-server" in second.stderr and len(json.loads(second.stdout)) == 1
    assert "stopped private redis-server" in run("stop").stdout
    assert "no private redis-server running" in run("stop").stdout


def test_a_command_that_opens_the_store_twice_names_its_redis_once(monkeypatch, tmp_path):
    """`broker run` opens it for the job and again for its local agent: "started", then "using", was said twice."""
    monkeypatch.delenv("BROKER_REDIS_URL", raising=False)
    monkeypatch.setenv("BROKER_HOME", str(tmp_path))
    path = job_file(tmp_path, run=[sys.executable, "-c", "print('ran')"], work={"gpu_hours": 0.01})
    try:
        result = run("run", path)
        assert result.exit_code == 0, result.output
        assert result.stderr.count("private redis-server") == 1, result.stderr
    finally:
        run("stop")


def test_the_installed_command_runs_as_a_real_process(env, tmp_path):
    broker = Path(sys.executable).parent / "broker"
    result = subprocess.run(
        [str(broker), "submit", str(EXAMPLES / "finetune-lora.yaml"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "BROKER_REDIS_URL": env},
    )
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)["job"]
    bad = subprocess.run(
        [str(broker), "status", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "BROKER_REDIS_URL": env},
    )
    assert bad.returncode == 2 and bad.stderr.strip() == "error: job: no job 'nope'; `broker list` shows the ids"
    listed = subprocess.run(
        [str(broker), "list", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "BROKER_REDIS_URL": env},
    )
    assert [j["id"] for j in json.loads(listed.stdout)] == [job]


def test_policies_lists_the_registry_and_marks_the_active_one(env, monkeypatch):
    rows = {r["name"]: r for r in json.loads(run("policies", "--json").stdout)}
    assert {"cheapest", "costslo", "uniform-progress", "max-min-fairness", "min-makespan"} <= set(rows)
    assert rows["hedge"]["active"] and not rows["costslo"]["active"] and not rows["cheapest"]["active"]
    monkeypatch.setenv("BROKER_POLICY", "uniform-progress")
    assert json.loads(run("policies", "--json").stdout)[-1]["active"]


def test_submit_quotes_with_the_active_policy_and_refuses_an_unknown_one(env, tmp_path, monkeypatch):
    monkeypatch.setenv("BROKER_POLICY", "cheapest")
    assert json.loads(run("submit", job_file(tmp_path), "--quote", "--json").stdout)["quote"]["policy"] == "cheapest"
    monkeypatch.setenv("BROKER_POLICY", "fastest")
    result = run("submit", job_file(tmp_path), "--quote")
    assert result.exit_code == 2 and "unknown policy 'fastest'" in result.output and stored_keys(env) == []
    monkeypatch.setenv("BROKER_POLICY", "hedg")
    assert "unknown policy 'hedg'; did you mean hedge?" in run("submit", job_file(tmp_path), "--quote").output


def test_a_round_budget_reaches_the_planner_and_a_bad_one_is_one_line(env, tmp_path, monkeypatch):
    from broker.app.cli.common import make_broker

    monkeypatch.setenv("BROKER_ROUND_BUDGET_USD", "250")
    result = run("submit", job_file(tmp_path), "--quote")  # the default, hedge, plans no round budget
    assert result.exit_code == 2 and "policy: hedge takes no budget_usd; use costslo" in result.output
    monkeypatch.setenv("BROKER_POLICY", "costslo")
    assert make_broker(with_store=False).policy.budget_usd == 250
    monkeypatch.setenv("BROKER_ROUND_BUDGET_USD", "lots")
    result = run("submit", job_file(tmp_path), "--quote")
    assert result.exit_code == 2 and "BROKER_ROUND_BUDGET_USD: 'lots' is not a positive number" in result.output


def test_a_fill_order_reaches_the_server_and_a_bad_one_is_one_line(env, tmp_path, monkeypatch):
    from broker.app.cli.common import make_broker
    from broker.app.wiring import make_server

    monkeypatch.setenv("BROKER_FILL_ORDER", "deadline")
    assert make_server(make_broker(), "s1").fill_order == "deadline"
    monkeypatch.setenv("BROKER_FILL_ORDER", "fifo")
    result = run("submit", job_file(tmp_path), "--quote")
    assert result.exit_code == 2 and "BROKER_FILL_ORDER: 'fifo' is not a fill policy" in result.output


def test_every_file_a_message_names_exists():
    """Hints such as `broker submit examples/finetune-lora.yaml` must name files a fresh checkout has."""
    root = EXAMPLES.parent
    named = set()
    for source in [*root.joinpath("broker").rglob("*.py"), *root.joinpath("dashboards").rglob("*.py")]:
        named |= set(re.findall(r"(?:examples|infra)/[\w./-]+\.(?:yaml|py|tf)", source.read_text()))
    assert "examples/finetune-lora.yaml" in named
    assert [p for p in sorted(named) if not (root / p).exists()] == []


def test_agents_list_shows_each_agent_its_offer_job_and_lease(env, store, catalog):
    from broker.agents.contract import Contract

    offers = sorted((o for o in catalog.offers if o.accelerator == "L4"), key=lambda o: o.price_usd_per_h)
    assert "no agents" in run("agents", "list").stdout
    for name, offer, lease_ms in (
        ("spot-1", offers[0], 60_000),
        ("gone-2", offers[1], 1),
        ("leaving-3", offers[2], 60_000),
        ("local-4", offers[0], 60_000),
    ):
        local = name == "local-4"
        Contract(store, name).register(
            offer, lease_ms, host="h", pid=1, at=NOW, on_cloud=not local, for_job="j-1" if local else None
        )
    store.mark_leaving("leaving-3")
    time.sleep(0.01)  # gone-2's lease of 1 ms has lapsed
    rows = {r["id"]: r for r in json.loads(run("agents", "list", "--json").stdout)}
    leases = {"spot-1": "alive", "gone-2": "lapsed", "leaving-3": "leaving", "local-4": "alive"}
    assert {k: r["lease"] for k, r in rows.items()} == leases
    assert [k for k, r in rows.items() if not r["on_cloud"]] == ["local-4"]
    assert rows["spot-1"]["offer"] == offers[0].id and rows["spot-1"]["job"] is None
    assert rows["spot-1"]["tier"] == offers[0].tier.value
    shown = runner.invoke(app, ["agents", "list"], terminal_width=80).stdout
    assert all(name in shown for name in rows) and "…" not in shown
    assert run("agents").stdout == run("agents", "list").stdout  # alone, it lists them
    alone = [{k: v for k, v in r.items() if k != "age_h"} for r in json.loads(run("agents", "--json").stdout)]
    assert alone == [{k: v for k, v in r.items() if k != "age_h"} for r in rows.values()]  # --json alone too
    local = next(line for line in run("agents").stdout.splitlines() if line.startswith("local-4"))
    assert "(local)" in local and "- (for j-1 alone)" in local and rows["local-4"]["for_job"] == "j-1"


def test_the_command_loads_no_numeric_library_until_a_command_prices():
    """`broker --help` and the read commands stay under a second: numpy, scipy, pandas and PuLP load only in
    the commands that price (bench/startup.py measures the times)."""
    heavy = "{'numpy', 'scipy', 'pandas', 'pulp'} & set(sys.modules)"
    code = f"import sys; import broker.app.cli.main; from broker.core import waiting; print(sorted({heavy}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_replica_reads_the_live_catalog_once_for_all_its_shards(env, monkeypatch):
    from broker.app import wiring
    from broker.app.cli.common import make_broker

    monkeypatch.setenv("BROKER_SHARDS", "4")
    reads = []
    live = wiring.live_catalog
    monkeypatch.setattr(wiring, "live_catalog", lambda store, settings: reads.append(1) or live(store, settings))
    replica = wiring.make_replica(make_broker(), "r1")
    priced = [server.newest_offers() for server in replica.servers]
    assert len(replica.servers) == 4 and len(reads) == 1 and all(p == priced[0] for p in priced) and priced[0]


def test_logs_of_a_job_that_never_ran_says_so_not_that_it_has_not_yet(env, tmp_path):
    job = json.loads(run("submit", job_file(tmp_path), "--json").stdout)["job"]
    assert "it has not run yet" in run("logs", job).stdout  # queued: it may still
    run("cancel", job)
    assert "no output from" in run("logs", job).stdout and "it never ran" in run("logs", job).stdout


def test_a_stop_that_lands_inside_pydantics_serializer_is_still_a_stop():
    """pydantic's serializer made the KeyboardInterrupt its own error: a killed `broker backtest` exited 1 with an
    internal error instead of 130."""
    import os
    import signal

    from pydantic import BaseModel, field_serializer

    from broker.app.cli.common import stop_signals_as_ctrl_c

    class Stopped(BaseModel):
        x: int = 1

        @field_serializer("x")
        def _stop_here(self, value):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs here, inside the serializer
            return value

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        stop_signals_as_ctrl_c(Stopped().model_dump_json)()
    assert signal.getsignal(signal.SIGTERM) is before  # put back


def test_an_agent_for_a_job_not_there_or_ended_is_refused(env, store, catalog, tmp_path):
    """`--for-job` with a typo left an agent that took no job, for good: refused in one line, nothing registered."""
    offer = next(o for o in catalog.offers if o.accelerator == "L4").id
    agent = ("agent", "--id", "a1", "--offer", offer, "--runs", tmp_path / "runs", "--for-job")
    missing = run(*agent, "nope")
    assert missing.exit_code == 2 and "error: --for-job: no job 'nope'; `broker list` shows the ids" in missing.stderr
    job_id = json.loads(run("submit", job_file(tmp_path), "--json").stdout)["job"]
    assert run("cancel", job_id).exit_code == 0
    ended = run(*agent, job_id)
    assert ended.exit_code == 2 and f"error: --for-job: {job_id} is already cancelled; nothing to run" in ended.stderr
    assert store.agents() == []


def test_an_agent_for_a_job_of_another_shard_is_refused_with_an_id_in_the_jobs(env, catalog, tmp_path, monkeypatch):
    """Agents register in the shard their id hashes to: one started for a job planned in another shard was never
    seen by that shard's server, and the job waited beside it."""
    from broker.store.shards import ShardedStore, shard_of

    monkeypatch.setenv("BROKER_SHARDS", "4")
    offer = next(o for o in catalog.offers if o.accelerator == "L4").id
    job_id = json.loads(run("submit", job_file(tmp_path), "--json").stdout)["job"]
    sharded = ShardedStore(env, "broker:", 4)
    shard = sharded.shards.index(sharded.of_job(job_id))
    elsewhere = next(f"a{i}" for i in range(100) if shard_of(f"a{i}", 4) != shard)
    refused = run("agent", "--id", elsewhere, "--offer", offer, "--runs", tmp_path / "runs", "--for-job", job_id)
    assert refused.exit_code == 2 and f"and {job_id} is planned in shard {shard}; give --id" in refused.stderr
    suggested = refused.stderr.strip().rsplit(" ", 1)[-1]
    assert shard_of(suggested, 4) == shard and sharded.agents() == []
