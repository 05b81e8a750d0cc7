"""The `broker` command: parse, call the core, render. Errors a user can cause exit 2 with one line each."""

from __future__ import annotations

import logging

import typer

from broker.app.cli import demo, jobs, services
from broker.app.cli.acl import acl_app
from broker.app.cli.agents import agents_app
from broker.app.cli.backtest import backtest_command
from broker.app.cli.common import (
    debug_flag,
)
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
app.command("policies")(jobs.list_policies)
app.command()(demo.demo)
app.command()(services.server)
app.command()(services.agent)
app.command()(services.dashboard)
app.command()(services.stop)
app.command("backtest")(backtest_command)
app.command("layout")(layout_command)
app.add_typer(prices_app, name="prices")
app.add_typer(agents_app, name="agents")
app.add_typer(acl_app, name="acl")


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show tracebacks of unexpected errors.")) -> None:
    debug_flag["on"] = debug
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s %(message)s")
