"""The price catalog: normalized price rows (pandas) and the Offers made from them."""

from __future__ import annotations

import difflib
from functools import cached_property
from pathlib import Path

import pandas as pd

from broker.errors import BrokerError
from broker.model import Offer, Tier
from broker.pricing.hazard import HazardModel
from broker.pricing.snapshot import load_snapshot


class PriceCatalog:
    """One table of GPU instance prices across clouds; each row yields a spot and an on-demand Offer."""

    def __init__(self, rows: pd.DataFrame, hazard: HazardModel | None = None, source: str = "snapshot"):
        self.rows = rows
        self.hazard = hazard or HazardModel.packaged()
        self.source = source

    @classmethod
    def from_snapshot(cls, directory: Path | None = None, hazard: HazardModel | None = None) -> "PriceCatalog":
        """The catalog of the published snapshots (packaged copy unless `directory` is given)."""
        return cls(load_snapshot(directory), hazard, source=f"snapshot:{directory or 'packaged'}")

    @cached_property
    def offers(self) -> list[Offer]:
        """Every on-demand and spot offer with a known price."""
        offers = []
        for row in self.rows.itertuples(index=False):
            shape = dict(
                cloud=row.cloud,
                region=row.region,
                zone=row.zone if isinstance(row.zone, str) else None,
                instance_type=row.instance_type,
                accelerator=row.accelerator,
                accelerator_count=row.accelerator_count,
                gpu_memory_gb=row.gpu_memory_gb,
                vcpus=None if pd.isna(row.vcpus) else row.vcpus,
                memory_gb=None if pd.isna(row.memory_gb) else row.memory_gb,
            )
            if pd.notna(row.on_demand_usd_per_h):
                offers.append(Offer(**shape, tier=Tier.on_demand, price_usd_per_h=row.on_demand_usd_per_h))
            if pd.notna(row.spot_usd_per_h):
                risk = self.hazard.spot(row.cloud, row.region, row.instance_type)
                offers.append(
                    Offer(
                        **shape,
                        tier=Tier.spot,
                        price_usd_per_h=row.spot_usd_per_h,
                        hazard_per_h=risk.per_hour,
                        hazard_source=risk.source,
                        availability=risk.availability,
                    )
                )
        return offers

    @cached_property
    def by_id(self) -> dict[str, Offer]:
        return {o.id: o for o in self.offers}

    def offer(self, offer_id: str) -> Offer:
        """The offer with this id (cloud/zone/instance-type/tier), or a BrokerError naming close ids."""
        if offer_id not in self.by_id:
            close = difflib.get_close_matches(offer_id, list(self.by_id), n=3)
            raise BrokerError(f"offer: unknown offer {offer_id!r}; " + (f"did you mean {', '.join(close)}?" if close else "see `broker prices`"))
        return self.by_id[offer_id]

    def table(
        self,
        gpu: str | None = None,
        cloud: str | None = None,
        region: str | None = None,
        spot_only: bool = False,
    ) -> pd.DataFrame:
        """Price rows filtered for display, cheapest first, with spot savings and hazard band."""
        rows = self.rows
        if gpu:
            rows = rows[rows["accelerator"].str.lower() == gpu.lower()]
        if cloud:
            rows = rows[rows["cloud"] == cloud.lower()]
        if region:
            rows = rows[rows["region"] == region]
        if spot_only:
            rows = rows[rows["spot_usd_per_h"].notna()]
        rows = rows.assign(
            spot_savings_pct=(1 - rows["spot_usd_per_h"] / rows["on_demand_usd_per_h"]) * 100,
            spot_band=[
                self.hazard.spot(c, r, i).band for c, r, i in zip(rows["cloud"], rows["region"], rows["instance_type"])
            ],
        )
        key = "spot_usd_per_h" if spot_only else "on_demand_usd_per_h"
        return rows.sort_values([key, "cloud", "region", "zone"], na_position="last").reset_index(drop=True)
