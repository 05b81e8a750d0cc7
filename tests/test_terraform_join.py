"""Agents provisioned with Terraform can join a secured broker: a pool's registration token reaches them, the
Redis password survives any character, pip installs this project, the roots stand alone, the secret is read in
its own region."""

import json
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
import redis
import yaml
from test_terraform import SITE, TF, offer_of, terraform_bin, validate, write_pending_jobs_and_site
from typer.testing import CliRunner

from broker.agents import tokens
from broker.agents.contract import Contract
from broker.agents.terraform import MODULES, Pool, module_variables, parse_tf, pool_name, pool_values, write_pool
from broker.app.cli.main import app
from broker.store.jobs import Store
from conftest import NOW, start_redis, stop_redis

HOSTILE = "p#&/@:%? x+=\\'\""  # characters that broke the old sed splice


def template(cloud):
    return (TF / "modules" / MODULES[cloud] / "templates" / "cloud-init.yaml.tftpl").read_text()


def url_script(cloud) -> str:
    """The boot script that puts the Redis password into the URL, as cloud-init writes it."""
    text = template(cloud)
    start = text.index("path: /usr/local/sbin/broker-redis-url")
    block = text[text.index("content: |\n", start) + len("content: |\n") : text.index("  - path:", start + 10)]
    return textwrap.dedent(block)


@pytest.mark.parametrize("cloud", MODULES)
def test_any_redis_password_reaches_the_agent_intact(cloud, tmp_path):
    script = tmp_path / "broker-redis-url"
    script.write_text(url_script(cloud))
    for password in (HOSTILE, "plain"):
        done = subprocess.run(
            [sys.executable, str(script), "rediss://agent@r.example:6380/0"],
            input=password + "\n",
            capture_output=True,
            text=True,
            check=True,
        )
        parsed = redis.connection.parse_url(done.stdout.strip())
        assert parsed["password"] == password and parsed["username"] == "agent"
        assert (parsed["host"], parsed["port"], parsed["db"]) == ("r.example", 6380, 0)
    assert "sed " not in template(cloud)


@pytest.mark.parametrize("cloud", MODULES)
def test_the_agent_gets_the_pools_token_and_a_name_it_admits(cloud):
    from broker.domain.errors import BrokerError, RefusedError

    text = template(cloud)
    # refused (its token), it is not started again every 5 s into the same refusal; a Redis outage (2) is restarted
    assert (
        f"RestartPreventExitStatus={RefusedError.exit_code}" in text and BrokerError.exit_code != RefusedError.exit_code
    )
    assert "BROKER_AGENT_TOKEN=%s" in text and "'${registration_token}'" in text
    assert "--id '${pool_name}.%H'" in text  # systemd's %H: the host name, under the pool's prefix


def test_a_pool_token_admits_the_pools_agents_only():
    token = tokens.issue_pool("s3cret", "aws-use1-az1-g6-spot", NOW + timedelta(hours=1))
    assert tokens.refusal("s3cret", "aws-use1-az1-g6-spot.ip-10-0-0-7", token, NOW) is None
    assert "pool 'aws-use1-az1-g6-spot'" in tokens.refusal("s3cret", "other-pool.ip-10-0-0-7", token, NOW)
    assert "does not match" in tokens.refusal("other", "aws-use1-az1-g6-spot.h", token, NOW)
    assert "expired" in tokens.refusal("s3cret", "aws-use1-az1-g6-spot.h", token, NOW + timedelta(hours=2))
    forged = token.replace("g6", "g5")  # relabelled for another pool: the signature is for this one
    assert "does not match" in tokens.refusal("s3cret", "aws-use1-az1-g5-spot.h", forged, NOW)
    assert tokens.refusal("s3cret", "x", "pool:broken", NOW) is not None


def test_provision_with_the_brokers_secret_writes_each_pools_token(store, catalog, redis_url, monkeypatch, tmp_path):
    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    monkeypatch.setenv("BROKER_AGENT_SECRET", "a-secret-of-24-characters")
    _, site = write_pending_jobs_and_site(store, catalog, tmp_path)
    result = CliRunner().invoke(
        app, ["agents", "provision", "--site", str(site), "--out", str(tmp_path / "pools"), "--json"]
    )
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)
    tfvars = json.loads((tmp_path / "pools" / row["pool"] / f"{row['pool']}.auto.tfvars.json").read_text())
    assert (
        tokens.refusal("a-secret-of-24-characters", f"{row['pool']}.ip-10-1-2-3", tfvars["registration_token"], NOW)
        is None
    )
    monkeypatch.delenv("BROKER_AGENT_SECRET")
    again = CliRunner().invoke(app, ["agents", "provision", "--site", str(site), "--out", str(tmp_path / "p2")])
    assert again.exit_code == 0 and "BROKER_AGENT_SECRET is not set" in again.stderr


