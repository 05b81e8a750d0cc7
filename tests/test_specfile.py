"""Job specs: the YAML users write, and the one-line errors bad input gets."""

from datetime import UTC, datetime, timedelta

import pytest
import yaml

from broker.domain.errors import SpecError
from broker.domain.model import Tier
from broker.domain.specfile import MAX_SPEC_BYTES, load_spec, validate_spec
from conftest import EXAMPLES, NOW, make_spec


def write(tmp_path, data, name="job.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def base(**fields):
    data = {"name": "j", "run": "python train.py", "resources": {"accelerators": "A100:1"}, "work": {"gpu_hours": 2}}
    data.update(fields)
    return data


def test_short_accelerator_forms_parse_to_name_and_count():
    spec = make_spec(resources={"accelerators": ["a100:2", "L4", {"name": "h100", "count": 8}]})
    assert [(a.name, a.count) for a in spec.resources.accelerators] == [("A100", 2), ("L4", 1), ("H100", 8)]


def test_run_string_is_split_into_argv_unless_shell_is_true():
    assert make_spec(run="python train.py --lr 3e-4").run == ["python", "train.py", "--lr", "3e-4"]
    assert make_spec(run="python a.py && python b.py", shell=True).run == ["python a.py && python b.py"]


def test_relative_deadline_counts_from_now():
    assert make_spec(deadline="+36h").deadline == NOW + timedelta(hours=36)
    assert make_spec(deadline="+90m").deadline == NOW + timedelta(minutes=90)
    assert make_spec(deadline="+2d").deadline == NOW + timedelta(days=2)
    assert make_spec(deadline="+1w").deadline == NOW + timedelta(days=7)
    assert make_spec(deadline="+1h30m").deadline == NOW + timedelta(minutes=90)
    assert make_spec(deadline="+1d 12h").deadline == NOW + timedelta(hours=36)


def test_a_relative_deadline_without_its_plus_says_what_it_likely_meant():
    with pytest.raises(SpecError, match=r"deadline: '36h' is not a time; did you mean \+36h \(from now\)\?"):
        make_spec(deadline="36h")


def test_iso_deadline_without_offset_is_utc():
    assert make_spec(deadline="2026-12-01T18:00").deadline == datetime(2026, 12, 1, 18, tzinfo=UTC)
    assert make_spec(deadline="2026-12-01T18:00Z").deadline == datetime(2026, 12, 1, 18, tzinfo=UTC)


def test_tiers_default_to_all_and_can_be_restricted():
    assert set(make_spec().tiers) == set(Tier)
    assert make_spec(tiers=["on_demand"]).tiers == [Tier.on_demand]


def test_unknown_field_names_its_path_and_the_closest_allowed_name():
    with pytest.raises(SpecError) as err:
        validate_spec(base(resources={"acclerators": ["A100:1"]}), NOW)
    message = str(err.value)
    assert "resources.acclerators: unknown field; did you mean 'accelerators'?" in message
    assert "gpu_memory_gb" in message  # what is allowed there


def test_unknown_accelerator_suggests_the_closest_names():
    with pytest.raises(SpecError) as err:
        validate_spec(base(resources={"accelerators": ["A1000:1"]}), NOW)
    assert "resources.accelerators[0].name: unknown accelerator 'A1000'; did you mean A100" in str(err.value)


def test_each_problem_is_one_line_naming_its_field():
    with pytest.raises(SpecError) as err:
        validate_spec(
            {"name": "j", "run": [], "resources": {"accelerators": ["L4"]}, "work": {}, "priority": "high"}, NOW
        )
    lines = str(err.value).splitlines()
    assert len(lines) == 3
    assert any(line.startswith("spec: run:") for line in lines)
    assert any(line.startswith("spec: work:") and "gpu_hours" in line for line in lines)
    assert any(line.startswith("spec: priority:") for line in lines)


def test_missing_required_field_is_named():
    data = base()
    del data["work"]
    with pytest.raises(SpecError, match="work: required; add it"):
        validate_spec(data, NOW)


def test_deadline_in_the_past_is_refused():
    with pytest.raises(SpecError, match="deadline: 2026-11-21 12:00 UTC is in the past"):
        validate_spec(base(deadline="2026-11-21T12:00Z"), NOW)


@pytest.mark.parametrize("budget", [0, -5])
def test_non_positive_budget_is_refused(budget):
    with pytest.raises(SpecError, match="budget_usd: -?[0-9]+ is out of range; give a number above 0"):
        validate_spec(base(budget_usd=budget), NOW)


def test_steps_need_a_rate_for_every_accelerator_option():
    data = base(resources={"accelerators": ["L4", "T4"]}, work={"steps": 1000, "steps_per_hour": {"L4": 500}})
    with pytest.raises(SpecError, match="no rate for T4; add one or drop it"):
        validate_spec(data, NOW)


def test_file_over_one_megabyte_is_refused(tmp_path):
    path = write(tmp_path, "# padding\n" * (MAX_SPEC_BYTES // 10 + 1))
    with pytest.raises(SpecError, match="over the 1 MB limit"):
        load_spec(path, NOW)


def test_file_that_is_not_yaml_is_refused_with_its_position(tmp_path):
    path = write(tmp_path, "name: j\nrun: [python, train.py\nresources: {}\n")
    with pytest.raises(SpecError, match=r"not valid YAML at line \d+, column \d+"):
        load_spec(path, NOW)


def test_yaml_that_is_not_a_mapping_is_refused(tmp_path):
    with pytest.raises(SpecError, match="a job spec is a YAML mapping"):
        load_spec(write(tmp_path, "- just\n- a list\n"), NOW)


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "nope.yaml", NOW)
    with pytest.raises(SpecError, match="not a file"):  # found by bench/fuzz.py: `broker layout /` crashed
        load_spec(tmp_path, NOW)


def test_cli_overrides_replace_the_files_deadline_and_budget(tmp_path):
    path = write(tmp_path, base(deadline="+10h", budget_usd=100))
    spec = load_spec(path, NOW, deadline="+48h", budget_usd=7.5)
    assert spec.deadline == NOW + timedelta(hours=48)
    assert spec.budget_usd == 7.5


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_is_a_valid_spec(path):
    assert load_spec(path, NOW).name


def test_a_job_cannot_set_broker_variables():
    with pytest.raises(
        SpecError, match=r"spec: env: BROKER_RESUME_FROM: BROKER_\* variables are set by the agent; rename it"
    ):
        validate_spec(base(env={"BROKER_RESUME_FROM": "/etc"}), NOW)


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"work": {"gpu_hours": 1e308}}, "work.gpu_hours"),  # was: ValueError, cannot convert float NaN to integer
        ({"deadline": "+99999999h"}, "deadline"),  # was: OverflowError
        ({"deadline": "9999-12-31T00:00Z"}, "deadline"),
        ({"budget_usd": float("inf")}, "budget_usd"),  # was: stored as "no budget"
        ({"budget_usd": float("nan")}, "budget_usd"),
        ({"checkpoint": {"size_gb": float("inf")}}, "checkpoint.size_gb"),
    ],
)
def test_absurd_numbers_are_refused_naming_the_field(fields, field):
    with pytest.raises(SpecError) as err:
        validate_spec(base(**fields), NOW)
    assert str(err.value).startswith(f"spec: {field}:") and "\n" not in str(err.value)


