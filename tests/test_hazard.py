"""The hazard model: trace evidence, Spot Advisor prior anchored on it, online observations, bands."""

import json
from pathlib import Path

import pandas as pd
import pytest

from broker.domain.errors import BrokerError
from broker.pricing.hazard import PRIOR_HOURS, Evidence, HazardModel, gamma_band
from broker.pricing.snapshot import packaged_dir
from broker.pricing.traces import EVIDENCE_COLUMNS, evidence, load_pool, load_trace, load_traces, shared_traces

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
needs_traces = pytest.mark.skipif(not TRACES.exists(), reason="../shared/data/traces is not here")


@needs_traces
def test_packaged_evidence_is_what_the_shared_traces_say():
    packaged = pd.read_csv(packaged_dir() / "trace_evidence.csv")
    fresh = evidence(shared_traces(TRACES))
    assert {"a2-highgpu-1g", "v100x1"} <= set(fresh["instance_type"])  # Bamboo's GCP pools too
    pd.testing.assert_frame_equal(packaged, fresh.astype(packaged.dtypes.to_dict()), check_exact=False, rtol=1e-3)


def write_trace(path: Path, data, gap_s=60):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap_s}, "data": list(data)}))
    return path


def test_a_trace_counts_drops_as_preemptions_and_running_ticks_as_exposure(tmp_path):
    trace = load_trace(
        write_trace(
            tmp_path / "preemption" / "aws-01-01-2024" / "us-west-2b_v100_1.json",
            [1, 1, 0, 0, 1, 1, 1, 0, 1],
            gap_s=1800,
        )
    )
    assert (trace.cloud, trace.region, trace.zone, trace.instance_type) == (
        "aws",
        "us-west-2",
        "us-west-2b",
        "p3.2xlarge",
    )
    assert trace.preemptions() == 2 and trace.exposure_hours() == pytest.approx(6 * 0.5)
    assert trace.availability() == pytest.approx(6 / 9) and trace.kind == "preemption"
    gcp = load_trace(write_trace(tmp_path / "gcp-01-01-2024" / "us-central1-a_c3-88.json", [1, 1]))
    assert (gcp.region, gcp.instance_type) == ("us-central1", "c3-highcpu-88")


@pytest.mark.parametrize(
    "body",
    [
        '{"data": [1]}',
        "not json",
        '{"metadata": {"gap_seconds": 0}, "data": [1]}',
        '{"metadata": {"gap_seconds": 30}, "data": [1, -1]}',
    ],
)
def test_a_malformed_trace_is_one_line_naming_the_file(tmp_path, body):
    path = tmp_path / "aws-01-01-2024" / "us-west-2b_v100_1.json"
    path.parent.mkdir()
    path.write_text(body)
    with pytest.raises(BrokerError, match="us-west-2b_v100_1.json"):
        load_trace(path)