@pytest.mark.parametrize("cloud", MODULES)
def test_pip_installs_this_project_from_the_url_given_never_pypis_broker(cloud):
    variable = module_variables(cloud)["broker_package_url"]
    assert variable.required and "broker_package" not in module_variables(cloud)
    assert f"'broker[{ {'aws': 's3', 'gcp': 'gcs', 'azure': 'azure'}[cloud] } ] @ ${{broker_package_url}}'".replace(
        " ]", "]"
    ) in template(cloud)


def test_the_aws_secret_is_read_in_the_region_of_its_arn():
    locals_ = parse_tf(TF / "modules" / "agent-aws" / "main.tf")["locals"][0]
    assert 'split(":", var.agent_token_secret_arn), 3)' in str(locals_["user_data"])
    assert "aws_region" not in (TF / "modules" / "agent-aws" / "main.tf").read_text()


@pytest.mark.skipif(terraform_bin is None, reason="no terraform or tofu binary on PATH")
def test_a_generated_aws_pool_validates_after_it_is_moved(catalog, tmp_path):
    offer = offer_of(catalog, "aws")
    pool = Pool(pool_name(offer), offer, 1)
    root = write_pool(pool, pool_values(pool, SITE, catalog, token="pool:x:1.ab"), tmp_path / "pools")
    moved = tmp_path / "elsewhere" / pool.name
    moved.parent.mkdir()
    root.rename(moved)
    validate(moved, "aws")


def test_a_pools_agents_reach_redis_as_the_pools_own_acl_user(store, catalog, redis_url, monkeypatch, tmp_path):
    """`{pool}` in the site's redis_url: each pool's instances connect as the user `broker acl agent --pool` makes
    for that pool, with the password the site's secret holds. Before, no `broker acl` user fit agents named
    <pool>.<host>: a shared Redis with ACL users had no user to give Terraform's agents but an admin's."""
    proc, port = start_redis(tmp_path, password="admin-pw")
    try:
        monkeypatch.setenv("BROKER_REDIS_URL", redis_url)  # the broker's store, with the pending job
        _, site = write_pending_jobs_and_site(store, catalog, tmp_path)
        values = yaml.safe_load(site.read_text())
        for cloud in values:
            values[cloud]["redis_url"] = f"redis://pool-{{pool}}@127.0.0.1:{port}/0"  # where the agents connect
        site.write_text(yaml.safe_dump(values))
        result = CliRunner().invoke(app, ["agents", "provision", "--site", str(site), "--out", str(tmp_path / "p")])
        assert result.exit_code == 0, result.output
        listed = CliRunner().invoke(
            app, ["agents", "provision", "--site", str(site), "--out", str(tmp_path / "p"), "--json"]
        )
        [row] = json.loads(listed.stdout)
        pool, cloud = row["pool"], row["offer"].split("/")[0]
        assert f"broker acl agent --pool {pool}" in " ".join(result.stdout.split())  # says which user to make
        tfvars = json.loads((tmp_path / "p" / pool / f"{pool}.auto.tfvars.json").read_text())
        assert tfvars["redis_url"] == f"redis://pool-{pool}@127.0.0.1:{port}/0" and row["redis_user"] == f"pool-{pool}"

        monkeypatch.setenv("BROKER_REDIS_URL", f"redis://:admin-pw@127.0.0.1:{port}/0")
        monkeypatch.setenv("BROKER_ACL_PASSWORD", HOSTILE)  # the password in the site's secret
        assert CliRunner().invoke(app, ["acl", "agent", "--pool", pool]).exit_code == 0
        script = tmp_path / "broker-redis-url"
        script.write_text(url_script(cloud))
        booted = subprocess.run(  # as the instance builds its URL at boot
            [sys.executable, str(script), tfvars["redis_url"]], input=HOSTILE + "\n", capture_output=True, text=True
        ).stdout.strip()
        offer = next(o for o in catalog.offers if o.id == row["offer"])
        Contract(Store(booted), f"{pool}.ip-10-0-0-7").register(offer, 10_000)  # systemd's %H: its host name
        assert [a.id for a in Store(f"redis://:admin-pw@127.0.0.1:{port}/0").agents()] == [f"{pool}.ip-10-0-0-7"]
        with pytest.raises(redis.exceptions.NoPermissionError):
            Contract(Store(booted), "other-pool.ip-10-0-0-8").register(offer, 10_000)
    finally:
        stop_redis(proc, port)
