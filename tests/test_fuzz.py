"""Fuzzing (bench/fuzz.py) at CI size: generated job specs, command lines and hostile Redis messages never
crash the broker, are refused in one line per problem, store nothing when refused, and touch no other job."""

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import fuzz  # noqa: E402  (bench/fuzz.py holds the targets; the benchmark runs them with 10,000 cases)


def test_generated_job_specs_load_or_are_refused_in_one_line_each(tmp_path):
    seen = fuzz.fuzz_specs(200, tmp_path)
    assert seen["cases"] == 200 and seen["accepted"] > 0 and seen["refused"] > 0


def test_hostile_messages_on_the_streams_crash_nothing_and_leave_other_jobs_alone(redis_url, tmp_path):
    seen = fuzz.fuzz_messages(150, tmp_path, redis_url)
    assert (
        seen["cases"] == 150 + 2
    )  # the generated cases and the explicit ones (one reaches the fold, one forges another agent's report)
    assert seen["own_job_changes"] > 0  # the generated reports reached the server's fold, not just its parser


def test_generated_command_lines_exit_cleanly_and_refused_ones_store_nothing(redis_url, tmp_path, monkeypatch):
    for name in ("BROKER_REDIS_URL", "BROKER_HOME", "BROKER_PREFIX"):
        monkeypatch.setenv(name, "")  # so they are restored after the test: fuzz_cli sets them
    seen = fuzz.fuzz_cli(60, tmp_path, redis_url)
    # the generated lines and the two explicit ones (one valid, one naming no job): about 1 in 10 drawn lines is
    # valid, so a run could draw none and the counts alone would flake
    assert seen["cases"] == 60 + 2 and seen["ok"] > 0 and seen["refused"] > 0
