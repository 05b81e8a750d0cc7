"""`broker demo` and `broker demo --bubbles`: the product end to end, and a demo whose job fails."""

import json
import re
import sys
from pathlib import Path

import pytest
import yaml
from test_cli import job_file, run

from conftest import EXAMPLES


def test_demo_runs_the_product_end_to_end_with_a_migration(env, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # started elsewhere: the project's examples, their paths resolved from the project
    result = run("demo", "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    quotes = {Path(q["file"]).name: q for q in body["quotes"]}
    assert set(quotes) == {p.name for p in EXAMPLES.glob("*.yaml")}
    assert "no offer meets both" in quotes["eval-sweep-underfunded.yaml"]["refused"]
    listed = json.loads(run("list", "--json").stdout)  # the demo's jobs, not its quotes, are shown, tagged demo
    assert sorted(j["id"] for j in listed) == sorted(j["id"] for j in body["jobs"])
    assert all(j["tags"] == ["demo"] and j["state"] == "done" for j in listed)
    assert json.loads(run("status", "--json").stdout) == listed  # no job named: every job, as `broker list`
    assert listed[0]["id"] in run("status").stdout
    assert "Missing argument 'job_id'" in run("logs").output  # `logs` still needs its job: the output is one job's
    shown = run("status", listed[0]["id"])
    assert shown.exit_code == 0 and "running" in shown.stdout and "done" in shown.stdout  # its events came too
    assert "compressed clock" in shown.stdout
    # its times from its submission: from now, what ended on the compressed clock would read "in 39 min"
    assert "(+" in shown.stdout and "(in " not in shown.stdout and " ago)" not in shown.stdout
    jobs = {j["name"]: j for j in body["jobs"]}
    assert {j["state"] for j in jobs.values()} == {"done"}
    train = jobs["demo-train-mlp"]
    output = run("logs", train["id"]).stdout  # the output its agents sent, copied with the job
    assert "(checkpoint saved)" in output and "done: " in output, output
    losses = [float(loss) for loss in re.findall(r"loss ([\d.]+)", output)]  # it learns, across its migrations
    assert len(losses) >= 3 and losses[-1] < 0.5 * losses[0], losses
    scored = run("logs", jobs["demo-batch-infer"]["id"]).stdout  # the batch job says how far it scored too
    assert "documents (checkpoint saved)" in scored and "documents scored" in scored, scored
    assert train["agents"][0] == "spot-a" and train["tiers"][0] == "spot"
    assert train["migrations"] == len(train["agents"]) - 1 >= 1  # every migration to another agent
    # preempted on spot-a (its trace replayed from its first job; the training job, priority 1, is placed first);
    # to spot-b if batch-infer is done, else to on-demand, where hedge's guard may queue it again to wait for spot-b
    # once the job is ahead of its pace: a second migration, whether it comes is the processes' timing
    shown = json.loads(run("status", train["id"], "--json").stdout)
    moves = [e["reason"] for e in shown["events"] if e["state"] == "migrating"]
    quote = shown["quote"]  # quoted as a submit is: by the market's futures, its alternatives' too
    assert quote["forecast"]["p_meet_deadline"] > 0.5 and all(a["forecast"] for a in quote["alternatives"]), quote
    assert moves[0] == "preemption notice on spot-a" and all("by the deadline guard" in m for m in moves[1:]), moves
    # each run resumes from the newest verified checkpoint, and loses at most one checkpoint interval (40 steps):
    # counted in steps, since a busy machine's steps take longer than the 0.08 s the job sleeps in each
    runs, resumed, step = shown["runs"], None, 0
    for before, after in zip(runs, runs[1:]):
        assert before["progress_done"] - (before["checkpoint_step"] or step) <= 40, runs
        resumed, step = before["checkpoint_url"] or resumed, before["checkpoint_step"] or step
        assert after["resume_from"] == resumed, runs
    assert runs[-1]["end_reason"] == "finished" and runs[-1]["progress_done"] == 240
    assert body["cost_usd"] < body["on_demand_cost_usd"] and body["savings_pct"] > 0
    assert body["cost_usd"] == pytest.approx(sum(j["cost_usd"] for j in jobs.values()), abs=1e-3)


def test_a_demo_whose_job_fails_says_so_and_exits_non_zero(env, tmp_path):
    examples = tmp_path / "examples"
    (examples / "demo").mkdir(parents=True)
    (examples / "traces").symlink_to(EXAMPLES / "traces")  # the demo's agents replay preemption notices from them
    (examples / "one.yaml").write_text(job_file(tmp_path).read_text())
    bad = yaml.safe_load(job_file(tmp_path).read_text())
    bad.update(name="broken", run=[sys.executable, "-c", "raise SystemExit(3)"], max_restarts=0, budget_usd=5)
    (examples / "demo" / "broken.yaml").write_text(yaml.safe_dump(bad))
    result = run("demo", "--examples", examples, "--json")
    assert result.exit_code == 2, result.output
    body = json.loads(result.stdout)
    assert body["savings_pct"] is None and body["unfinished"] == [body["jobs"][0]["id"]]
    assert "1 of 1 jobs did not finish" in result.stderr and "failed" in result.stderr


def test_demo_bubbles_runs_a_fill_job_in_a_pipelines_bubbles_then_on_demand(env, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # started elsewhere: its on-demand run found no fill_mlp.py and failed 4 times
    result = run("demo", "--examples", EXAMPLES, "--bubbles", "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert [s["stage"] for s in body["stages"]] == [0, 1, 2, 3] and all(
        0 < s["bubble_fraction"] < 1 for s in body["stages"]
    )
    job = body["fill_job"]
    tiers, ends = job["tiers"], [r["end"] for r in job["runs"]]
    assert job["state"] == "done" and tiers[-1] == "on_demand" and set(tiers[:-1]) == {"bubble"}, (tiers, ends)
    assert "failed" not in ends, ends  # on a loaded machine a stage's lease may lapse: the job moves to another stage
    first, second = job["runs"][-2:]
    assert (
        first["end"] == "preempted" and first["checkpoint_step"] > 0
    )  # training ended: handed back with its checkpoint
    assert second["end"] == "finished" and second["resume_from"].endswith(f"step-{first['checkpoint_step']:012d}")
    assert job["cost_usd"] < job["on_demand_cost_usd"]  # the bubble part was free
    listed = json.loads(run("list", "--json").stdout)
    assert [(j["id"], j["tags"]) for j in listed] == [(job["id"], ["demo-bubbles"])]
