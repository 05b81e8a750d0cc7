"""`broker --help` and each command's help, as a terminal shows them."""

from typer.testing import CliRunner

from broker.app.cli.main import app

runner = CliRunner()


def test_help_wraps_each_command_to_the_terminal_not_at_the_docstrings_line_breaks():
    """`broker --help` at 100 columns: a command whose description takes several lines fills each but the last
    (the docstrings' own line breaks would leave half-empty lines), and shows no markup's backticks."""
    shown = runner.invoke(app, ["--help"], env={"COLUMNS": "100"}).stdout
    lines = [line[2:].rstrip("│ ") for line in shown.splitlines() if line.startswith("│ ")]
    commands = [i for i, line in enumerate(lines) if line.split() and line.split()[0] in {"run", "server", "logs"}]
    assert len(commands) == 3 and "`" not in shown
    for start in commands:
        end = next(i for i in range(start + 1, len(lines) + 1) if i == len(lines) or lines[i][:1].strip())
        assert end - start >= 2 and all(len(line) > 75 for line in lines[start : end - 1]), lines[start:end]


def test_every_help_at_80_columns_shows_its_text_whole():
    """A help column too narrow for a word cut it with an ellipsis (`agents provision`'s "infra/terraform/poo…")."""
    from typer.main import get_command

    def commands(group, path):
        yield path
        for name, command in getattr(group, "commands", {}).items():
            yield from commands(command, [*path, name])

    for path in commands(get_command(app), []):
        shown = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"}).stdout
        assert "…" not in shown, (path, shown)


def test_version_prints_the_installed_packages_version():
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout == f"broker {version('broker')}\n"
