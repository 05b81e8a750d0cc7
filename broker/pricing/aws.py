"""Live AWS GPU prices through boto3, as rows in the snapshot's COLUMNS.

- GPU instance types: `describe_instance_types` (paginated), NVIDIA GPUs only;
- zone names -> zone IDs: `describe_availability_zones` (the mapping differs per account, and
  the catalog and history key AWS offers by zone ID);
- spot: `describe_spot_price_history` (paginated) for Linux/UNIX with StartTime = now, which
  returns the price in effect at that moment for every zone and type;
- on-demand: the Pricing API's `get_products` (paginated; served from us-east-1), Linux,
  shared tenancy, no pre-installed software, capacity status Used.
Throttling is retried by botocore's adaptive mode. Credentials come from boto3's own chain.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime

import boto3
import pandas as pd
from botocore.config import Config

from broker.domain.accelerators import lookup
from broker.domain.errors import SourceUnavailable, SpecError
from broker.pricing.snapshot import COLUMNS, normalized

RETRIES = Config(retries={"mode": "adaptive", "max_attempts": 8})
PRICING_REGION = "us-east-1"
TYPES_PER_CALL = 100  # describe_spot_price_history accepts a list of types; keep each call modest


class AwsPrices:
    """Spot and on-demand prices of GPU instances in the given regions."""

    cloud = "aws"

    def __init__(self, regions: list[str], session: boto3.Session | None = None, client=None):
        self.regions = regions
        self.session = session or boto3.Session()
        self._client = client or (
            lambda service, region: self.session.client(service, region_name=region, config=RETRIES)
        )
        self.skipped: Counter[str] = Counter()  # why rows were dropped, for the refresh report

    def check(self) -> None:
        """Raise SourceUnavailable (one line) when boto3 finds no credentials."""
        if self.session.get_credentials() is None:
            raise SourceUnavailable(
                "aws: no credentials in boto3's chain (env, ~/.aws, instance role); keeping the snapshot prices"
            )

    def rows(self, now: datetime | None = None) -> pd.DataFrame:
        """Current prices of every NVIDIA GPU instance type in every zone of the regions."""
        now = now or datetime.now(UTC)
        frames = []
        for region in self.regions:
            ec2 = self._client("ec2", region)
            types = self.gpu_types(ec2)
            if not types:
                continue
            zones = self.zone_ids(ec2)
            spot = self.spot_prices(ec2, sorted(types), zones, now)
            on_demand = self.on_demand(region, sorted(types))
            frames.append(self._join(region, types, spot, on_demand))
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)

    def gpu_types(self, ec2) -> dict[str, dict]:
        """Instance type -> accelerator, count, vCPUs, memory for types with NVIDIA GPUs we know."""
        types = {}
        for page in ec2.get_paginator("describe_instance_types").paginate():
            for info in page.get("InstanceTypes", []):
                gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
                if not gpus or gpus[0].get("Manufacturer") != "NVIDIA":
                    continue
                try:
                    accelerator = lookup(gpus[0]["Name"]).name
                except SpecError:
                    self.skipped["unknown accelerator"] += 1
                    continue
                types[info["InstanceType"]] = {
                    "accelerator": accelerator,
                    "accelerator_count": sum(int(g.get("Count", 0)) for g in gpus),
                    "vcpus": info.get("VCpuInfo", {}).get("DefaultVCpus"),
                    "memory_gb": info.get("MemoryInfo", {}).get("SizeInMiB", 0) / 1024,
                }
        return types

    def zone_ids(self, ec2) -> dict[str, str]:
        return {z["ZoneName"]: z["ZoneId"] for z in ec2.describe_availability_zones().get("AvailabilityZones", [])}

    def spot_prices(self, ec2, types: list[str], zones: dict[str, str], now: datetime) -> dict[tuple[str, str], float]:
        """(zone ID, type) -> the Linux/UNIX spot price in effect now (the newest record per pair)."""
        newest: dict[tuple[str, str], tuple[datetime, float]] = {}
        for start in range(0, len(types), TYPES_PER_CALL):
            pages = ec2.get_paginator("describe_spot_price_history").paginate(
                InstanceTypes=types[start : start + TYPES_PER_CALL],
                ProductDescriptions=["Linux/UNIX"],
                StartTime=now,
                EndTime=now,
            )
            for page in pages:
                for record in page.get("SpotPriceHistory", []):
                    try:
                        key = (zones[record["AvailabilityZone"]], record["InstanceType"])
                        price, at = float(record["SpotPrice"]), record["Timestamp"]
                    except (KeyError, TypeError, ValueError):
                        self.skipped["malformed spot record"] += 1
                        continue
                    if key not in newest or at > newest[key][0]:
                        newest[key] = (at, price)
        return {key: price for key, (_, price) in newest.items()}

    def on_demand(self, region: str, types: list[str]) -> dict[str, float]:
        """Type -> the Linux on-demand price in the region, from the Pricing API."""
        pricing = self._client("pricing", PRICING_REGION)
        filters = [
            {"Type": "TERM_MATCH", "Field": f, "Value": v}
            for f, v in (
                ("regionCode", region),
                ("operatingSystem", "Linux"),
                ("tenancy", "Shared"),
                ("preInstalledSw", "NA"),
                ("capacitystatus", "Used"),
            )
        ]
        prices = {}
        for page in pricing.get_paginator("get_products").paginate(ServiceCode="AmazonEC2", Filters=filters):
            for item in page.get("PriceList", []):
                try:
                    product = json.loads(item) if isinstance(item, str) else item
                    itype = product["product"]["attributes"]["instanceType"]
                    dimensions = [
                        d for term in product["terms"]["OnDemand"].values() for d in term["priceDimensions"].values()
                    ]
                    usd = float(dimensions[0]["pricePerUnit"]["USD"])
                except (KeyError, IndexError, TypeError, ValueError):
                    self.skipped["malformed price list item"] += 1
                    continue
                if itype in types and usd > 0:
                    prices[itype] = usd
        return prices

    def _join(self, region: str, types: dict, spot: dict, on_demand: dict) -> pd.DataFrame:
        rows = []
        for (zone, itype), price in spot.items():
            if itype not in types:
                continue
            od = on_demand.get(itype)
            if price <= 0 or (od and price > 10 * od):
                self.skipped["absurd spot price"] += 1
                continue
            rows.append(
                {
                    "region": region,
                    "zone": zone,
                    "instance_type": itype,
                    **types[itype],
                    "on_demand_usd_per_h": od,
                    "spot_usd_per_h": price,
                }
            )
        return normalized(
            pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("cloud", "gpu_memory_gb")]), "aws"
        )
