"""Live Azure GPU prices, as rows in the snapshot's COLUMNS, and spot eviction-rate bands.

- Prices: the public Retail Prices API (no credentials), Linux consumption rows of Virtual
  Machines per region, paged by `NextPageLink`; spot rows carry " Spot" in skuName/meterName,
  Windows and Low Priority rows are left out. HTTP 429 is retried after its Retry-After.
- GPU shapes: azure-mgmt-compute's resource SKUs (vCPUs, MemoryGB, GPUs) when credentials and
  a subscription are there; the accelerator model comes from the catalog's known Azure types
  (the SKU API gives a GPU count, not a GPU name). Without credentials, the catalog's shapes.
- Eviction bands: Resource Graph `SpotResources`, type microsoft.compute/skuspotevictionrate/location.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from datetime import datetime

import pandas as pd
import requests

from broker.pricing.snapshot import COLUMNS, normalized

RETAIL_URL = "https://prices.azure.com/api/retail/prices"
RETAIL_FILTER = "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and armRegionName eq '{region}'"
EVICTION_QUERY = (
    "SpotResources | where type =~ 'microsoft.compute/skuspotevictionrate/location' "
    "| project skuName = tostring(sku.name), location, evictionRate = tostring(properties.evictionRate)"
)
MAX_PAGES = 500
THROTTLE_TRIES = 5


class AzurePrices:
    """Spot and pay-as-you-go prices of Azure GPU VM sizes in the given regions."""

    cloud = "azure"

    def __init__(
        self,
        regions: list[str],
        known_types: dict[str, dict],
        credential=None,
        subscription_id: str | None = None,
        retail_url: str = RETAIL_URL,
        arm_url: str | None = None,
        http: requests.Session | None = None,
    ):
        self.regions = regions
        self.known_types = known_types  # VM size -> accelerator, accelerator_count, vcpus, memory_gb (from the catalog)
        self.credential, self.subscription_id = credential, subscription_id or os.environ.get("AZURE_SUBSCRIPTION_ID")
        self.retail_url, self.arm_url = retail_url, arm_url
        self.http = http or requests.Session()
        self.skipped: Counter[str] = Counter()
        self.notes: list[str] = []

    def check(self) -> None:
        """Prices need no credentials; say what is missing without them."""
        if self.credential is None or not self.subscription_id:
            self.notes.append(
                "azure: no credentials or AZURE_SUBSCRIPTION_ID: GPU shapes from the catalog, no eviction bands"
            )

    def rows(self, now: datetime | None = None) -> pd.DataFrame:
        frames = []
        for region in self.regions:
            shapes = self.shapes(region)
            od, spot = self.retail(region)
            rows = [
                {
                    "region": region,
                    "zone": None,
                    "instance_type": sku,
                    **shape,
                    "on_demand_usd_per_h": od.get(sku),
                    "spot_usd_per_h": spot.get(sku),
                }
                for sku, shape in shapes.items()
                if sku in od or sku in spot
            ]
            frames.append(pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("cloud", "gpu_memory_gb")]))
        frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
        return normalized(frame, "azure")

    def retail(self, region: str) -> tuple[dict[str, float], dict[str, float]]:
        """(pay-as-you-go, spot) price per VM size in a region, Linux only."""
        od, spot = {}, {}
        url, params = self.retail_url, {"$filter": RETAIL_FILTER.format(region=region)}
        for _ in range(MAX_PAGES):
            page = self._get_json(url, params)
            for item in page.get("Items", []):
                try:
                    sku, price = item["armSkuName"], float(item["retailPrice"])
                    names = f"{item['skuName']} {item['meterName']}"
                    windows = "Windows" in item.get("productName", "")
                except (KeyError, TypeError, ValueError):
                    self.skipped["malformed retail item"] += 1
                    continue
                if windows or "Low Priority" in names or item.get("unitOfMeasure") != "1 Hour":
                    continue
                (spot if " Spot" in names else od)[sku] = price
            url, params = page.get("NextPageLink"), None
            if not url:
                break
        return od, spot

    def _get_json(self, url: str, params: dict | None) -> dict:
        for attempt in range(THROTTLE_TRIES):
            response = self.http.get(url, params=params, timeout=30)
            if response.status_code != 429:
                break
            time.sleep(min(float(response.headers.get("Retry-After", 2**attempt)), 30))
        response.raise_for_status()  # an error page fails the refresh: nothing is recorded
        body = response.json()
        if not isinstance(body, dict) or not isinstance(body.get("Items"), list):
            raise ValueError(f"azure retail prices: unexpected page at {url}")
        return body

    def shapes(self, region: str) -> dict[str, dict]:
        """VM size -> shape: from resource SKUs with credentials, else the catalog's known sizes."""
        if self.credential is None or not self.subscription_id:
            return dict(self.known_types)
        from azure.mgmt.compute import ComputeManagementClient

        client = ComputeManagementClient(
            self.credential, self.subscription_id, **({"base_url": self.arm_url} if self.arm_url else {})
        )
        shapes = {}
        for sku in client.resource_skus.list(filter=f"location eq '{region}'"):
            caps = {c.name: c.value for c in (sku.capabilities or [])}
            if sku.resource_type != "virtualMachines" or int(float(caps.get("GPUs", 0) or 0)) == 0:
                continue
            known = self.known_types.get(sku.name)
            if known is None:
                self.skipped["GPU size not in the catalog (GPU model unknown)"] += 1
                continue
            shapes[sku.name] = {
                **known,
                "accelerator_count": int(float(caps["GPUs"])),
                "vcpus": float(caps.get("vCPUs", known["vcpus"])),
                "memory_gb": float(caps.get("MemoryGB", known["memory_gb"])),
            }
        return shapes

    def eviction_bands(self) -> dict[tuple[str, str, str], str]:
        """(cloud, region, VM size) -> eviction band label ("0-5" ... "20+") from Resource Graph."""
        if self.credential is None or not self.subscription_id:
            return {}
        from azure.mgmt.resourcegraph import ResourceGraphClient
        from azure.mgmt.resourcegraph.models import QueryRequest

        client = ResourceGraphClient(self.credential, **({"base_url": self.arm_url} if self.arm_url else {}))
        result = client.resources(QueryRequest(subscriptions=[self.subscription_id], query=EVICTION_QUERY))
        bands = {}
        sizes = {name.lower(): name for name in self.known_types}
        for row in result.data or []:
            size = sizes.get(str(row.get("skuName", "")).lower())
            if size and row.get("evictionRate"):
                bands[("azure", row["location"], size)] = str(row["evictionRate"])
        return bands
