"""The Azure adapter: the real requests session and azure-mgmt clients, answered with recorded pages in
the published formats (Retail Prices API, resource SKUs, Resource Graph) at the HTTP layer (`responses`)."""

import json
import re
import time
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlsplit

import responses
from azure.core.credentials import AccessToken

from broker.pricing.azure import AzurePrices
from broker.pricing.hazard import HazardModel
from broker.pricing.refresh import refresh
from broker.store.prices import PriceHistory

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
KNOWN = {
    "Standard_NC6s_v3": {"accelerator": "V100", "accelerator_count": 1, "vcpus": 6.0, "memory_gb": 112.0},
    "Standard_NC4as_T4_v3": {"accelerator": "T4", "accelerator_count": 1, "vcpus": 4.0, "memory_gb": 28.0},
}
RETAIL = re.compile(r"https://prices\.azure\.com(:443)?/api/retail/prices.*")  # NextPageLink names the port


def item(
    sku: str, name: str, price: float, product: str = "Virtual Machines NCSv3 Series", unit: str = "1 Hour"
) -> dict:
    """One Retail Prices API item, as the API publishes it."""
    return {
        "currencyCode": "USD",
        "tierMinimumUnits": 0.0,
        "retailPrice": price,
        "unitPrice": price,
        "armRegionName": "eastus",
        "location": "US East",
        "effectiveStartDate": "2025-01-01T00:00:00Z",
        "meterId": f"m-{name}",
        "meterName": name,
        "productId": "DZH318Z0BQPS",
        "skuId": f"DZH318Z0BQPS/{name}",
        "productName": product,
        "skuName": name,
        "serviceName": "Virtual Machines",
        "serviceId": "DZH313Z7MMC8",
        "serviceFamily": "Compute",
        "unitOfMeasure": unit,
        "type": "Consumption",
        "isPrimaryMeterRegion": True,
        "armSkuName": sku,
    }


PAGES = [
    [
        item("Standard_NC6s_v3", "NC6s v3", 3.06),
        item("Standard_NC6s_v3", "NC6s v3 Spot", 0.3672),
        item("Standard_NC6s_v3", "NC6s v3", 4.47, product="Virtual Machines NCSv3 Series Windows"),
    ],
    [
        item("Standard_NC6s_v3", "NC6s v3 Low Priority", 0.612),
        item("Standard_NC4as_T4_v3", "NC4as T4 v3", 0.526, product="NCasT4 v3"),
        item("Standard_NC4as_T4_v3", "NC4as T4 v3 Spot", 0.0526, product="NCasT4 v3"),
        {"armSkuName": "broken"},
    ],
]


def serve_retail(throttle_first: bool = False):
    state = {"calls": 0}

    def answer(request):
        state["calls"] += 1
        if throttle_first and state["calls"] == 1:
            return 429, {"Retry-After": "0"}, json.dumps({"Error": {"Code": "TooManyRequests"}})
        query = parse_qs(urlsplit(request.url).query)
        assert "armRegionName eq 'eastus'" in query.get("$filter", [""])[0]
        page = int(query.get("$skip", ["0"])[0]) // 100
        body = {
            "BillingCurrency": "USD",
            "CustomerEntityId": "Default",
            "CustomerEntityType": "Retail",
            "Items": PAGES[page],
            "Count": len(PAGES[page]),
        }
        if page + 1 < len(PAGES):
            body["NextPageLink"] = (
                "https://prices.azure.com:443/api/retail/prices?$filter=serviceName%20eq%20%27Virtual%20Machines%27%20and%20"
                "priceType%20eq%20%27Consumption%27%20and%20armRegionName%20eq%20%27eastus%27&$skip=100"
            )
        return 200, {}, json.dumps(body)

    responses.add_callback(responses.GET, RETAIL, callback=answer)
    return state


@responses.activate
def test_retail_pages_become_rows_spot_and_pay_as_you_go_linux_only_after_a_throttle():
    state = serve_retail(throttle_first=True)
    source = AzurePrices(["eastus"], KNOWN)
    source.check()
    rows = source.rows(NOW).sort_values("instance_type").reset_index(drop=True)
    assert list(zip(rows.instance_type, rows.on_demand_usd_per_h, rows.spot_usd_per_h)) == [
        ("Standard_NC4as_T4_v3", 0.526, 0.0526),
        ("Standard_NC6s_v3", 3.06, 0.3672),
    ]
    assert rows.zone.isna().all() and list(rows.accelerator) == ["T4", "V100"]
    assert state["calls"] == 3 and source.skipped == {"malformed retail item": 1}
    assert "no credentials" in source.notes[0]


class Token:
    def get_token(self, *scopes, **kwargs):
        return AccessToken("token", int(time.time()) + 3600)


