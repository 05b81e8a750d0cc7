"""Terraform modules for agents: they parse, declare and document their variables, set spot right,
open no inbound port, keep the token out of user data; `broker agents provision --plan` fills them."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from broker.agents import terraform
from broker.agents.terraform import MODULES, Pool, module_variables, parse_tf, pool_name, pool_values, write_pool
from broker.app.cli import common
from broker.app.cli.main import app
from broker.domain.errors import BrokerError
from broker.domain.model import Job, JobState, Tier
from broker.planning import get
from broker.store.capacity import CapacityHistory, zone_of
from broker.store.jobs import Store
from conftest import NOW, ROOT, make_spec

TF = ROOT / "infra" / "terraform"
TF_FILES = sorted(TF.glob("modules/*/*.tf")) + sorted(TF.glob("examples/*/*.tf"))

WHEEL = "https://b.example/broker-0.1.0-py3-none-any.whl"
PLUGINS = Path("/opt/tf-plugins")  # a local provider mirror (hashicorp/aws) where this project's machines have one
SITE = {
    "aws": {
        "ami_id": "ami-0123456789abcdef0",
        "checkpoint_bucket": "ckpts",
        "redis_url": "rediss://agent@r.example:6380/0",
        "agent_token_secret_arn": "arn:aws:secretsmanager:us-east-1:1:secret:tok",
        "broker_package_url": WHEEL,
    },
    "gcp": {
        "project": "acme",
        "image": "projects/x/global/images/family/y",
        "checkpoint_bucket": "ckpts",
        "redis_url": "rediss://agent@r.example:6380/0",
        "agent_token_secret_id": "tok",
        "broker_package_url": WHEEL,
    },
    "azure": {
        "resource_group_name": "rg",
        "subnet_id": "/subscriptions/s/x/subnets/a",
        "admin_ssh_public_key": "ssh-ed25519 AAAA k",
        "checkpoint_container_id": "/subscriptions/s/c",
        "checkpoint_url": "az://c/broker/",
        "storage_account_name": "acct",
        "redis_url": "rediss://agent@r.example:6380/0",
        "agent_token_secret_id": "https://v.vault.azure.net/secrets/tok",
        "key_vault_id": "/subscriptions/s/v",
        "broker_package_url": WHEEL,
    },
}


def module_files(cloud):
    return sorted((TF / "modules" / MODULES[cloud]).glob("*.tf"))


def resources(cloud, kind):
    """Bodies of the module's resources of one type."""
    out = []
    for path in module_files(cloud):
        for block in parse_tf(path).get("resource", []):
            out += [body for name, body in block.get(kind, {}).items()]
    return out


@pytest.mark.parametrize("path", TF_FILES, ids=lambda p: str(p.relative_to(TF)))
def test_every_tf_file_parses(path):
    assert isinstance(parse_tf(path), dict)


@pytest.mark.parametrize("cloud", MODULES)
def test_every_variable_used_is_declared_and_every_declared_one_documented(cloud):
    declared = module_variables(cloud)
    used = set()
    for path in module_files(cloud):
        used |= set(re.findall(r"\bvar\.([a-z_][a-z0-9_]*)", path.read_text()))
    assert used <= set(declared), used - set(declared)
    assert set(declared) <= used, f"declared but unused: {set(declared) - used}"
    assert all(len(v.description) > 10 for v in declared.values())
    for name in ("variables.tf", "outputs.tf", "versions.tf", "main.tf", "README.md"):
        assert (TF / "modules" / MODULES[cloud] / name).exists(), name
    readme = (TF / "modules" / MODULES[cloud] / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in declared)


def test_aws_spot_is_one_time_terminate_with_imdsv2_required():
    template = resources("aws", "aws_launch_template")[0]
    market = template["dynamic"][0]["instance_market_options"]["content"][0]
    spot = market["spot_options"][0]
    assert market["market_type"] == "spot"
    assert (spot["spot_instance_type"], spot["instance_interruption_behavior"]) == ("one-time", "terminate")
    assert template["metadata_options"][0]["http_tokens"] == "required"


