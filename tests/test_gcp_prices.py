"""The GCP adapter: the real google-cloud-billing and google-cloud-compute REST clients, answered with
recorded pages in the published JSON formats at the HTTP layer (`responses`)."""

import json
import re
from datetime import UTC, datetime

import pytest
import responses
from google.auth.credentials import AnonymousCredentials
from google.cloud import billing_v1, compute_v1

from broker.domain.errors import SourceUnavailable
from broker.pricing.gcp import GcpPrices
from broker.pricing.refresh import refresh
from broker.store.prices import PriceHistory

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SKUS = re.compile(r"https://cloudbilling\.googleapis\.com/v1/services/6F81-5844-456A/skus.*")
MACHINES = re.compile(r"https://compute\.googleapis\.com/compute/v1/projects/demo/aggregated/machineTypes.*")


def sku(description: str, usage: str, usd: float, regions=("us-central1", "us-east4"), unit="h") -> dict:
    """One Cloud Billing Catalog SKU as the API publishes it (price = units + nanos)."""
    units, nanos = int(usd), round((usd - int(usd)) * 1e9)
    return {
        "name": f"services/6F81-5844-456A/skus/{abs(hash(description + usage)) % 10**8:08d}",
        "skuId": "0000-0000-0000",
        "description": description,
        "category": {
            "serviceDisplayName": "Compute Engine",
            "resourceFamily": "Compute",
            "resourceGroup": "GPU" if "GPU" in description else "CPU",
            "usageType": usage,
        },
        "serviceRegions": list(regions),
        "serviceProviderName": "Google",
        "pricingInfo": [
            {
                "summary": "",
                "effectiveTime": "2025-11-01T00:00:00Z",
                "currencyConversionRate": 1,
                "pricingExpression": {
                    "usageUnit": unit,
                    "displayQuantity": 1,
                    "usageUnitDescription": "hour",
                    "baseUnit": "s",
                    "baseUnitDescription": "second",
                    "baseUnitConversionFactor": 3600,
                    "tieredRates": [
                        {
                            "startUsageAmount": 0,
                            "unitPrice": {"currencyCode": "USD", "units": str(units), "nanos": nanos},
                        }
                    ],
                },
            }
        ],
    }


PAGES = [
    [
        sku("G2 Instance Core running in Americas", "OnDemand", 0.024988),
        sku("G2 Instance Ram running in Americas", "OnDemand", 0.002927, unit="GiBy.h"),
        sku("Nvidia L4 GPU running in Americas", "OnDemand", 0.56004),
        sku("Commitment v1: G2 Cpu in Americas for 1 Year", "Commit1Yr", 0.01),
    ],
    [
        sku("Spot Preemptible G2 Instance Core running in Americas", "Preemptible", 0.009995),
        sku("Spot Preemptible G2 Instance Ram running in Americas", "Preemptible", 0.001171, unit="GiBy.h"),
        sku("Spot Preemptible Nvidia L4 GPU running in Americas", "Preemptible", 0.224016),
        sku("Nvidia Tesla A100 GPU running in Americas", "OnDemand", 2.933908),
    ],
]


def serve(throttle_first=False):
    calls = {"skus": 0}

    def skus(request):
        calls["skus"] += 1
        if throttle_first and calls["skus"] == 1:
            return (
                429,
                {},
                json.dumps({"error": {"code": 429, "message": "Quota exceeded", "status": "RESOURCE_EXHAUSTED"}}),
            )
        second = "pageToken=p2" in request.url
        body = {"skus": PAGES[1 if second else 0]}
        if not second:
            body["nextPageToken"] = "p2"
        return 200, {}, json.dumps(body)

    def machine(name, cpus, mb, gpu=None, n=1):
        return {
            "kind": "compute#machineType",
            "name": name,
            "guestCpus": cpus,
            "memoryMb": mb,
            **({"accelerators": [{"guestAcceleratorType": gpu, "guestAcceleratorCount": n}]} if gpu else {}),
        }

    responses.add_callback(responses.GET, SKUS, callback=skus)
    responses.add(
        responses.GET,
        MACHINES,
        json={
            "kind": "compute#machineTypeAggregatedList",
            "id": "projects/demo/aggregated/machineTypes",
            "items": {
                "zones/us-central1-a": {
                    "machineTypes": [
                        machine("g2-standard-4", 4, 16384, "nvidia-l4"),
                        machine("g2-standard-24", 24, 98304, "nvidia-l4", 2),
                        machine("n2-standard-2", 2, 8192),
                        machine("a2-highgpu-1g", 12, 87040, "nvidia-tesla-a100"),
                    ]
                },
                "zones/europe-west4-a": {"machineTypes": [machine("g2-standard-4", 4, 16384, "nvidia-l4")]},
                "zones/us-west1-b": {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "no results"}},
            },
        },
    )
    return calls


def source(regions=("us-central1",)):
    anonymous = AnonymousCredentials()
    return GcpPrices(
        list(regions),
        project="demo",
        credentials=anonymous,
        catalog=billing_v1.CloudCatalogClient(credentials=anonymous, transport="rest"),
        machine_types=compute_v1.MachineTypesClient(credentials=anonymous, transport="rest"),
    )


@responses.activate
def test_vm_price_is_host_cores_and_ram_plus_gpus_for_both_tiers_after_a_throttle():
    calls = serve(throttle_first=True)
    src = source()
    rows = src.rows(NOW).set_index("instance_type")
    assert rows.loc["g2-standard-4", "on_demand_usd_per_h"] == pytest.approx(
        4 * 0.024988 + 16 * 0.002927 + 0.56004
    )  # the snapshot: 0.70683
    assert rows.loc["g2-standard-24", "spot_usd_per_h"] == pytest.approx(24 * 0.009995 + 96 * 0.001171 + 2 * 0.224016)
    assert rows.loc["g2-standard-4", "zone"] == "us-central1-a" and rows.loc["g2-standard-4", "accelerator"] == "L4"
    assert (
        "n2-standard-2" not in rows.index and "a2-highgpu-1g" not in rows.index
    )  # no A2 host SKUs recorded: not priced
    assert src.skipped["no on_demand SKU for a part of a2-highgpu-1g"] == 1
    assert calls["skus"] == 3  # one 429, retried, then two pages


def test_without_credentials_the_snapshot_stays_and_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    with pytest.raises(SourceUnavailable, match="gcp: no credentials"):
        GcpPrices(["us-central1"]).check()


@responses.activate
def test_refresh_records_gcp_prices_and_an_error_page_changes_nothing(store):
    history = PriceHistory(store)
    responses.add(
        responses.GET,
        SKUS,
        status=403,
        json={"error": {"code": 403, "message": "Billing API disabled", "status": "PERMISSION_DENIED"}},
    )
    [failed] = refresh([source()], history, {"gcp": {"us-central1"}}, NOW)
    assert failed["status"] == "failed" and "Forbidden" in failed["message"] and history.offers() == []
    responses.reset()
    serve()
    [ok] = refresh([source()], history, {"gcp": {"us-central1"}}, NOW)
    assert ok["status"] == "ok" and ok["recorded"] == 4  # two machine types x two tiers
    assert history.latest()["gcp/us-central1-a/g2-standard-4/spot"][0] == pytest.approx(
        4 * 0.009995 + 16 * 0.001171 + 0.224016
    )