@responses.activate
def test_with_credentials_shapes_come_from_resource_skus_and_bands_from_resource_graph():
    serve_retail()

    def capabilities(gpus, cpus, mem):
        return [{"name": "GPUs", "value": gpus}, {"name": "vCPUs", "value": cpus}, {"name": "MemoryGB", "value": mem}]

    responses.add(
        responses.GET,
        re.compile(r"https://management\.azure\.com/subscriptions/sub-1/providers/Microsoft\.Compute/skus.*"),
        json={
            "value": [
                {
                    "resourceType": "virtualMachines",
                    "name": "Standard_NC6s_v3",
                    "tier": "Standard",
                    "size": "NC6s_v3",
                    "family": "standardNCSv3Family",
                    "locations": ["eastus"],
                    "capabilities": capabilities("1", "6", "112"),
                },
                {
                    "resourceType": "virtualMachines",
                    "name": "Standard_NC4as_T4_v3",
                    "locations": ["eastus"],
                    "capabilities": capabilities("1", "4", "28"),
                },
                {
                    "resourceType": "virtualMachines",
                    "name": "Standard_D2s_v5",
                    "locations": ["eastus"],
                    "capabilities": capabilities("0", "2", "8"),
                },
                {
                    "resourceType": "virtualMachines",
                    "name": "Standard_NG8ads_V620_v1",
                    "locations": ["eastus"],
                    "capabilities": capabilities("1", "8", "16"),
                },
                {"resourceType": "disks", "name": "Premium_LRS", "locations": ["eastus"]},
            ]
        },
    )
    responses.add(
        responses.POST,
        re.compile(r"https://management\.azure\.com/providers/Microsoft\.ResourceGraph/resources.*"),
        json={
            "totalRecords": 2,
            "count": 2,
            "resultTruncated": "false",
            "facets": [],
            "data": [
                {"skuName": "standard_nc6s_v3", "location": "eastus", "evictionRate": "10-15"},
                {"skuName": "standard_nc4as_t4_v3", "location": "eastus", "evictionRate": "0-5"},
            ],
        },
    )
    source = AzurePrices(["eastus"], KNOWN, credential=Token(), subscription_id="sub-1")
    rows = source.rows(NOW)
    assert set(rows.instance_type) == {"Standard_NC6s_v3", "Standard_NC4as_T4_v3"}
    assert source.skipped["GPU size not in the catalog (GPU model unknown)"] == 1
    bands = source.eviction_bands()
    assert bands == {
        ("azure", "eastus", "Standard_NC6s_v3"): "10-15",
        ("azure", "eastus", "Standard_NC4as_T4_v3"): "0-5",
    }
    model = HazardModel.packaged().with_bands(bands)
    v100, t4 = model.spot("azure", "eastus", "Standard_NC6s_v3"), model.spot("azure", "eastus", "Standard_NC4as_T4_v3")
    assert (
        v100.band == "10-15%"
        and t4.band == "<5%"
        and t4.per_hour < v100.per_hour < model.spot("azure", "westus", "Standard_NC6s_v3").per_hour
    )


@responses.activate
def test_an_error_page_fails_the_refresh_and_records_nothing(store):
    history = PriceHistory(store)
    responses.add(
        responses.GET, RETAIL, status=400, json={"Error": {"Code": "InvalidFilter", "Message": "Invalid OData filter"}}
    )
    [report] = refresh([AzurePrices(["eastus"], KNOWN)], history, {"azure": {"eastus"}}, NOW)
    assert report["status"] == "failed" and "400" in report["message"] and history.offers() == []


@responses.activate
def test_a_good_refresh_records_the_prices_and_the_bands_reach_quotes(store):
    serve_retail()
    history = PriceHistory(store)
    [report] = refresh([AzurePrices(["eastus"], KNOWN)], history, {"azure": {"eastus"}}, NOW)
    assert report["status"] == "ok" and report["recorded"] == 4
    assert history.latest()["azure/eastus/Standard_NC6s_v3/spot"] == (0.3672, NOW)


@responses.activate
def test_cli_refresh_without_a_network_says_so_in_one_line_and_fails(redis_url, monkeypatch):
    """Nothing answers (responses refuses every call with requests' multi-line ConnectionError)."""
    from typer.testing import CliRunner

    from broker.app.cli.main import app

    monkeypatch.setenv("BROKER_REDIS_URL", redis_url)
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID", raising=False)
    result = CliRunner().invoke(app, ["prices", "refresh", "--cloud", "azure", "--region", "eastus", "--json"])
    assert result.exit_code == 2 and "prices refresh: azure failed" in result.stderr
    [report] = json.loads(result.stdout)
    assert report["status"] == "failed" and "\n" not in report["message"] and len(report["message"]) < 300
    assert report["message"] == (
        "azure: cannot reach prices.azure.com: check the network (a proxy: HTTPS_PROXY); the previous prices stay"
    )
    shown = CliRunner().invoke(app, ["prices", "refresh", "--cloud", "azure", "--region", "eastus"])
    assert shown.exit_code == 2 and "the previous prices stay" in " ".join(shown.stdout.split())
