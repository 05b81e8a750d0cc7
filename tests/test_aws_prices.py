"""The AWS adapter drives the real boto3 clients: moto for EC2, botocore's Stubber for recorded pages."""

import json
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import boto3
from botocore.stub import ANY, Stubber
from moto import mock_aws

from broker.pricing.aws import RETRIES, AwsPrices
from broker.pricing.refresh import refresh
from broker.store.prices import PriceHistory

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def price_item(itype: str, usd: str) -> str:
    """One PriceList entry in the Pricing API's published JSON shape."""
    return json.dumps(
        {
            "product": {
                "productFamily": "Compute Instance",
                "sku": f"SKU{itype}",
                "attributes": {
                    "instanceType": itype,
                    "regionCode": "us-east-1",
                    "operatingSystem": "Linux",
                    "tenancy": "Shared",
                    "preInstalledSw": "NA",
                    "capacitystatus": "Used",
                },
            },
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    f"SKU{itype}.JRTCKXETXF": {
                        "priceDimensions": {
                            f"SKU{itype}.JRTCKXETXF.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "pricePerUnit": {"USD": usd},
                                "description": f"${usd} per On Demand Linux {itype} Instance Hour",
                            }
                        },
                        "sku": f"SKU{itype}",
                        "effectiveDate": "2025-11-01T00:00:00Z",
                    }
                }
            },
            "version": "20251101",
            "publicationDate": "2025-11-01T00:00:00Z",
        }
    )


def stubbed_pricing(pages):
    client = boto3.client("pricing", region_name="us-east-1", **KEYS)
    stub = Stubber(client)
    for k, items in enumerate(pages):
        response = {"FormatVersion": "aws_v1", "PriceList": items}
        if k < len(pages) - 1:
            response["NextToken"] = f"page{k + 1}"
        stub.add_response(
            "get_products",
            response,
            {"ServiceCode": "AmazonEC2", "Filters": ANY, **({"NextToken": f"page{k}"} if k else {})},
        )
    stub.activate()
    return client


def stubbed_ec2():
    """Recorded EC2 pages: two pages of instance types, the zone map, two pages of spot prices."""
    client = boto3.client("ec2", region_name="us-east-1", **KEYS)
    stub = Stubber(client)

    def gpu(name, n, mib):
        return {"Gpus": [{"Name": name, "Manufacturer": "NVIDIA", "Count": n, "MemoryInfo": {"SizeInMiB": mib}}]}

    stub.add_response(
        "describe_instance_types",
        {
            "InstanceTypes": [
                {
                    "InstanceType": "p3.2xlarge",
                    "VCpuInfo": {"DefaultVCpus": 8},
                    "MemoryInfo": {"SizeInMiB": 62464},
                    "GpuInfo": gpu("V100", 1, 16384),
                },
                {"InstanceType": "m5.large", "VCpuInfo": {"DefaultVCpus": 2}, "MemoryInfo": {"SizeInMiB": 8192}},
            ],
            "NextToken": "t1",
        },
        {},
    )
    stub.add_response(
        "describe_instance_types",
        {
            "InstanceTypes": [
                {
                    "InstanceType": "g6.xlarge",
                    "VCpuInfo": {"DefaultVCpus": 4},
                    "MemoryInfo": {"SizeInMiB": 16384},
                    "GpuInfo": gpu("L4", 1, 22888),
                },
                {
                    "InstanceType": "g4ad.xlarge",
                    "VCpuInfo": {"DefaultVCpus": 4},
                    "MemoryInfo": {"SizeInMiB": 16384},
                    "GpuInfo": {"Gpus": [{"Name": "Radeon Pro V520", "Manufacturer": "AMD", "Count": 1}]},
                },
            ]
        },
        {"NextToken": "t1"},
    )
    stub.add_response(
        "describe_availability_zones",
        {
            "AvailabilityZones": [
                {"ZoneName": "us-east-1a", "ZoneId": "use1-az6", "RegionName": "us-east-1", "State": "available"},
                {"ZoneName": "us-east-1b", "ZoneId": "use1-az1", "RegionName": "us-east-1", "State": "available"},
            ]
        },
        {},
    )

    def spot(zone, itype, usd, minutes):
        return {
            "AvailabilityZone": zone,
            "InstanceType": itype,
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": usd,
            "Timestamp": NOW - timedelta(minutes=minutes),
        }

    params = {
        "InstanceTypes": ["g6.xlarge", "p3.2xlarge"],
        "ProductDescriptions": ["Linux/UNIX"],
        "StartTime": NOW,
        "EndTime": NOW,
    }
    stub.add_response(
        "describe_spot_price_history",
        {
            "SpotPriceHistory": [
                spot("us-east-1a", "p3.2xlarge", "0.9180", 30),
                spot("us-east-1a", "p3.2xlarge", "0.9300", 90),  # the newest wins
                spot("us-east-1b", "g6.xlarge", "0.3212", 10),
            ],
            "NextToken": "s1",
        },
        params,
    )
    stub.add_response(
        "describe_spot_price_history",
        {
            "SpotPriceHistory": [
                spot("us-east-1b", "p3.2xlarge", "45.0", 5),  # > 10x on-demand: absurd, skipped
                spot("us-east-1z", "g6.xlarge", "0.30", 5),
            ]
        },
        {**params, "NextToken": "s1"},
    )  # an unknown zone: malformed
    stub.activate()
    return client


