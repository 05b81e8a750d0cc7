"""`python -m broker` is the `broker` command."""

from broker.cli import app

app(prog_name="broker")
