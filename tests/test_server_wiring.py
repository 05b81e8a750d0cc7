"""`broker server` plans with a policy that decides from the market model whatever names it (`--policy` or
BROKER_POLICY), at the prices it dispatches at. `--policy hedge` ran as Uniform Progress (the policy was made apart from
the core that gives it the market's view), and every server's hedge rule chose its zones and priced its waits at the
packaged snapshot's prices, whatever `broker prices refresh` had recorded since."""

import json
from datetime import UTC, datetime

import pandas as pd
import pytest
from test_cli import job_file
from typer.testing import CliRunner

from broker.app import wiring
from broker.app.cli.common import make_broker
from broker.app.cli.main import app
from broker.core import server
from broker.core.replica import Replica
from broker.store.prices import PriceHistory
from conftest import make_spec


def serve(monkeypatch, *args) -> Replica:
    """`broker server ARGS` as far as its loop: the replica it would serve."""
    served = []
    monkeypatch.setattr(Replica, "serve", lambda replica, until=None: served.append(replica))
    result = CliRunner().invoke(app, ["server", "--metrics-port", "0", *args])
    assert result.exit_code == 0, result.output
    assert f"planning with {served[0].servers[0].policy.name}" in result.stderr  # what it follows is said
    return served[0]


@pytest.mark.parametrize("name", ["hedge", "cost-to-go"])
def test_a_policy_named_on_the_command_line_decides_from_the_market_model(env, monkeypatch, name):
    policy = serve(monkeypatch, "--policy", name).servers[0].policy
    assert policy.name == name and policy.hedge is not None and policy.live_spot is not None


def test_the_server_s_hedge_rule_reads_the_prices_it_dispatches_at(env, monkeypatch):
    monkeypatch.setattr(server, "PRICES_EVERY_S", 0.0)  # read afresh at every ask (a minute apart in a server)
    broker = make_broker(daemon=True, claim=True)
    replica = wiring.make_replica(broker, "r1")
    spec = make_spec(resources={"accelerators": ["V100:1"]})
    zones = broker.hedges.zones_of(spec)
    assert replica.servers[0].policy.hedge is broker.hedges and len(zones) > 1
    dearest = zones[-1]  # the dearest of the zones it would spread over becomes the cheapest of all
    cheaper = dearest.price_usd_per_h / 10
    PriceHistory(broker.store).record(pd.DataFrame([{"offer": dearest.id, "usd": cheaper, "at": datetime.now(UTC)}]))
    first = broker.hedges.zones_of(spec)[0]
    assert first.id == dearest.id and first.price_usd_per_h == pytest.approx(cheaper)


def test_quotes_simulate_the_policy_the_servers_plan_with(env, monkeypatch, tmp_path):
    """A server run with `--policy cost-to-go` beside CLIs at the default had every job quoted by hedge's futures (a
    `--quote` alone reads no store: the snapshot's prices and BROKER_POLICY)."""

    def quoted() -> tuple[str, str]:
        result = CliRunner().invoke(app, ["submit", str(job_file(tmp_path)), "--json"])
        return json.loads(result.stdout)["quote"]["policy"], result.stderr

    monkeypatch.delenv("BROKER_POLICY", raising=False)
    serve(monkeypatch, "--policy", "cost-to-go")
    policy, said = quoted()
    assert policy == "cost-to-go" and "note" not in said
    policies = json.loads(CliRunner().invoke(app, ["policies", "--json"]).stdout)
    assert [p["name"] for p in policies if p["active"]] == ["cost-to-go"]
    assert serve(monkeypatch).servers[0].policy.name == "cost-to-go"  # a replica started plainly follows it
    monkeypatch.setenv("BROKER_POLICY", "hedge")  # set here: it quotes so, and says the servers run another
    policy, said = quoted()
    assert policy == "hedge" and "BROKER_POLICY=hedge here, but the servers plan with cost-to-go" in said


def test_policies_are_listed_without_a_store_to_ask(monkeypatch):
    monkeypatch.setenv("BROKER_REDIS_URL", "redis://127.0.0.1:1")  # nothing listens there
    monkeypatch.delenv("BROKER_POLICY", raising=False)
    result = CliRunner().invoke(app, ["policies", "--json"])
    assert result.exit_code == 0, result.output
    assert [p["name"] for p in json.loads(result.stdout) if p["active"]] == ["hedge"]