def test_a_steady_rate_has_no_dispersion_and_a_bursty_one_has_some(tmp_path):
    steady = [0 if k % 10 == 9 else 1 for k in range(24 * 60 * 6)]  # one loss every 10 min, 6 days
    bursty = [0 if (k // (24 * 60)) % 2 == 0 and k % 5 == 4 else 1 for k in range(24 * 60 * 6)]  # lossy every other day
    assert load_trace(write_trace(tmp_path / "aws-a" / "us-west-2b_v100_1.json", steady)).dispersion() == pytest.approx(
        0, abs=0.01
    )
    assert load_trace(write_trace(tmp_path / "aws-b" / "us-west-2b_v100_1.json", bursty)).dispersion() > 0.5


def model(rows, bands=None):
    return HazardModel(pd.DataFrame(rows, columns=EVIDENCE_COLUMNS), bands or {})


def test_a_pool_log_counts_drops_as_preemptions_but_says_nothing_of_availability(tmp_path):
    """Bamboo's GCP pools: the live count at each change, refilled to its size, each change logged on three rows a
    minute apart (the next change may come before they end: 10:46:30). 4 lost in 2 h of 100 instances."""
    log = tmp_path / "a100x1-east1b.txt"
    rows = [("10:00:00", 100), ("10:01:00", 100), ("10:30:00", 97), ("10:31:00", 97), ("10:32:00", 97)]
    rows += [("10:45:00", 100), ("10:46:00", 100), ("10:47:00", 100), ("10:46:30", 99), ("12:00:00", 100)]
    log.write_text("".join(f"2021-12-11, {t}, {n}\n" for t, n in rows))
    pool = load_pool(log)
    where = (pool.cloud, pool.region, pool.zone, pool.instance_type)
    assert where == ("gcp", "us-east1", "us-east1-b", "a2-highgpu-1g")
    assert pool.preemptions() == 4 and pool.hours == pytest.approx(2.0)
    assert pool.exposure_hours() == pytest.approx((30 * 100 + 15 * 97 + 2 * 100 + 73 * 99) / 60)  # by the minute
    rows = evidence([pool])
    assert rows["availability"].isna().all() and rows["dispersion"].isna().all()  # a day cannot show either
    shipped = HazardModel.packaged()
    aws = pd.read_csv(packaged_dir() / "trace_evidence.csv").query("cloud == 'aws'")  # the anchor's evidence
    cautious = HazardModel(aws, shipped.bands).spot("gcp", "us-east1", "a2-highgpu-1g")
    seen = HazardModel(pd.concat([aws, rows]), shipped.bands).spot("gcp", "us-east1", "a2-highgpu-1g")
    assert seen.per_hour < cautious.per_hour / 3 and "4 preemptions in 198 h observed" in seen.source
    assert cautious.availability < seen.availability < 1.0  # the anchor's gaps after longer up-spells: not always up
    with pytest.raises(BrokerError, match="name it <gpu>x<count>"):
        load_pool(write_trace(tmp_path / "pool.txt", [1]))


def test_observed_preemptions_dominate_the_prior_and_narrow_the_band():
    m = model(
        [["t", "preemption", "aws", "us-west-2", "us-west-2b", "p3.2xlarge", 100, 40, 100.0, 0.0, 0.9]],
        {("us-west-2", "p3.2xlarge"): ">20%", ("us-west-2", "g6.xlarge"): "<5%"},
    )
    p3 = m.spot("aws", "us-west-2", "p3.2xlarge")
    assert p3.per_hour == pytest.approx((0.4 * PRIOR_HOURS + 40) / (PRIOR_HOURS + 100))  # prior: the anchor itself
    assert p3.low < p3.per_hour < p3.high and p3.availability == 0.9
    more = m.observe({("aws", "us-west-2", "p3.2xlarge"): Evidence(400, 1000)}).spot("aws", "us-west-2", "p3.2xlarge")
    assert more.high - more.low < p3.high - p3.low and more.per_hour == pytest.approx(0.4, rel=0.02)


def test_advisor_bands_scale_the_anchor_and_other_clouds_get_the_cautious_default():
    m = model(
        [["t", "preemption", "aws", "us-west-2", "us-west-2b", "p3.2xlarge", 100, 40, 100.0, 0.2, 1.0]],
        {("us-west-2", "p3.2xlarge"): ">20%", ("us-east-1", "g6.xlarge"): "<5%"},
    )
    g6 = m.spot("aws", "us-east-1", "g6.xlarge")
    assert g6.per_hour == pytest.approx(0.4 * 2.5 / 25, rel=1e-3) and g6.band == "<5%" and "advisor" in g6.source
    assert m.spot("aws", "eu-west-1", "p3.2xlarge").source == "p3.2xlarge in other regions"
    gcp = m.spot("gcp", "us-central1", "a2-highgpu-1g")
    assert gcp.per_hour == pytest.approx(0.4, rel=1e-3) and "default" in gcp.source


def test_an_offer_without_availability_evidence_gets_the_gaps_its_siblings_or_the_anchor_show_not_always_up():
    m = model(
        [
            ["t", "preemption", "aws", "us-west-2", "us-west-2b", "p3.2xlarge", 100, 40, 100.0, 0.0, 0.6],
            ["t", "availability", "aws", "us-east-1", "us-east-1a", "p3.2xlarge", 100, 0, 0.0, 0.0, 0.4],
        ],
        {("us-west-2", "p3.2xlarge"): ">20%", ("us-east-1", "p3.2xlarge"): ">20%", ("us-east-1", "g6.xlarge"): "<5%"},
    )
    assert m.spot("aws", "us-west-2", "p3.2xlarge").availability == 0.6  # its region's traces
    assert m.spot("aws", "eu-west-1", "p3.2xlarge").availability == pytest.approx(0.5)  # its type's elsewhere
    # no trace of the type: the anchor's traced types are up half the time at 0.4 preemptions an hour, so down 2.5 h
    # a spell, after up-spells of 1 / hazard: 2.5 h at the cautious default (half the time up), 25 h in "<5%" (0.91)
    gap_h = (1 - 0.5) / (0.5 * 0.4)
    gcp = m.spot("gcp", "us-central1", "a2-highgpu-1g")
    assert gcp.availability == pytest.approx(1 / (1 + 0.4 * gap_h), rel=1e-3) == pytest.approx(0.5, rel=1e-3)
    g6 = m.spot("aws", "us-east-1", "g6.xlarge")
    assert g6.availability == pytest.approx(1 / (1 + g6.per_hour * gap_h)) and 0.85 < g6.availability < 0.95
    assert model([], {}).spot("gcp", "us-central1", "a2-highgpu-1g").availability == 1.0  # no evidence of anything


def test_the_band_widens_with_dispersion():
    narrow, wide = gamma_band(50, 100, 0.0), gamma_band(50, 100, 0.8)
    assert wide[0] < narrow[0] < 0.5 < narrow[1] < wide[1]


@pytest.mark.parametrize("shape,rate,dispersion", [(50, 100, 0.0), (50, 100, 0.8), (0.2, 3, 0.3), (1e-6, 24, 0.0)])
def test_the_band_is_the_central_90_percent_of_the_rates_gamma(shape, rate, dispersion):
    from scipy import stats

    cv2 = 1 / shape + dispersion  # a mean shape / rate with squared coefficient of variation cv2
    rates = stats.gamma(a=1 / cv2, scale=shape / rate * cv2)
    assert gamma_band(shape, rate, dispersion) == pytest.approx(tuple(rates.ppf([0.05, 0.95])), rel=1e-9)


def test_the_catalog_prices_spot_with_the_model(catalog):
    spot = [
        o
        for o in catalog.offers
        if o.tier.value == "spot" and o.instance_type == "p3.2xlarge" and o.region == "us-east-1"
    ]
    assert spot and all(o.hazard_per_h == catalog.hazard.spot("aws", "us-east-1", "p3.2xlarge").per_hour for o in spot)
    assert all("observed" in o.hazard_source and o.availability < 1 for o in spot)


def test_a_backtest_market_learns_its_hazard_only_from_the_traces_it_is_fitted_on(tmp_path):
    """The shipped evidence has every shared trace in it, the ones a backtest is evaluated on too: a backtest that
    fits on other traces must price its offers' preemptions from those alone."""
    from broker.sim.market import PACKAGED_TRACES, backtest_market

    fit = tmp_path / "preemption" / "aws-01-01-2024"
    write_trace(fit / "us-west-2b_v100_1.json", [1, 1, 1, 0] * 30, gap_s=1800)  # 30 drops in 45 h running
    shipped = {s.offer.zone: s.offer for s in backtest_market(PACKAGED_TRACES).spot}
    fitted = {s.offer.zone: s.offer for s in backtest_market(PACKAGED_TRACES, hazard_from=load_traces(fit)).spot}
    assert shipped.keys() == fitted.keys()
    for zone, offer in fitted.items():
        if offer.region == "us-west-2":
            assert offer.hazard_source.startswith("30 preemptions in 45 h observed"), offer.hazard_source
        else:  # no evidence of its own in the fit traces: the prior, not what the shipped traces saw there
            assert "observed" not in offer.hazard_source.split(",")[0], offer.hazard_source
        assert "observed" in shipped[zone].hazard_source and offer.hazard_per_h != shipped[zone].hazard_per_h


def test_a_siblings_hour_without_a_preemption_moves_the_prior_a_little_not_to_zero():
    bands = {("us-east-1", "g6.xlarge"): ">20%", ("us-west-2", "g6.xlarge"): "<5%"}  # the sibling: not the anchor
    traced = ["t", "preemption", "aws", "us-west-2", "us-west-2b", "p3.2xlarge", 100, 40, 100.0, 0.3, 1.0]
    m = model([traced], {**bands, ("us-west-2", "p3.2xlarge"): ">20%"})
    before = m.spot("aws", "us-east-1", "g6.xlarge")  # the advisor band's rate: the anchor's 0.4
    after = m.observe({("aws", "us-west-2", "g6.xlarge"): Evidence(0, 1.0)}).spot("aws", "us-east-1", "g6.xlarge")
    assert after.source == "g6.xlarge in other regions"
    assert after.per_hour == pytest.approx(0.4 * PRIOR_HOURS / (PRIOR_HOURS + 1))  # a day's prior, an hour's runs
    assert after.high > 0.5 * before.high  # the band keeps the prior's dispersion, weighed against an hour's none
    many = m.observe({("aws", "us-west-2", "g6.xlarge"): Evidence(10, 1000.0)}).spot("aws", "us-east-1", "g6.xlarge")
    assert many.per_hour == pytest.approx((0.4 * PRIOR_HOURS + 10) / (PRIOR_HOURS + 1000))  # near their 0.01


def test_a_demos_copied_jobs_are_no_evidence_of_preemptions():
    """A demo runs on a compressed clock with local agents; its jobs are copied to be shown, not learned from."""
    from datetime import timedelta

    from test_market_model import NOW, trace
    from test_quotes import _quote, _quote_spec

    from broker.domain.model import Job, Run
    from broker.pricing.availability import MarketModel

    quote = _quote(MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)]), 30.0)
    offer = quote.chosen.offer
    assert offer.tier.value == "spot"
    ended = NOW + timedelta(hours=2)
    run = Run(
        fence=1, agent="a", offer=offer, dispatched_at=NOW, started_at=NOW, ended_at=ended, end_reason="preempted"
    )
    job = Job(id="j", spec=_quote_spec(30.0), submitted_at=NOW, updated_at=NOW, quote=quote, runs=[run])
    assert job.market_runs() == [run] and job.model_copy(update={"tags": ["demo"]}).market_runs() == []


@pytest.mark.parametrize(
    "seen,words",
    [
        (Evidence(1, 0.05), "1 preemption in 3 min"),
        (Evidence(0, 0.001), "0 preemptions in under a minute"),
        (Evidence(0, 2.5), "0 preemptions in 2.5 h"),
        (Evidence(296, 581.2), "296 preemptions in 581 h"),
    ],
)
def test_the_evidence_reads_right_for_one_preemption_and_for_minutes(seen, words):
    m = model([]).observe({("aws", "us-east-1", "g6.xlarge"): seen})
    assert m.spot("aws", "us-east-1", "g6.xlarge").source.startswith(f"{words} observed")
