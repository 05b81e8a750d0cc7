"""The price catalog: normalized price rows (pandas) and the Offers made from them."""

from __future__ import annotations

import difflib
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path

import pandas as pd

from broker.domain.errors import BrokerError
from broker.domain.model import Tier
from broker.domain.offer import Offer, offer_id
from broker.pricing.hazard import HazardModel
from broker.pricing.snapshot import load_snapshot


class PriceCatalog:
    """One table of GPU instance prices across clouds; each row yields a spot and an on-demand Offer."""

    # The snapshots' own dates are not known (SOURCE.md): say which catalog they are. Their AWS
    # prices predate AWS's mid-2025 P4/P5 price cut, so a recorded price counts as newer than the
    # snapshot only from this date on; older history (the 2022 spot export) is shown, not used.
    snapshot_note = "SkyPilot catalog v7/v6, date unknown"
    snapshot_superseded_from = datetime(2025, 6, 1, tzinfo=UTC)

    def __init__(self, rows: pd.DataFrame, hazard: HazardModel | None = None, source: str = "snapshot"):
        self.rows = rows
        self.hazard = hazard or HazardModel.packaged()
        self.source = source

    @classmethod
    def from_snapshot(cls, directory: Path | None = None, hazard: HazardModel | None = None) -> PriceCatalog:
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

    def with_history(self, latest: dict) -> PriceCatalog:
        """This catalog with every price that has a recorded history replaced by its newest point.

        `latest` maps offer id -> (usd, seen at), as PriceHistory.latest() gives it; rows keep
        `price_as_of`, the time of their newest live price (empty for snapshot prices)."""
        latest = {k: v for k, v in latest.items() if v[1] >= self.snapshot_superseded_from}
        rows = self.rows.copy()
        rows["price_as_of"] = pd.Series([pd.NaT] * len(rows), dtype="datetime64[ns, UTC]")
        where = rows["zone"].where(rows["zone"].notna(), rows["region"])
        for tier, column in ((Tier.on_demand, "on_demand_usd_per_h"), (Tier.spot, "spot_usd_per_h")):
            found = [
                latest.get(offer_id(c, w, i, tier)) for c, w, i in zip(rows["cloud"], where, rows["instance_type"])
            ]
            hit = pd.Series([f is not None for f in found], index=rows.index)
            if hit.any():
                rows.loc[hit, column] = [f[0] for f in found if f is not None]
                seen = pd.Series([pd.Timestamp(f[1]) for f in found if f is not None], index=rows.index[hit])
                rows.loc[hit, "price_as_of"] = rows.loc[hit, "price_as_of"].combine(
                    seen, lambda a, b: b if pd.isna(a) else max(a, b)
                )
        return PriceCatalog(rows, self.hazard, source=f"{self.source}+history")

    @cached_property
    def by_id(self) -> dict[str, Offer]:
        return {o.id: o for o in self.offers}

    def offer(self, offer_id: str) -> Offer:
        """The offer with this id (cloud/zone/instance-type/tier), or a BrokerError naming close ids."""
        if offer_id not in self.by_id:
            close = difflib.get_close_matches(offer_id, list(self.by_id), n=3)
            raise BrokerError(
                f"offer: unknown offer {offer_id!r}; "
                + (
                    f"did you mean {', '.join(close)}?"
                    if close
                    else f"an id is cloud/zone/instance/tier, e.g. {next(iter(self.by_id))} "
                    "(`broker prices --json` names each)"
                )
            )
        return self.by_id[offer_id]

    def table(
        self,
        gpu: str | None = None,
        cloud: str | None = None,
        region: str | None = None,
        spot_only: bool = False,
        count: int | None = None,
    ) -> pd.DataFrame:
        """Price rows filtered for display, cheapest first, with spot savings and hazard band; `count`: that many
        accelerators on one instance."""
        rows = self.rows
        if gpu:
            rows = rows[rows["accelerator"].str.lower() == gpu.lower()]
        if count is not None:
            rows = rows[rows["accelerator_count"] == count]
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
        as_of = rows["price_as_of"] if "price_as_of" in rows else pd.Series(pd.NaT, index=rows.index)
        rows = rows.assign(
            as_of=[f"live {t.isoformat()}" if pd.notna(t) else f"snapshot ({self.snapshot_note})" for t in as_of]
        )
        key = "spot_usd_per_h" if spot_only else "on_demand_usd_per_h"
        return rows.sort_values([key, "cloud", "region", "zone"], na_position="last").reset_index(drop=True)
