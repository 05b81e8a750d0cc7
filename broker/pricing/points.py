"""Price points (offer, usd, at) from what the clouds publish: catalog rows and AWS's spot price export.

broker/store/prices.py records them (only changes) in Redis.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pandas as pd

from broker.domain.model import Tier
from broker.domain.offer import offer_id


def points_from_rows(rows: pd.DataFrame, at: datetime) -> pd.DataFrame:
    """Catalog rows (snapshot COLUMNS) -> price points (offer, usd, at) for both tiers."""
    where = rows["zone"].where(rows["zone"].notna(), rows["region"])
    parts = []
    for tier, column in ((Tier.on_demand, "on_demand_usd_per_h"), (Tier.spot, "spot_usd_per_h")):
        priced = rows[column].notna()
        ids = [
            offer_id(c, w, i, tier)
            for c, w, i in zip(rows["cloud"][priced], where[priced], rows["instance_type"][priced])
        ]
        parts.append(pd.DataFrame({"offer": ids, "usd": rows[column][priced].astype(float), "at": at}))
    return pd.concat(parts, ignore_index=True)


def points_from_spot_tsv(path: Path) -> pd.DataFrame:
    """AWS's spot price history export (az_id, instance type, product, usd, timestamp): Linux/UNIX rows as points."""
    raw = pd.read_csv(path, sep="\t", header=None, names=["az", "instance_type", "product", "usd", "at"])
    raw = raw[raw["product"] == "Linux/UNIX"]
    ids = [offer_id("aws", az, itype, Tier.spot) for az, itype in zip(raw["az"], raw["instance_type"])]
    return pd.DataFrame({"offer": ids, "usd": raw["usd"].astype(float), "at": pd.to_datetime(raw["at"], utc=True)})
