"""Terraform provisioning: the pools of the current plan as Terraform roots over infra/terraform/modules.

A pool is the capacity the plan wants on one offer: the pending jobs whose quote chose it.
For each pool, `write_pool` makes a directory with a generated `main.tf.json` (provider,
the module's variables, the module call) and `<pool>.auto.tfvars.json` holding exactly the
module's variables: pool values from the offer, site values (AMI, bucket, secret
references, Redis URL) from the user's site file, and the module's defaults for the rest.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hcl2

import broker
from broker.domain.errors import BrokerError
from broker.domain.model import Job, Tier
from broker.domain.offer import Offer
from broker.pricing.catalog import PriceCatalog

MODULES = {"aws": "agent-aws", "gcp": "agent-gcp", "azure": "agent-azure"}


def terraform_dir() -> Path:
    """infra/terraform of the source checkout broker runs from."""
    return Path(broker.__file__).resolve().parent.parent / "infra" / "terraform"


def _unquote(value: Any) -> Any:
    """python-hcl2 keeps HCL quotes on strings and keys; strip them (and its block markers)."""
    if isinstance(value, str):
        return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value
    if isinstance(value, dict):
        return {_unquote(k): _unquote(v) for k, v in value.items() if k != "__is_block__"}
    if isinstance(value, list):
        return [_unquote(v) for v in value]
    return value


def parse_tf(path: Path) -> dict:
    """A .tf file as plain Python data (quotes stripped)."""
    with open(path) as f:
        return _unquote(hcl2.load(f))


@dataclass(frozen=True)
class Variable:
    name: str
    type: str
    required: bool
    default: Any
    description: str


def module_variables(cloud: str) -> dict[str, Variable]:
    """The variables a cloud's agent module declares."""
    out = {}
    for block in parse_tf(terraform_dir() / "modules" / MODULES[cloud] / "variables.tf").get("variable", []):
        for name, body in block.items():
            kind = str(body.get("type", "any")).removeprefix("${").removesuffix("}")
            out[name] = Variable(name, kind, "default" not in body, body.get("default"), body.get("description", ""))
    return out


@dataclass(frozen=True)
class Pool:
    name: str
    offer: Offer
    count: int


def pool_name(offer: Offer) -> str:
    """A name every cloud accepts in resource names and labels: lowercase letters, digits, dashes."""
    raw = f"{offer.cloud}-{offer.zone or offer.region}-{offer.instance_type}-{offer.tier.value}"
    return re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-")[:48]


def pools_from_jobs(jobs: list[Job]) -> list[Pool]:
    """One pool per offer chosen by pending jobs' quotes, sized to the number of those jobs."""
    pending = [j for j in jobs if j.pending]
    offers = {j.quote.chosen.offer.id: j.quote.chosen.offer for j in pending}
    counts = Counter(j.quote.chosen.offer.id for j in pending)
    return [Pool(pool_name(offers[i]), offers[i], n) for i, n in sorted(counts.items())]


def _on_demand_price(catalog: PriceCatalog, offer: Offer) -> float | None:
    twin = catalog.by_id.get(offer.id.rsplit("/", 1)[0] + "/on_demand")
    return twin.price_usd_per_h if twin else None


SITE_EXAMPLE = "infra/terraform/examples/site.yaml"


def pool_values(
    pool: Pool, site: dict, catalog: PriceCatalog, token: str | None = None, prefix: str = "broker:", shards: int = 1
) -> dict:
    """Exactly the module's variables for this pool: offer values (and its registration token, the broker's key
    `prefix` and `shards`: its agents open the store as the broker does), then site values, then defaults."""
    o, spot = pool.offer, pool.offer.tier == Tier.spot
    common = {"pool_name": pool.name, "offer_id": o.id, "instance_count": pool.count, "tier": o.tier.value}
    common |= {"key_prefix": prefix, "shards": shards}
    if token is not None:
        common["registration_token"] = token
    by_cloud = {
        "aws": {
            "availability_zone_id": o.zone,
            "instance_type": o.instance_type,
            "max_price": _on_demand_price(catalog, o) if spot else None,
        },
        "gcp": {"zone": o.zone, "machine_type": o.instance_type},
        "azure": {"location": o.region, "vm_size": o.instance_type, "max_bid_price": -1},
    }
    declared = module_variables(o.cloud)
    cloud_site = site.get(o.cloud) or {}
    unknown = sorted(set(cloud_site) - set(declared))
    if unknown:
        raise BrokerError(
            f"site.{o.cloud}.{unknown[0]}: not a variable of {MODULES[o.cloud]}; allowed: {', '.join(declared)}"
        )
    regional = {
        name: _named(_in_region(f"site.{o.cloud}.{name}", declared[name].type, v, pool), pool)
        for name, v in cloud_site.items()
    }
    values = {**common, **by_cloud[o.cloud], **regional}
    missing = [name for name, var in declared.items() if name not in values and var.required]
    if missing:
        raise BrokerError(
            f"site.{o.cloud}: {len(missing)} required value(s) missing: {', '.join(missing)}; add them to the site "
            f"file ({SITE_EXAMPLE} has every one, with what each is)"
        )
    for name, var in declared.items():
        values.setdefault(name, var.default)
    for name, var in declared.items():
        check_type(f"site.{o.cloud}.{name}", var.type, values[name])
    return {name: values[name] for name in declared}


