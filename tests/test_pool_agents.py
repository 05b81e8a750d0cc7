"""What a pool's agents are given at boot: they open the store as the broker does."""

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from test_terraform import SITE, TF, render
from typer.testing import CliRunner

from broker.agents.terraform import MODULES
from broker.app.cli.main import app
from broker.domain.model import Job
from broker.planning import get
from conftest import NOW, make_spec


@pytest.mark.parametrize("cloud", MODULES)
def test_a_pools_agents_open_the_store_as_a_sharded_broker_does(
    cloud, store, catalog, redis_url, monkeypatch, tmp_path
):
    """Their environment named the Redis alone: on a broker with BROKER_SHARDS (or its own BROKER_PREFIX) they
    registered under keys no server plans, and the jobs waited for agents that were up."""
    from broker.store.shards import ShardedStore

    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    monkeypatch.setenv("BROKER_PREFIX", "team:")
    monkeypatch.setenv("BROKER_SHARDS", "4")
    gpu = "T4:1" if cloud == "azure" else "L4:1"
    spec = make_spec(resources={"accelerators": [gpu], "cloud": [cloud]}, work={"gpu_hours": 1})
    quote = get().quote(spec, catalog.offers, NOW)
    ShardedStore(redis_url, "team:", 4).add_job(
        Job(id="j", spec=spec, submitted_at=quote.created_at, updated_at=quote.created_at, quote=quote)
    )
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(SITE))
    result = CliRunner().invoke(app, ["agents", "provision", "--site", str(site), "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)
    tfvars = json.loads((Path(row["dir"]) / f"{row['pool']}.auto.tfvars.json").read_text())
    assert (tfvars["key_prefix"], tfvars["shards"]) == ("team:", 4)
    template = TF / "modules" / MODULES[cloud] / "templates" / "cloud-init.yaml.tftpl"
    keys = set(re.findall(r"\$\{([a-z_]+)\}", template.read_text()))
    text = render(template, {k: f"<{k}>" for k in keys} | tfvars)
    env_file = tmp_path / "agent.env"  # the user data's lines that write the agent's environment, run here
    lines = [line.strip() for line in text.splitlines() if "/etc/broker/agent.env" in line and "printf" in line]
    script = "\n".join(["url=redis://u@r:6379/0", *lines]).replace("/etc/broker/agent.env", str(env_file))
    subprocess.run(["bash", "-c", script], check=True)
    written = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    assert (written["BROKER_PREFIX"], written["BROKER_SHARDS"]) == ("team:", "4")
    assert written["BROKER_TOKEN_FILE"].startswith("/var/lib/")  # a renewed token outlives a reboot
