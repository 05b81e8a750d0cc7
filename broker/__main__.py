"""`python -m broker` is the `broker` command."""

from broker.app.cli.main import main

main()