@pytest.mark.parametrize("budget", [".inf", "1e400", "-.inf"])
def test_an_infinite_budget_in_the_file_or_the_flag_is_refused(tmp_path, budget):
    path = write(tmp_path, "name: j\nrun: python t.py\nresources: {accelerators: A100:1}\nwork: {gpu_hours: 2}\n")
    with pytest.raises(
        SpecError,
        match="^--budget: .*(is not a finite number; give a finite number|is out of range; give a number above 0)",
    ):
        load_spec(path, NOW, budget_usd=float(budget.replace(".inf", "inf")))
    inline = write(tmp_path, path.read_text() + f"budget_usd: {budget}\n", "inline.yaml")
    with pytest.raises(SpecError, match="budget_usd"):
        load_spec(inline, NOW)


def test_yaml_aliases_are_refused_before_they_expand(tmp_path):
    """A billion laughs: 9 levels of 10 aliases each would be 10**9 strings in `env`."""
    lines = ["name: j", "run: python t.py", "resources: {accelerators: A100:1}", "work: {gpu_hours: 2}", "x0: &a0 lol"]
    lines += [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    lines += ["env: {A: *a9}"]
    path = write(tmp_path, "\n".join(lines))
    with pytest.raises(SpecError, match=r"line 6, column \d+: aliases \(\*name\) are not allowed"):
        load_spec(path, NOW)


def test_env_nested_too_deep_is_refused_in_one_line(tmp_path):
    path = write(
        tmp_path,
        "name: j\nrun: python t.py\nresources: {accelerators: A100:1}\nwork: {gpu_hours: 2}\n"
        f"env: {{A: {'[' * 20000}{']' * 20000}}}\n",
    )
    with pytest.raises(SpecError, match="nested too deep"):
        load_spec(path, NOW)


@pytest.mark.parametrize("value", [[1, 2], {"a": 1}, None])
def test_env_values_are_strings_not_lists_or_mappings(value):
    with pytest.raises(SpecError, match="env: A: give a string, number or true/false"):
        validate_spec(base(env={"A": value}), NOW)
    assert validate_spec(base(env={"A": 1, "B": True}), NOW).env == {"A": "1", "B": "True"}


def test_a_relative_workdir_is_taken_from_the_spec_files_folder(tmp_path, monkeypatch):
    folder = tmp_path / "jobs"
    folder.mkdir()
    (tmp_path / "data").mkdir()
    data = {"name": "w", "run": "python x.py", "resources": {"accelerators": "L4"}, "work": {"gpu_hours": 1}}
    for workdir, expected in ((".", folder), ("../data", tmp_path / "data"), ("/srv/job", "/srv/job")):
        (folder / "job.yaml").write_text(yaml.safe_dump({**data, "workdir": workdir}))
        monkeypatch.chdir(tmp_path)  # not the spec's folder
        assert load_spec(folder / "job.yaml", NOW).workdir == str(expected)
    (folder / "job.yaml").write_text(yaml.safe_dump(data))
    assert load_spec(folder / "job.yaml", NOW).workdir is None  # none given: the agent's own folder


def test_a_relative_workdir_that_is_no_folder_is_refused_naming_it(tmp_path):
    """A typo there failed every run of the job ("could not start"); an absolute one is on the agents' machines."""
    data = {"name": "w", "run": "python x.py", "resources": {"accelerators": "L4"}, "work": {"gpu_hours": 1}}
    (tmp_path / "a-file").write_text("")
    for workdir in ("../no-such-folder", "a-file"):
        (tmp_path / "job.yaml").write_text(yaml.safe_dump({**data, "workdir": workdir}))
        with pytest.raises(SpecError, match=f"workdir: {workdir} is no folder"):
            load_spec(tmp_path / "job.yaml", NOW)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({**data, "workdir": "/no/such/folder/here"}))
    assert load_spec(tmp_path / "job.yaml", NOW).workdir == "/no/such/folder/here"


def test_run_words_and_env_values_are_the_text_as_written_not_yamls_numbers(tmp_path):
    """YAML reads 3 as a number and true as a boolean: an argv list with them was refused ("run[3]: Input should be a
    valid string") and env values reached the job as Python's True and 0.1."""
    path = write(
        tmp_path,
        "name: j\nrun: [python, train.py, --epochs, 3, --lr, 0.10, --dry-run, true, --at, 2026-12-01]\n"
        "resources: {accelerators: A100:1}\nwork: {gpu_hours: 2}\nenv: {DEBUG: yes, LR: 0.10, N: 7, NONE: ~}\n",
    )
    with pytest.raises(SpecError, match="env: NONE: give a string"):  # a null stays a null
        load_spec(path, NOW)
    spec = load_spec(write(tmp_path, path.read_text().replace(", NONE: ~", "")), NOW)
    assert spec.run == [
        "python",
        "train.py",
        "--epochs",
        "3",
        "--lr",
        "0.10",
        "--dry-run",
        "true",
        "--at",
        "2026-12-01",
    ]
    assert spec.env == {"DEBUG": "yes", "LR": "0.10", "N": "7"}
    assert spec.work.gpu_hours == 2.0  # numbers elsewhere are still numbers
