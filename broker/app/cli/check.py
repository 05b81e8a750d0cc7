"""`broker check`: what this machine's broker is set up to do (broker/app/checkup.py), a line a part."""

from __future__ import annotations

import typer
from rich.markup import escape

from broker.app.cli.common import JsonOpt, out, print_json, user_errors
from broker.app.settings import Settings

COLOURS = {"ok": "green", "note": "yellow", "problem": "red"}


@user_errors
def check(as_json: bool = JsonOpt) -> None:
    """What this machine's broker is set up to do (as `sky check`): the store, a server, agents, prices, each
    cloud's credentials, checkpoints, the agents' secret, terraform. Exits 2 when a part has a problem."""
    from broker.app.checkup import PROBLEM, checkup

    findings = checkup(Settings.from_env())
    if as_json:
        print_json([finding.as_dict() for finding in findings])
    else:
        for finding in findings:
            mark = f"[{COLOURS[finding.status]}]{finding.status:<7}[/]"
            out.print(f"{mark} [bold]{finding.part:<12}[/] {escape(finding.detail)}", highlight=False)
    if any(finding.status == PROBLEM for finding in findings):
        raise typer.Exit(2)
