"""Placement controls (cloud, region, zone, exclude, num_nodes) and data locality, from the spec to quotes and plans."""

import pytest

from broker import planning
from broker.domain.errors import InfeasibleError, SpecError
from broker.models.placement import INTER_REGION_USD_PER_GB, INTERNET_USD_PER_GB, data_region_note, transfer_usd
from broker.models.risk import evaluate
from broker.planning.option_table import PlanItem
from conftest import NOW, make_spec

L4 = {"accelerators": ["L4:1", "A10G:1"]}


def quote(catalog, **fields):
    return planning.get("costslo").quote(make_spec(deadline="+48h", **fields), catalog.offers, NOW)


def options(q):
    return [q.chosen, *q.alternatives]


@pytest.mark.parametrize(
    ("resources", "field", "says"),
    [
        ({"cloud": "ibm"}, "resources.cloud[0]", "'aws', 'gcp' or 'azure'"),
        ({"num_nodes": 2}, "resources.num_nodes", "single-instance jobs"),
        ({"region": ""}, "resources.region[0]", "at least 1 character"),
    ],
)
def test_bad_placement_is_one_line_naming_the_field(resources, field, says):
    with pytest.raises(SpecError) as refused:
        make_spec(resources={**L4, **resources})
    assert str(refused.value).startswith(f"spec: {field}: ") and says in str(refused.value)


def test_data_names_its_cloud_by_url_or_field():
    assert make_spec(data={"url": "gs://b/x", "region": "us-central1", "size_gb": 5}).data.cloud == "gcp"
    for data, says in (
        ({"url": "s3://b", "cloud": "gcp", "region": "r", "size_gb": 1}, "disagrees with the url"),
        ({"region": "r", "size_gb": 1}, "give the cloud the data is in"),
        ({"url": "ftp://b", "region": "r", "size_gb": 1}, "url scheme 'ftp'"),
    ):
        with pytest.raises(SpecError, match=says):
            make_spec(data=data)


def test_quotes_keep_to_the_clouds_regions_and_zones_named(catalog):
    free = quote(catalog, resources=L4)
    cheapest_cloud = free.chosen.offer.cloud
    other = next(c for c in ("aws", "gcp", "azure") if c != cheapest_cloud)
    pinned = quote(catalog, resources={**L4, "cloud": other})
    assert {o.offer.cloud for o in options(pinned)} == {other}
    region = free.chosen.offer.region
    assert all(o.offer.region == region for o in options(quote(catalog, resources={**L4, "region": region})))
    avoided = quote(catalog, resources={**L4, "exclude": [region, cheapest_cloud]})
    assert all(o.offer.region != region and o.offer.cloud != cheapest_cloud for o in options(avoided))
    zone = next(o.offer.zone for o in options(free) if o.offer.zone)
    assert {o.offer.zone for o in options(quote(catalog, resources={**L4, "zone": zone}))} == {zone}


def test_a_place_with_no_offer_is_refused_saying_where(catalog):
    with pytest.raises(
        InfeasibleError, match="resources.region: no L4:1, A10G:1 offer in region us-east-9; did you mean us-east-"
    ):
        quote(catalog, resources={**L4, "region": "us-east-9"})


def test_data_far_away_costs_its_transfer_and_pulls_the_job_to_it(catalog):
    free = quote(catalog, resources=L4).chosen.offer
    home = next(
        o for o in catalog.offers if o.cloud == free.cloud and o.region != free.region and o.accelerator == "L4"
    )
    data = {"cloud": home.cloud, "region": home.region, "size_gb": 3000}
    spec = make_spec(deadline="+48h", resources=L4, data=data)
    assert transfer_usd(spec, free) == pytest.approx(3000 * INTER_REGION_USD_PER_GB[home.cloud])
    foreign = next(o for o in catalog.offers if o.cloud != home.cloud)
    assert transfer_usd(spec, foreign) == pytest.approx(3000 * INTERNET_USD_PER_GB[home.cloud])
    assert transfer_usd(spec, home) == 0
    plain = evaluate(make_spec(deadline="+48h", resources=L4), free, NOW)
    assert evaluate(spec, free, NOW).expected_cost_usd == pytest.approx(plain.expected_cost_usd + 60.0)
    assert quote(catalog, resources=L4, data=data).chosen.offer.region == home.region


def test_data_where_no_offer_of_its_cloud_is_gets_a_note_with_the_nearest_regions(catalog):
    """A typo (us-eas-1) had every offer pay to move the input, silently; a real region with no GPU offer is a note
    too, not a refusal (its spelling cannot tell it from a typo)."""
    note = data_region_note(make_spec(data={"url": "s3://b/x", "region": "us-eas-1", "size_gb": 200}), catalog.offers)
    assert note.startswith("data.region: no aws offer is in us-eas-1 (did you mean us-east-1")
    assert note.endswith("so every offer pays to move its 200 GB from there")
    far = data_region_note(make_spec(data={"cloud": "azure", "region": "westeurope", "size_gb": 5}), catalog.offers)
    assert far == "data.region: no azure offer is in westeurope, so every offer pays to move its 5 GB from there"
    assert (
        data_region_note(make_spec(data={"cloud": "gcp", "region": "us-east1", "size_gb": 5}), catalog.offers) is None
    )
    assert data_region_note(make_spec(), catalog.offers) is None


def test_the_planner_places_only_where_a_job_may_run(catalog):
    l4 = sorted((o for o in catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1), key=lambda o: o.id)
    a, b = l4[0], next(o for o in l4 if o.cloud != l4[0].cloud)
    offers, capacity = [a, b], {a.id: 1, b.id: 1}
    for name in ("costslo", "cheapest"):
        item = PlanItem("j", make_spec(deadline="+48h", resources={**L4, "cloud": b.cloud}))
        assert planning.get(name).plan([item], offers, capacity, NOW).assignments == {"j": b.id}
        away = PlanItem("k", make_spec(deadline="+48h", resources={**L4, "exclude": [a.cloud, b.cloud]}))
        plan = planning.get(name).plan([away], offers, capacity, NOW)
        assert plan.assignments == {} and plan.unplaced["k"].value == "resources"