def test_gcp_spot_scheduling_is_deleted_on_preemption():
    scheduling = resources("gcp", "google_compute_instance")[0]["scheduling"][0]
    assert '"SPOT"' in scheduling["provisioning_model"] and scheduling["preemptible"] == "${local.spot}"
    assert scheduling["automatic_restart"] is False and scheduling["on_host_maintenance"] == "TERMINATE"
    assert '"DELETE"' in scheduling["instance_termination_action"]


def test_azure_spot_is_evicted_by_delete_with_a_bid_cap():
    vm = resources("azure", "azurerm_linux_virtual_machine")[0]
    assert (
        '"Spot"' in vm["priority"]
        and '"Delete"' in vm["eviction_policy"]
        and "var.max_bid_price" in vm["max_bid_price"]
    )
    assert module_variables("azure")["max_bid_price"].default == -1


def test_no_inbound_rule_opens_a_port():
    assert all("ingress" not in sg for sg in resources("aws", "aws_security_group"))
    assert (
        resources("aws", "aws_security_group_rule") == []
        and resources("aws", "aws_vpc_security_group_ingress_rule") == []
    )
    assert resources("gcp", "google_compute_firewall") == []
    assert all("security_rule" not in nsg for nsg in resources("azure", "azurerm_network_security_group"))
    assert resources("azure", "azurerm_network_security_rule") == []


def render(template: Path, values: dict) -> str:
    """Terraform's templatefile for the ${name} interpolations these templates use."""
    return re.sub(r"\$\{([a-z_]+)\}", lambda m: str(values[m.group(1)]), template.read_text())


@pytest.mark.parametrize("cloud", MODULES)
def test_user_data_reads_the_token_from_the_secret_manager_and_never_holds_it(cloud):
    # no way to pass the Redis password in; the pool's registration token (alone it admits nothing) is sensitive
    assert not [
        n for n in module_variables(cloud) if (n.endswith("token") or "password" in n) and n != "registration_token"
    ]
    variables = parse_tf(TF / "modules" / MODULES[cloud] / "variables.tf")["variable"]
    assert next(v["registration_token"] for v in variables if "registration_token" in v)["sensitive"] is True
    template = TF / "modules" / MODULES[cloud] / "templates" / "cloud-init.yaml.tftpl"
    keys = set(re.findall(r"\$\{([a-z_]+)\}", template.read_text()))
    text = render(template, {k: f"<{k}>" for k in keys} | {"redis_url": "rediss://agent@r.example:6380/0"})
    reader = {
        "aws": "aws secretsmanager get-secret-value",
        "gcp": "gcloud secrets versions access",
        "azure": "vault.azure.net",
    }[cloud]
    assert reader in text and ("<secret_arn>" in text or "<secret_id>" in text)
    assert not re.search(r"://[^/@\s'$]*:[^/@\s'$]+@", text)  # no URL with a literal password (only $token at boot)
    assert "umask 077" in text  # the token lands in a root-only file


def offer_of(catalog, cloud, tier=Tier.spot):
    return min((o for o in catalog.offers if o.cloud == cloud and o.tier == tier), key=lambda o: o.price_usd_per_h)


@pytest.mark.parametrize("cloud", MODULES)
def test_tfvars_have_exactly_the_modules_variables_with_valid_types(cloud, catalog, tmp_path):
    offer = offer_of(catalog, cloud)
    pool = Pool(pool_name(offer), offer, 3)
    root = write_pool(pool, pool_values(pool, SITE, catalog), tmp_path)
    tfvars = json.loads((root / f"{pool.name}.auto.tfvars.json").read_text())
    declared = module_variables(cloud)
    assert set(tfvars) == set(declared)
    for name, var in declared.items():
        terraform.check_type(name, var.type, tfvars[name])
    assert tfvars["instance_count"] == 3 and tfvars["offer_id"] == offer.id and tfvars["tier"] == "spot"
    config = json.loads((root / "main.tf.json").read_text())
    source = root / config["module"]["agents"]["source"]  # a copy inside the root: it works wherever it is moved
    assert source.resolve().is_relative_to(root.resolve()) and config["module"]["agents"]["source"].startswith("./")
    module = TF / "modules" / MODULES[cloud]
    for path in module.rglob("*.t*"):
        assert (source / path.relative_to(module)).read_text() == path.read_text()
    assert (root / f"{pool.name}.auto.tfvars.json").stat().st_mode & 0o077 == 0  # may hold the pool's token
    if cloud == "aws":
        on_demand = catalog.by_id[offer.id.replace("/spot", "/on_demand")].price_usd_per_h
        assert tfvars["max_price"] == on_demand and tfvars["availability_zone_id"] == offer.zone


