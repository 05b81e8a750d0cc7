"""Live GCP GPU prices, as rows in the snapshot's COLUMNS, by the snapshot's rule: VM = host + GPUs.

- SKUs: the Cloud Billing Catalog of Compute Engine (service 6F81-5844-456A) through
  google-cloud-billing; usage type OnDemand or Preemptible (spot); a price is units + nanos.
  Host parts are "<FAMILY> Instance Core" (per vCPU hour) and "<FAMILY> Instance Ram" (per GiB
  hour); GPU parts are named by model ("Nvidia L4 GPU"); each SKU lists its service regions.
- Machine types with built-in GPUs (a2, a3, g2) per zone from google-cloud-compute.
- VM price per zone = vCPUs x core + memory GiB x RAM + GPUs x GPU price, for both tiers.
Credentials come from google-auth's default chain; TooManyRequests (HTTP 429), ResourceExhausted and
ServiceUnavailable are retried with backoff.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime

import pandas as pd
from google.api_core import exceptions, retry

from broker.domain.errors import SourceUnavailable
from broker.pricing.snapshot import COLUMNS, normalized

COMPUTE_SERVICE = "services/6F81-5844-456A"
GPU_SKUS = {  # the model part of a GPU SKU's description -> our accelerator name
    "Nvidia Tesla A100 GPU": "A100",
    "Nvidia Tesla A100 80GB GPU": "A100-80GB",
    "Nvidia H100 80GB GPU": "H100",
    "Nvidia H100 80GB Mega GPU": "H100-MEGA",
    "Nvidia L4 GPU": "L4",
}
GPU_TYPES = {
    "nvidia-tesla-a100": "A100",
    "nvidia-a100-80gb": "A100-80GB",
    "nvidia-h100-80gb": "H100",
    "nvidia-h100-mega-80gb": "H100-MEGA",
    "nvidia-l4": "L4",
}
TIERS = {"OnDemand": "on_demand", "Preemptible": "spot"}
_DESCRIPTION = re.compile(r"^(Spot Preemptible )?(?P<what>.+?) running in ")
RETRY = retry.Retry(
    predicate=retry.if_exception_type(
        exceptions.TooManyRequests, exceptions.ResourceExhausted, exceptions.ServiceUnavailable
    ),
    initial=0.5,
    maximum=10.0,
    timeout=120.0,
)


def unit_price(sku) -> float | None:
    """USD per usage unit of a SKU's current price (the first tier: GPUs and cores have one)."""
    try:
        rate = sku.pricing_info[0].pricing_expression.tiered_rates[0].unit_price
    except IndexError:
        return None
    if rate.currency_code and rate.currency_code != "USD":
        return None
    return int(rate.units) + rate.nanos / 1e9


class GcpPrices:
    """On-demand and spot prices of GCP machine types with built-in NVIDIA GPUs."""

    cloud = "gcp"

    def __init__(
        self, regions: list[str], project: str | None = None, credentials=None, catalog=None, machine_types=None
    ):
        self.regions, self.project, self.credentials = set(regions), project, credentials
        self._catalog, self._machine_types = catalog, machine_types
        self.skipped: Counter[str] = Counter()

    def check(self) -> None:
        """Raise SourceUnavailable (one line) when google-auth finds no credentials."""
        if self.credentials is not None and self.project:
            return
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError

        try:
            self.credentials, found = google.auth.default()
        except DefaultCredentialsError:
            raise SourceUnavailable(
                "gcp: no credentials in google-auth's chain (GOOGLE_APPLICATION_CREDENTIALS, gcloud, "
                "metadata); keeping the snapshot prices"
            ) from None
        self.project = self.project or found
        if not self.project:
            raise SourceUnavailable("gcp: no project (set GOOGLE_CLOUD_PROJECT); keeping the snapshot prices")

    def clients(self):
        from google.cloud import billing_v1, compute_v1

        catalog = self._catalog or billing_v1.CloudCatalogClient(credentials=self.credentials, transport="rest")
        machine_types = self._machine_types or compute_v1.MachineTypesClient(
            credentials=self.credentials, transport="rest"
        )
        return catalog, machine_types

    def rows(self, now: datetime | None = None) -> pd.DataFrame:
        catalog, machine_types = self.clients()
        prices = self.sku_prices(catalog)
        rows = []
        for zone, machine in self.gpu_machines(machine_types):
            region = zone.rsplit("-", 1)[0]
            family = machine["name"].split("-")[0].upper()
            row = {
                "region": region,
                "zone": zone,
                "instance_type": machine["name"],
                "accelerator": machine["accelerator"],
                "accelerator_count": machine["count"],
                "vcpus": machine["vcpus"],
                "memory_gb": machine["memory_gb"],
            }
            for tier in TIERS.values():
                parts = [
                    prices.get(("core", family, region, tier)),
                    prices.get(("ram", family, region, tier)),
                    prices.get(("gpu", machine["accelerator"], region, tier)),
                ]
                if None in parts:
                    self.skipped[f"no {tier} SKU for a part of {machine['name']}"] += 1
                    row[f"{tier}_usd_per_h"] = None
                    continue
                core, ram, gpu = parts
                row[f"{tier}_usd_per_h"] = machine["vcpus"] * core + machine["memory_gb"] * ram + machine["count"] * gpu
            if row["on_demand_usd_per_h"] is not None or row["spot_usd_per_h"] is not None:
                rows.append(row)
        return normalized(
            pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("cloud", "gpu_memory_gb")]), "gcp"
        )

    def sku_prices(self, catalog) -> dict[tuple[str, str, str, str], float]:
        """(part, family or accelerator, region, tier) -> USD per hour of one vCPU, one GiB or one GPU."""
        prices = {}
        for sku in catalog.list_skus(parent=COMPUTE_SERVICE, retry=RETRY):
            tier = TIERS.get(sku.category.usage_type)
            match = _DESCRIPTION.match(sku.description or "")
            if tier is None or match is None:
                continue
            what = match["what"]
            family = re.fullmatch(r"(A2|A3|G2) Instance (Core|Ram)", what)
            if family:
                key = ("core" if family[2] == "Core" else "ram", family[1])
            elif what in GPU_SKUS:
                key = ("gpu", GPU_SKUS[what])
            else:
                continue
            price = unit_price(sku)
            if price is None or price < 0:
                self.skipped["malformed SKU price"] += 1
                continue
            for region in sku.service_regions:
                if region in self.regions:
                    prices[(*key, region, tier)] = price
        return prices

    def gpu_machines(self, machine_types):
        """(zone, machine) for machine types with built-in NVIDIA GPUs we know, in the regions asked."""
        for scope, listing in machine_types.aggregated_list(project=self.project, retry=RETRY):
            zone = scope.rsplit("/", 1)[-1]
            if zone.rsplit("-", 1)[0] not in self.regions:
                continue
            for machine in listing.machine_types:
                if not machine.accelerators:
                    continue
                accelerator = GPU_TYPES.get(machine.accelerators[0].guest_accelerator_type)
                if accelerator is None:
                    self.skipped["unknown accelerator"] += 1
                    continue
                yield (
                    zone,
                    {
                        "name": machine.name,
                        "accelerator": accelerator,
                        "count": sum(a.guest_accelerator_count for a in machine.accelerators),
                        "vcpus": machine.guest_cpus,
                        "memory_gb": machine.memory_mb / 1024,
                    },
                )