def _in_region(field: str, kind: str, value: Any, pool: Pool) -> Any:
    """A site value given per place ({region or zone: value}) -> the pool's zone's, else its region's: an AMI or a
    subnetwork belongs to one region, an AWS subnet to one zone, and the plan may put pools in any. A value of a map
    or object type is one value."""
    if not isinstance(value, dict) or kind.startswith(("map(", "object(")) or kind == "any":
        return value
    zone, region = pool.offer.zone, pool.offer.region
    if zone in value or region in value:
        return value[zone] if zone in value else value[region]
    raise BrokerError(
        f"{field}: no value for {region}, where the plan puts pool {pool.name} (given for {', '.join(value)}); "
        f"add {region}: under it (or its zone, {zone}:), or keep the jobs out of {region} (resources: exclude:)"
    )


def _named(value: Any, pool: Pool) -> Any:
    """`{pool}` in a site string stands for the pool's name: `rediss://pool-{pool}@host:6380/0` gives each pool's
    agents the Redis user `broker acl agent --pool` makes for them, which reaches only their own keys."""
    return value.replace("{pool}", pool.name) if isinstance(value, str) else value


def check_type(field: str, kind: str, value: Any) -> None:
    """Raise a BrokerError when `value` cannot be a Terraform value of type `kind` (null always can)."""
    ok = (
        value is None
        or (kind == "string" and isinstance(value, str))
        or (kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (kind == "bool" and isinstance(value, bool))
        or (kind.startswith("map(") and isinstance(value, dict) and all(isinstance(v, str) for v in value.values()))
        or (kind.startswith("object(") and isinstance(value, dict))
        or kind == "any"
    )
    if not ok:
        raise BrokerError(f"{field}: {value!r} is not a Terraform {kind}")


def write_pool(pool: Pool, values: dict, out_dir: Path) -> Path:
    """The pool's Terraform root: main.tf.json, <pool>.auto.tfvars.json (owner-only: it may hold the pool's
    registration token) and a copy of the module, so the root works wherever it is moved; returns its directory."""
    cloud = pool.offer.cloud
    root = Path(out_dir) / pool.name
    root.mkdir(parents=True, exist_ok=True)
    module = root / "modules" / MODULES[cloud]
    shutil.rmtree(module, ignore_errors=True)
    shutil.copytree(terraform_dir() / "modules" / MODULES[cloud], module, ignore=shutil.ignore_patterns(".terraform*"))
    providers = {
        "aws": {"aws": {"region": pool.offer.region}},
        "gcp": {"google": {"project": "${var.project}"}},
        "azure": {"azurerm": {"features": {}}},
    }
    declared = module_variables(cloud)
    config = {
        "provider": providers[cloud],
        "variable": {n: {"type": v.type, "description": v.description} for n, v in declared.items()},
        "module": {
            "agents": {
                "source": f"./modules/{MODULES[cloud]}",
                **{n: f"${{var.{n}}}" for n in declared},
            }
        },
    }
    (root / "main.tf.json").write_text(json.dumps(config, indent=2) + "\n")
    tfvars = root / f"{pool.name}.auto.tfvars.json"
    tfvars.touch(mode=0o600)
    tfvars.chmod(0o600)
    tfvars.write_text(json.dumps(values, indent=2) + "\n")
    return root


def terraform_binary() -> str | None:
    """terraform or tofu from PATH."""
    return shutil.which("terraform") or shutil.which("tofu")


def apply_pool(root: Path, pool: str) -> None:
    """terraform init and apply in a pool's root; a BrokerError says what to do when either fails."""
    binary = terraform_binary()
    if binary is None:
        raise BrokerError(
            "terraform: not installed; install Terraform >= 1.5 or OpenTofu, then rerun with "
            "--apply (or run the printed commands)"
        )
    for step in (["init", "-input=false"], ["apply", "-input=false", "-auto-approve"]):
        if subprocess.run([binary, f"-chdir={root}", *step]).returncode != 0:
            raise BrokerError(f"terraform {step[0]} failed for pool {pool}; see its output above")


def pool_value(root: Path, pool: str, name: str) -> Any:
    """A value a pool's root was written with (its tfvars', such as offer_id); None where they cannot be read."""
    try:
        return json.loads((root / f"{pool}.auto.tfvars.json").read_text()).get(name)
    except (OSError, ValueError):
        return None


def destroy_pool(root: Path, pool: str) -> None:
    """terraform destroy in a pool's root."""
    binary = terraform_binary()
    if binary is None:
        raise BrokerError(
            "terraform: not installed; install Terraform >= 1.5 or OpenTofu, "
            f"or run `terraform -chdir={root} destroy` where it is"
        )
    if subprocess.run([binary, f"-chdir={root}", "destroy", "-input=false", "-auto-approve"]).returncode != 0:
        raise BrokerError(f"terraform destroy failed for pool {pool}; see its output above")