def test_missing_or_mistyped_site_values_are_named(catalog):
    offer = offer_of(catalog, "aws")
    pool = Pool(pool_name(offer), offer, 1)
    incomplete = {"aws": {k: v for k, v in SITE["aws"].items() if k not in ("ami_id", "checkpoint_bucket")}}
    with pytest.raises(BrokerError, match="site.aws: 2 required value.s. missing: ami_id, checkpoint_bucket;"):
        pool_values(pool, incomplete, catalog)  # all of them at once, not one per run
    with pytest.raises(BrokerError, match="site.aws: 5 required value.s. missing: .*examples/site.yaml has every one"):
        pool_values(pool, {}, catalog)
    with pytest.raises(BrokerError, match="site.aws.root_volume_gb: 'big' is not a Terraform number"):
        pool_values(pool, {"aws": {**SITE["aws"], "root_volume_gb": "big"}}, catalog)
    with pytest.raises(BrokerError, match="site.aws.ami: not a variable of agent-aws"):
        pool_values(pool, {"aws": {**SITE["aws"], "ami": "x"}}, catalog)


def test_a_site_value_may_be_given_per_region_and_a_region_without_one_is_named(catalog):
    """An AMI (a subnet, a subnetwork) belongs to one region; one AMI for every pool failed at apply in any other."""
    offers = [o for o in catalog.offers if o.cloud == "aws" and o.tier == Tier.spot]
    east, south = (next(o for o in offers if o.region == r) for r in ("us-east-1", "ap-south-1"))
    site = {"aws": {**SITE["aws"], "ami_id": {"us-east-1": "ami-0east", "ap-south-1": "ami-0south"}}}
    site["aws"]["tags"] = {"us-east-1": "a map variable is one value"}
    site["aws"]["subnet_id"] = {east.zone: "subnet-0east", "ap-south-1": "subnet-0south"}  # a subnet is in one zone
    for offer, ami, subnet in ((east, "ami-0east", "subnet-0east"), (south, "ami-0south", "subnet-0south")):
        values = pool_values(Pool(pool_name(offer), offer, 1), site, catalog)
        assert values["ami_id"] == ami and values["subnet_id"] == subnet and values["tags"] == site["aws"]["tags"]
    other = next(o for o in offers if o.region == "us-east-1" and o.zone != east.zone)
    with pytest.raises(BrokerError, match=f"site.aws.subnet_id: no value for us-east-1, .*its zone, {other.zone}:"):
        pool_values(Pool(pool_name(other), other, 1), site, catalog)
    west = next(o for o in offers if o.region == "us-west-2")
    with pytest.raises(BrokerError, match="site.aws.ami_id: no value for us-west-2, where the plan puts pool aws-usw2"):
        pool_values(Pool(pool_name(west), west, 1), site, catalog)


@pytest.mark.parametrize("cloud", MODULES)
def test_the_shipped_example_site_file_has_every_required_value(cloud, catalog):
    site = yaml.safe_load((ROOT / terraform.SITE_EXAMPLE).read_text())
    offer = offer_of(catalog, cloud)
    values = pool_values(Pool(pool_name(offer), offer, 1), site, catalog)
    assert set(values) == set(module_variables(cloud))
    assert all(
        values[k] == (v.replace("{pool}", pool_name(offer)) if isinstance(v, str) else v)
        for k, v in site[cloud].items()
    )
    assert values["redis_url"].startswith(f"rediss://pool-{pool_name(offer)}@")  # the pool's own ACL user


