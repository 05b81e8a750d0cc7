"""Where a job may run (its clouds, regions, zones and exclusions) and what its input costs to move: a job whose
input lives in one cloud region pays to read it from anywhere else.

The rates are the clouds' published list prices per GB leaving the source (first pricing tier, 2025): to another
region of the same cloud, or out to the internet (another cloud). Inter-continental copies cost more on some
routes; these are the common rates, and the input is counted once per job (a restart in the same region reads the
copy it made).
"""

from __future__ import annotations

import difflib

from broker.domain.jobspec import JobSpec
from broker.domain.offer import Offer

INTER_REGION_USD_PER_GB = {"aws": 0.02, "gcp": 0.02, "azure": 0.02}
INTERNET_USD_PER_GB = {"aws": 0.09, "gcp": 0.12, "azure": 0.087}


def transfer_usd(spec: JobSpec, offer: Offer) -> float:
    """What moving the job's input to the offer costs: nothing in its own region, else size x the route's rate."""
    data = spec.data
    if data is None or (offer.cloud == data.cloud and offer.region == data.region):
        return 0.0
    rates = INTER_REGION_USD_PER_GB if offer.cloud == data.cloud else INTERNET_USD_PER_GB
    return data.size_gb * rates[data.cloud]


def placed(spec: JobSpec, offer: Offer) -> bool:
    """Whether the offer is where the job may run: in one of its clouds, regions and zones (when it names any) and
    in none it excludes."""
    r = spec.resources
    if r.cloud and offer.cloud not in r.cloud:
        return False
    if r.region and offer.region not in r.region:
        return False
    if r.zone and offer.zone not in r.zone:
        return False
    return not {offer.cloud, offer.region, offer.zone} & set(r.exclude)


def unknown_exclusions(spec: JobSpec, offers: list[Offer]) -> str | None:
    """Why the job's `exclude` names a place no offer is in (a typo would leave the place it meant allowed), with the
    nearest names; None when every name is a cloud, region or zone of some offer."""
    if not spec.resources.exclude:
        return None
    known = {place for o in offers for place in (o.cloud, o.region, o.zone) if place}
    unknown = [name for name in spec.resources.exclude if name not in known]
    if not unknown:
        return None
    close = difflib.get_close_matches(unknown[0], sorted(known), n=3)
    hint = f"did you mean {', '.join(close)}?" if close else "`broker prices` names the regions and zones"
    return f"resources.exclude: {', '.join(unknown)} is no cloud, region or zone of any offer; {hint}"


def data_region_note(spec: JobSpec, offers: list[Offer]) -> str | None:
    """A note when the job's input is in a region where no offer of its cloud is: every offer then pays to move it,
    as a typo would have them do (a region with no GPU offer is real too, so this is a note, not a refusal)."""
    data = spec.data
    regions = sorted({o.region for o in offers if o.cloud == getattr(data, "cloud", None) and o.region})
    if data is None or data.region in regions:
        return None
    close = difflib.get_close_matches(data.region, regions, n=2, cutoff=0.8)  # westeurope is not westus
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    return (
        f"data.region: no {data.cloud} offer is in {data.region}{hint}, so every offer pays to move its "
        f"{data.size_gb:g} GB from there"
    )


def where(spec: JobSpec) -> str:
    """The job's placement in words ("" when it has none), for messages."""
    r = spec.resources
    parts = [
        f"{name} {', '.join(values)}"
        for name, values in (("cloud", r.cloud), ("region", r.region), ("zone", r.zone))
        if values
    ]
    if r.exclude:
        parts.append(f"not in {', '.join(r.exclude)}")
    return "; ".join(parts)