def test_recorded_pages_become_catalog_rows_by_zone_id():
    pricing = stubbed_pricing(
        [[price_item("p3.2xlarge", "3.0600000000")], [price_item("g6.xlarge", "0.8048000000"), '{"broken": true}']]
    )
    ec2 = stubbed_ec2()
    source = AwsPrices(["us-east-1"], client=lambda service, region: {"ec2": ec2, "pricing": pricing}[service])
    rows = source.rows(NOW).sort_values("instance_type").reset_index(drop=True)
    assert list(zip(rows.zone, rows.instance_type, rows.spot_usd_per_h, rows.on_demand_usd_per_h)) == [
        ("use1-az1", "g6.xlarge", 0.3212, 0.8048),
        ("use1-az6", "p3.2xlarge", 0.918, 3.06),
    ]
    assert list(rows.accelerator) == ["L4", "V100"] and rows.gpu_memory_gb.tolist() == [24, 16]
    assert source.skipped == {"absurd spot price": 1, "malformed spot record": 1, "malformed price list item": 1}


def test_moto_ec2_and_recorded_pricing_pages_through_the_real_clients():
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1", **KEYS)
        pricing = stubbed_pricing([[price_item("g5.xlarge", "1.006")]])
        source = AwsPrices(["us-east-1"], client=lambda service, region: {"ec2": ec2, "pricing": pricing}[service])
        rows = source.rows(NOW)
    assert {"g4dn.xlarge", "g5.xlarge"} <= set(rows.instance_type)  # moto's instance type data, NVIDIA only
    assert not rows.instance_type.str.startswith(("m5", "g4ad")).any()
    assert set(rows.accelerator) <= {
        "T4",
        "A10G",
        "V100",
        "A100",
        "A100-80GB",
        "L4",
        "L40S",
        "H100",
        "H200",
        "T4g",
        "V100-32GB",
        "M60",
        "K80",
    }
    assert rows.zone.str.startswith("use1-az").all()
    assert rows.loc[rows.instance_type == "g5.xlarge", "on_demand_usd_per_h"].eq(1.006).all()


def test_without_credentials_the_snapshot_stays_and_says_so(store, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    [report] = refresh([AwsPrices(["us-east-1"])], PriceHistory(store), {"aws": {"us-east-1"}}, NOW)
    assert report["status"] == "unavailable" and "no credentials" in report["message"] and report["recorded"] == 0
    assert PriceHistory(store).offers() == []


class Failing:
    cloud = "aws"

    def check(self):
        pass

    def rows(self, now):
        raise ConnectionError("endpoint unreachable")


def test_a_failed_refresh_keeps_the_previous_prices_and_a_good_one_skips_bad_rows(store):
    history = PriceHistory(store)
    pricing = stubbed_pricing([[price_item("p3.2xlarge", "3.06"), price_item("g6.xlarge", "0.8048")]])
    ec2 = stubbed_ec2()
    good = AwsPrices(
        ["us-east-1"],
        session=boto3.Session(**KEYS),
        client=lambda service, region: {"ec2": ec2, "pricing": pricing}[service],
    )
    [ok] = refresh([good], history, {"aws": {"us-east-1"}}, NOW)
    assert ok["status"] == "ok" and ok["recorded"] == 4 and ok["skipped"]["absurd spot price"] == 1
    before = history.latest()
    asked = []
    reports = refresh([Failing(), Failing()], history, {"aws": {"us-east-1"}}, NOW + timedelta(hours=1), asked.append)
    assert [r["status"] for r in reports] == ["failed", "failed"] and "previous prices stay" in reports[0]["message"]
    assert history.latest() == before and history.refreshed()["aws"] == NOW
    assert asked == ["aws", "aws"]  # the progress bar hears of each source before it is asked


def test_rows_from_unknown_regions_are_skipped_and_counted():
    from collections import Counter

    import pandas as pd

    from broker.pricing.refresh import check_rows

    rows = pd.DataFrame(
        {
            "region": ["us-east-1", "mars-1", "us-east-1"],
            "on_demand_usd_per_h": [3.0, 3.0, -1.0],
            "spot_usd_per_h": [0.9, 0.9, 0.5],
        }
    )
    skipped = Counter()
    assert len(check_rows(rows, {"us-east-1"}, skipped)) == 1
    assert skipped == {"unknown region": 1, "price out of range": 1}


ZONES_XML = b"""<?xml version="1.0" encoding="UTF-8"?>
<DescribeAvailabilityZonesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>r1</requestId>
<availabilityZoneInfo><item><zoneName>us-east-1a</zoneName><zoneId>use1-az6</zoneId><zoneState>available</zoneState>
<regionName>us-east-1</regionName></item></availabilityZoneInfo></DescribeAvailabilityZonesResponse>"""
THROTTLED_XML = b"""<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors>
<RequestID>r0</RequestID></Response>"""


def test_throttling_is_retried_adaptively_against_a_real_http_endpoint():
    calls = []

    class EC2(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            calls.append(self.path)
            throttled = len(calls) <= 2
            self.send_response(503 if throttled else 200)
            self.send_header("Content-Type", "text/xml")
            self.end_headers()
            self.wfile.write(THROTTLED_XML if throttled else ZONES_XML)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), EC2)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        session = boto3.Session(**KEYS)
        source = AwsPrices(
            ["us-east-1"],
            session=session,
            client=lambda service, region: session.client(
                service, region_name=region, config=RETRIES, endpoint_url=f"http://127.0.0.1:{server.server_port}"
            ),
        )
        assert source.zone_ids(source._client("ec2", "us-east-1")) == {"us-east-1a": "use1-az6"}
        assert len(calls) == 3  # two throttled answers, retried, then the page
    finally:
        server.shutdown()
