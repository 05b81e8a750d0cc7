"""`broker server` plans with a policy that decides from the market model whatever names it (`--policy` or
BROKER_POLICY), at the prices it dispatches at. `--policy hedge` ran as Uniform Progress (the policy was made apart from
the core that gives it the market's view), and every server's hedge rule chose its zones and priced its waits at the
packaged snapshot's prices, whatever `broker prices refresh` had recorded since."""

from datetime import UTC, datetime

import pandas as pd
import pytest
from typer.testing import CliRunner

from broker.app import wiring
from broker.app.cli.common import make_broker
from broker.app.cli.main import app
from broker.core import server
from broker.core.replica import Replica
from broker.store.prices import PriceHistory
from conftest import make_spec


@pytest.mark.parametrize("name", ["hedge", "cost-to-go"])
def test_a_policy_named_on_the_command_line_decides_from_the_market_model(env, monkeypatch, name):
    served = []
    monkeypatch.setattr(Replica, "serve", lambda replica, until=None: served.append(replica))
    result = CliRunner().invoke(app, ["server", "--policy", name, "--metrics-port", "0"])
    assert result.exit_code == 0, result.output
    policy = served[0].servers[0].policy
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
