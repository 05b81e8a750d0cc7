"""The `broker` command: parse, call the core, render. Errors a user can cause exit 2 with one line each."""

from __future__ import annotations

import logging
import sys

import typer
from typer import rich_utils

from broker.app.cli import check, demo, jobs, services
from broker.app.cli.acl import acl_app
from broker.app.cli.agents import agents_app
from broker.app.cli.backtest import backtest_command
from broker.app.cli.common import debug_flag, json_error
from broker.app.cli.layout import layout_command
from broker.app.cli.prices import prices_app

app = typer.Typer(
    help=(
        "Run GPU jobs on the cheapest capacity (pipeline bubbles, spot, on-demand) that meets their "
        "deadline and budget."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # docstrings wrap to the terminal (rich mode keeps their line breaks)
)
app.command()(jobs.submit)
app.command()(jobs.run)
app.command("list")(jobs.list_jobs)
app.command()(jobs.status)
app.command()(jobs.logs)
app.command("cost-report")(jobs.cost_report)
app.command()(jobs.cancel)
app.command()(jobs.amend)
app.command("policies")(jobs.list_policies)
app.command()(demo.demo)
app.command()(services.server)
app.command()(services.agent)
app.command()(services.dashboard)
app.command()(services.stop)
app.command()(check.check)
app.command("backtest")(backtest_command)
app.command("layout")(layout_command)
app.add_typer(prices_app, name="prices")
app.add_typer(agents_app, name="agents")
app.add_typer(acl_app, name="acl")


def _version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        typer.echo(f"broker {version('broker')}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of unexpected errors."),
    _: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    debug_flag["on"] = debug
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s %(message)s")


def main() -> None:
    """The `broker` command. With --json, a usage error (an option out of range, a missing argument), which typer
    reports before any command runs, is the JSON document on stdout too, as every other error is. --debug counts
    wherever it is: "rerun with --debug" is read as `broker list --debug`, which typer refused (no such option)."""
    args = sys.argv[1:]
    if "--debug" in args[1:]:
        args = ["--debug", *(arg for arg in args if arg != "--debug")]
    if "--json" not in args:
        app(args=args, prog_name="broker")
        return
    try:
        code = app(args=args, prog_name="broker", standalone_mode=False)
    except typer.Abort:
        sys.exit(1)
    except typer.TyperException as error:  # typer's click found the usage wrong: no command ran
        json_error(True, type(error).__name__, [error.format_message()], error.exit_code)
        rich_utils.rich_format_error(error)
        sys.exit(error.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
