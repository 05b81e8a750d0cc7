"""`broker prices refresh`: ask the live sources, check what they say, record the changes.

A source without credentials says so in one line and changes nothing; a source that fails
midway records nothing (its rows are gathered first, then written); rows from regions the
catalog does not know, or with prices out of range, are skipped and counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime
from urllib.parse import urlsplit

import pandas as pd

from broker.domain.errors import SourceUnavailable
from broker.pricing.points import points_from_rows
from broker.store.prices import PriceHistory


def check_rows(rows: pd.DataFrame, known_regions: set[str], skipped: Counter) -> pd.DataFrame:
    """Drop rows a price table must not hold: unknown regions, non-positive or absurd prices (> 10x on-demand)."""
    unknown = ~rows["region"].isin(known_regions)
    skipped["unknown region"] += int(unknown.sum())
    od, spot = rows["on_demand_usd_per_h"], rows["spot_usd_per_h"]
    bad = (od.notna() & (od <= 0)) | (spot.notna() & (spot <= 0)) | (od.notna() & spot.notna() & (spot > 10 * od))
    skipped["price out of range"] += int((bad & ~unknown).sum())
    return rows[~unknown & ~bad]


def one_line(error: Exception, limit: int = 240) -> str:
    """An SDK's error in one line (requests' ConnectionError spans three, with the pool's repr)."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def failure(error: Exception) -> str:
    """What went wrong, in one line: a host that did not answer is named (requests' error is the pool's repr)."""
    import requests

    request = getattr(error, "request", None)
    if isinstance(error, requests.ConnectionError) and request is not None and request.url:
        return f"cannot reach {urlsplit(request.url).hostname}: check the network (a proxy: HTTPS_PROXY)"
    return f"{type(error).__name__}: {one_line(error)}"


def refresh(
    sources: list,
    history: PriceHistory,
    known_regions: dict[str, set[str]],
    now: datetime,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """Refresh each source; one report per source: status, rows, changes recorded, what was skipped and why.
    `progress(cloud)` is called before each source is asked (a cloud's catalog takes seconds to minutes)."""
    reports = []
    for source in sources:
        if progress:
            progress(source.cloud)
        report = {"source": source.cloud, "status": "ok", "rows": 0, "recorded": 0, "skipped": {}, "message": ""}
        try:
            source.check()
            rows = source.rows(now)
            bands = source.eviction_bands() if hasattr(source, "eviction_bands") else {}
        except SourceUnavailable as err:
            report.update(status="unavailable", message=str(err))
        except Exception as err:  # network, API errors, malformed pages: the previous prices stay
            report.update(
                status="failed",
                message=f"{source.cloud}: {failure(err)}; the previous prices stay",
            )
        else:
            skipped = Counter(getattr(source, "skipped", {}))
            rows = check_rows(rows, known_regions.get(source.cloud, set()), skipped)
            report.update(
                rows=len(rows),
                recorded=history.record(points_from_rows(rows, now)) if len(rows) else 0,
                skipped={k: v for k, v in skipped.items() if v},
                bands=len(bands),
                message="; ".join(getattr(source, "notes", [])),
            )
            history.record_bands(bands)
            history.mark_refreshed(source.cloud, now)
        reports.append(report)
    return reports
