"""`broker cancel` of several jobs, or of every job that has not ended (`--all`), as `sky jobs cancel -a` does: a
queue submitted by mistake was cancelled one id at a time."""

import json

from test_cli import job_file, run


def submitted(tmp_path, n: int) -> list[str]:
    return [json.loads(run("submit", job_file(tmp_path), "--json").stdout)["job"] for _ in range(n)]


def states() -> dict[str, str]:
    return {j["id"]: j["state"] for j in json.loads(run("list", "--json").stdout)}


def test_several_jobs_are_cancelled_and_one_already_ended_is_said_and_exits_2(env, tmp_path):
    first, second, third = submitted(tmp_path, 3)
    assert run("cancel", first).exit_code == 0
    typo = run("cancel", second, "no-such-job")
    assert typo.exit_code == 2 and "no job 'no-such-job'" in typo.stderr and states()[second] == "queued"  # none
    result = run("cancel", first, second, third, "--json")
    assert result.exit_code == 2
    rows = json.loads(result.stdout)  # one record a job: its own, or why it was not cancelled
    assert [r["id"] for r in rows] == [first, second, third] and "already cancelled" in rows[0]["error"]
    assert [r["state"] for r in rows[1:]] == ["cancelled", "cancelled"]
    assert set(states().values()) == {"cancelled"}


def test_all_asks_first_and_cancels_every_job_that_has_not_ended(env, tmp_path):
    jobs = submitted(tmp_path, 3)
    declined = run("cancel", "--all")  # CliRunner's stdin is empty: the question is declined
    assert declined.exit_code == 1 and "cancel 3 jobs that have not ended?" in declined.output
    assert set(states().values()) == {"queued"}
    refused = run("cancel", "--all", "--json")
    assert refused.exit_code == 2 and "add --yes" in refused.stderr and set(states().values()) == {"queued"}
    done = run("cancel", "--all", "--yes")
    assert done.exit_code == 0 and all(f"{j} cancelled" in done.stdout for j in jobs)
    assert set(states().values()) == {"cancelled"}
    assert "nothing to cancel" in run("cancel", "--all", "--yes").stdout
    both = run("cancel", jobs[0], "--all")
    assert both.exit_code == 2 and "give job ids, or --all" in both.stderr
    assert run("cancel").exit_code == 2