def test_provision_plan_writes_one_pool_per_chosen_offer(store, catalog, redis_url, monkeypatch, tmp_path):
    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    spec = make_spec(resources={"accelerators": ["L4:1"]}, work={"gpu_hours": 1})
    quote = get().quote(spec, catalog.offers, NOW)
    for i in range(2):
        store.add_job(
            Job(id=f"j{i}", spec=spec, submitted_at=quote.created_at, updated_at=quote.created_at, quote=quote)
        )
    ended = Job(id="ended", spec=spec, submitted_at=quote.created_at, updated_at=quote.created_at, quote=quote)
    store.add_job(ended.model_copy(update={"state": JobState.cancelled}))
    read, real = [], Store.jobs_by_id
    monkeypatch.setattr(Store, "jobs_by_id", lambda self, ids: read.extend(ids) or real(self, ids))
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(SITE))
    result = CliRunner().invoke(
        app, ["agents", "provision", "--site", str(site), "--out", str(tmp_path / "pools"), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert "ended" not in read  # the queue is read, not every job the store ever ran
    [row] = json.loads(result.stdout)
    assert row["count"] == 2 and row["offer"] == quote.chosen.offer.id and "apply" in row["command"]
    assert (Path(row["dir"]) / f"{row['pool']}.auto.tfvars.json").exists()
    monkeypatch.setattr(common.out, "width", 60)  # a narrow terminal wrapped the command, and a copy of it broke
    result = CliRunner().invoke(app, ["agents", "provision", "--site", str(site), "--out", str(tmp_path / "pools")])
    assert result.exit_code == 0 and f"  {row['command']}\n" in result.stdout, result.output


terraform_bin = terraform.terraform_binary()


@pytest.mark.skipif(terraform_bin is None, reason="no terraform or tofu binary on PATH")
def test_terraform_fmt_check_passes():
    done = subprocess.run([terraform_bin, "fmt", "-check", "-recursive", str(TF)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(terraform_bin is None, reason="no terraform or tofu binary on PATH")
@pytest.mark.parametrize("cloud", MODULES)
def test_terraform_validate_passes(cloud, tmp_path):
    shutil.copytree(TF, tmp_path / "terraform", ignore=shutil.ignore_patterns("pools", ".terraform"))
    work = tmp_path / "terraform" / "examples" / cloud
    validate(work, cloud)


def validate(work: Path, cloud: str) -> None:
    """terraform init (from the local provider mirror where there is one) and validate in `work`."""
    mirror = [f"-plugin-dir={PLUGINS}"] if PLUGINS.is_dir() else []
    init = subprocess.run(
        [terraform_bin, f"-chdir={work}", "init", "-backend=false", "-input=false", "-no-color", *mirror],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if init.returncode != 0:
        why = next(
            (line.strip() for line in init.stderr.splitlines() if line.strip().startswith("Error")), init.stderr[-200:]
        )
        pytest.skip(f"terraform init cannot fetch the {cloud} provider here: {why}")
    done = subprocess.run(
        [terraform_bin, f"-chdir={work}", "validate", "-no-color"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_apply_without_terraform_says_how_to_install_it(store, catalog, redis_url, monkeypatch, tmp_path):
    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    monkeypatch.setattr(terraform, "terraform_binary", lambda: None)
    spec = make_spec(resources={"accelerators": ["L4:1"]}, work={"gpu_hours": 1})
    quote = get().quote(spec, catalog.offers, NOW)
    store.add_job(Job(id="j", spec=spec, submitted_at=NOW, updated_at=NOW, quote=quote))
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(SITE))
    result = CliRunner().invoke(
        app, ["agents", "provision", "--site", str(site), "--out", str(tmp_path / "pools"), "--apply", "--yes"]
    )
    assert result.exit_code == 2 and "terraform: not installed; install Terraform >= 1.5 or OpenTofu" in result.stderr
    assert list((tmp_path / "pools").iterdir())  # the plan is written all the same, to apply by hand


def test_apply_asks_before_it_creates_instances_and_a_no_creates_none(store, catalog, redis_url, monkeypatch, tmp_path):
    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    applied = []
    monkeypatch.setattr(terraform, "apply_pool", lambda root, pool: applied.append(pool))
    quote, site = write_pending_jobs_and_site(store, catalog, tmp_path, count=3)
    argv = ["agents", "provision", "--site", str(site), "--out", str(tmp_path / "pools"), "--apply"]
    for answer in ("n\n", ""):  # no, and no answer at all (not a terminal)
        result = CliRunner().invoke(app, argv, input=answer)
        assert result.exit_code == 1 and f"creates 3 x {quote.chosen.offer.id}; go ahead?" in result.stderr
        assert applied == []
    history = CapacityHistory(store)
    assert history.series.members() == []  # nothing applied: no pool to watch
    assert CliRunner().invoke(app, argv, input="y\n").exit_code == 0 and len(applied) == 1
    assert quote.chosen.offer.tier.value == "spot"  # its zone is watched: no agent there means no capacity
    assert history.series.members() == ["|".join(zone_of(quote.chosen.offer))]


def test_deprovision_of_an_unknown_pool_is_refused(tmp_path):
    result = CliRunner().invoke(app, ["agents", "deprovision", "nope", "--out", str(tmp_path)])
    assert result.exit_code == 2 and f"pool: no Terraform root at {tmp_path / 'nope'}" in result.stderr


@pytest.mark.parametrize(
    "text, expect",
    [
        (": : :\n", "not valid YAML at line 1, column 1: expected <block end>, but found ':'"),  # was five lines
        ("[1, 2]\n", "site: not a section of name: value"),  # was an internal error
        ("aws: [1, 2]\n", "site.aws: not a section of name: value"),
        ("broker_package_url: x\n", "site.broker_package_url: not a section of name: value under aws:"),  # ignored
    ],
)
def test_a_site_file_of_the_wrong_form_is_one_line(env, tmp_path, text, expect):
    site = tmp_path / "site.yaml"
    site.write_text(text)
    result = CliRunner().invoke(app, ["agents", "provision", "--site", str(site), "--out", str(tmp_path / "pools")])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and expect in lines[0], result.output


def write_pending_jobs_and_site(store, catalog, tmp_path, count=1):
    spec = make_spec(resources={"accelerators": ["L4:1"]}, work={"gpu_hours": 1})
    quote = get().quote(spec, catalog.offers, NOW)
    for i in range(count):
        store.add_job(Job(id=f"j{i}", spec=spec, submitted_at=NOW, updated_at=NOW, quote=quote))
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(SITE))
    return quote, site


def test_provision_prints_a_table_of_the_pools_it_wrote(store, catalog, redis_url, monkeypatch, tmp_path):
    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    quote, site = write_pending_jobs_and_site(store, catalog, tmp_path, count=2)
    result = CliRunner().invoke(app, ["agents", "provision", "--site", str(site), "--out", str(tmp_path / "pools")])
    assert result.exit_code == 0, result.output
    assert f"2 x {quote.chosen.offer.id}" in result.stdout and "terraform -chdir=" in result.stdout


def test_provision_without_pending_jobs_says_so_in_a_table(redis_url, monkeypatch, tmp_path):
    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(SITE))
    result = CliRunner().invoke(app, ["agents", "provision", "--site", str(site), "--out", str(tmp_path / "pools")])
    assert result.exit_code == 0, result.output
    assert "no pending jobs: nothing to provision" in result.stdout


def test_deprovision_runs_terraform_destroy_and_reports_the_pool_gone(store, catalog, redis_url, monkeypatch, tmp_path):
    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    quote, site = write_pending_jobs_and_site(store, catalog, tmp_path)
    site.write_text(site.read_text().replace("rediss://agent@", "rediss://pool-{pool}@"))  # the pool's own user
    pools = tmp_path / "pools"
    written = CliRunner().invoke(app, ["agents", "provision", "--site", str(site), "--out", str(pools), "--json"])
    [row] = json.loads(written.stdout)
    history = CapacityHistory(store)
    history.watch([quote.chosen.offer])  # as --apply does: its zone recorded, no agent there
    history.record(NOW, [])
    assert history.seen(NOW) == {zone_of(quote.chosen.offer): [(NOW.timestamp(), 0.0)]}
    calls = tmp_path / "calls"
    stand_in = tmp_path / "terraform"  # records how it was called; real destroy needs the clouds
    stand_in.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    stand_in.chmod(0o755)
    monkeypatch.setattr(terraform, "terraform_binary", lambda: str(stand_in))
    result = CliRunner().invoke(app, ["agents", "deprovision", row["pool"], "--out", str(pools)])
    assert result.exit_code == 0, result.output
    assert f"pool {row['pool']} destroyed" in result.stdout
    assert f"`broker acl remove --pool {row['pool']}`" in " ".join(result.stdout.split())  # its credentials outlive it
    assert history.seen(NOW) == {}  # no pool asks there now: its zeros say nothing of the zone's capacity
    assert calls.read_text().split() == [f"-chdir={pools / row['pool']}", "destroy", "-input=false", "-auto-approve"]
