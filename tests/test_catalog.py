"""The price catalog: the published snapshots turned into Offers by each cloud's rule."""

import csv
import filecmp

import pytest

from broker.domain.model import Tier
from broker.pricing.snapshot import FILES, packaged_dir
from conftest import SHARED_DATA


def raw_rows(name):
    with open(packaged_dir() / name, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.skipif(not (SHARED_DATA / "prices").exists(), reason="shared/data is not beside this checkout")
@pytest.mark.parametrize("name", FILES.values())
def test_packaged_snapshot_is_identical_to_the_shared_data(name):
    assert filecmp.cmp(packaged_dir() / name, SHARED_DATA / "prices" / name, shallow=False)


def test_gcp_vm_price_is_host_plus_accelerator_as_documented(catalog):
    rows = catalog.rows.set_index(["cloud", "instance_type", "zone"])
    # The two worked examples in prices/SOURCE.md (us-central1, on-demand).
    assert rows.loc[("gcp", "a2-highgpu-1g", "us-central1-a"), "on_demand_usd_per_h"] == pytest.approx(3.67339)
    assert rows.loc[("gcp", "g2-standard-4", "us-central1-a"), "on_demand_usd_per_h"] == pytest.approx(0.70683)


def test_every_gcp_vm_is_priced_from_its_host_and_gpu_rows(catalog):
    raw = raw_rows("gcp_gpu_vms.csv")
    gpu = {
        (r["AvailabilityZone"], r["AcceleratorName"], int(r["AcceleratorCount"])): r
        for r in raw
        if not r["InstanceType"]
    }
    host = {(r["InstanceType"], r["AvailabilityZone"]): r for r in raw if r["InstanceType"]}
    gcp = catalog.rows[catalog.rows.cloud == "gcp"]
    assert len(gcp) > 500
    for row in gcp.itertuples():
        h, g = host[(row.instance_type, row.zone)], gpu[(row.zone, row.accelerator, row.accelerator_count)]
        assert row.on_demand_usd_per_h == pytest.approx(float(h["Price"]) + float(g["Price"]))
        assert row.spot_usd_per_h == pytest.approx(float(h["SpotPrice"]) + float(g["SpotPrice"]))


def test_gcp_h200_hosts_without_a_gpu_price_are_not_offered(catalog):
    assert not catalog.rows.instance_type.str.startswith("a3-ultragpu").any()


def test_aws_rows_are_one_per_instance_type_and_zone(catalog):
    aws = catalog.rows[catalog.rows.cloud == "aws"]
    assert not aws.duplicated(["instance_type", "zone"]).any()
    raw_keys = {(r["InstanceType"], r["AvailabilityZone"]) for r in raw_rows("aws_gpu_vms.csv")}
    assert len(aws) == len(raw_keys)


def test_a_row_without_a_spot_price_gives_no_spot_offer(catalog):
    row = next(r for r in raw_rows("aws_gpu_vms.csv") if not r["SpotPrice"] and r["Price"])
    offers = [o for o in catalog.offers if o.instance_type == row["InstanceType"] and o.zone == row["AvailabilityZone"]]
    assert [o.tier for o in offers] == [Tier.on_demand]
    assert offers[0].price_usd_per_h == float(row["Price"])


def test_azure_nd_h100_v5_has_eight_gpus_not_the_sources_twelve(catalog):
    nd = catalog.rows[catalog.rows.instance_type == "Standard_ND96isr_H100_v5"]
    assert len(nd) and set(nd.accelerator_count) == {8}


def test_offers_carry_prices_and_gpu_shapes_from_the_rows(catalog):
    spot = {o.id: o for o in catalog.offers if o.tier == Tier.spot}
    on_demand = {o.id: o for o in catalog.offers if o.tier == Tier.on_demand}
    row = catalog.rows[(catalog.rows.instance_type == "p3.2xlarge") & (catalog.rows.zone == "use1-az1")].iloc[0]
    assert spot["aws/use1-az1/p3.2xlarge/spot"].price_usd_per_h == row.spot_usd_per_h
    assert on_demand["aws/use1-az1/p3.2xlarge/on_demand"].price_usd_per_h == row.on_demand_usd_per_h == 3.06
    assert spot["aws/use1-az1/p3.2xlarge/spot"].gpu_memory_gb == 16
    assert all(o.hazard_per_h == 0 for o in on_demand.values())


def test_price_table_filters_and_sorts_by_the_requested_price(catalog):
    table = catalog.table(gpu="a100", cloud="gcp", spot_only=True)
    assert len(table) and set(table.accelerator) == {"A100"} and set(table.cloud) == {"gcp"}
    assert table.spot_usd_per_h.is_monotonic_increasing
    assert (table.spot_savings_pct == (1 - table.spot_usd_per_h / table.on_demand_usd_per_h) * 100).all()


def test_an_unknown_offer_id_is_one_line_that_shows_the_form_of_a_real_one(catalog):
    from broker.domain.errors import BrokerError

    with pytest.raises(BrokerError) as refused:
        catalog.offer("bogus")
    example = str(refused.value).split("e.g. ")[1].split()[0]
    assert "cloud/zone/instance/tier" in str(refused.value) and catalog.offer(example).id == example
    with pytest.raises(BrokerError, match="did you mean aws/aps1-az3/g6.4xlarge/spot"):
        catalog.offer("aws/aps1-az3/g6.4xlarge/spott")
