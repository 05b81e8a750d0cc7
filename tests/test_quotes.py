"""Quotes simulated on the market model's futures (core/forecast.py): against the fleet, the jobs ahead and to come,
the policy's placement, and the speed error the measured jobs show."""

from datetime import timedelta

import pytest
from test_market_model import NOW, _offer, trace

from broker import planning
from broker.app.wiring import make_broker
from broker.core.broker import Broker
from broker.core.clock import SimulatedClock
from broker.core.server import GUARD_EVERY_S
from broker.domain.model import Job, JobState, Run
from broker.models.risk import exclusive_hours, restart_hours
from broker.pricing.availability import MarketModel
from broker.sim.calibration import cost_coverage, cost_errors_pct, preemptions_over_quoted, reliability
from broker.sim.market import OfferBook


def _quote_spec(window_h: float, restore_minutes: float = 1.0):
    from broker.domain.jobspec import JobSpec

    return JobSpec(
        name="train",
        run=["simulated"],
        resources={"accelerators": ["V100:1"]},
        work={"gpu_hours": 4.0, "kind": "training"},
        checkpoint={"size_gb": 1.0, "restore_minutes": restore_minutes},
        deadline=NOW + timedelta(hours=window_h),
        budget_usd=12.0,
    )


def _quote(model: MarketModel, window_h: float, budget_usd: float = 12.0):
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    clock = SimulatedClock(NOW)
    spec = _quote_spec(window_h).model_copy(update={"budget_usd": budget_usd})
    return Broker(None, OfferBook(offers), planning.get("costslo"), clock, model).quote(spec)


def _choppy() -> MarketModel:
    """A zone up 4 hours at a time, then down 2: spot for a 10-hour job at a price, not for certain."""
    return MarketModel.fit([trace("us-east-1a", [1] * 24 + [0] * 12, 80)])


def test_a_quote_shows_and_saves_against_its_futures_not_the_money_model():
    from rich.console import Console

    from broker.app import render
    from broker.models import accounting

    quote = _quote(_choppy(), 18.0)
    chosen, base = quote.forecast, quote.on_demand_baseline.forecast
    assert base.rule == "on-demand" and base.p_meet_deadline < 1.0  # even on-demand: the speed estimate may be off
    assert quote.savings_usd == pytest.approx(base.cost_p50_usd - chosen.cost_p50_usd)
    analytic = quote.on_demand_baseline.expected_cost_usd - quote.chosen.expected_cost_usd
    assert abs(quote.savings_usd - analytic) > 0.05  # the money model's: means, not medians, and a constant hazard
    console = Console(width=160, record=True)
    console.print(render.quote_table(quote, "quote"))
    row = next(line.split() for line in console.export_text().splitlines() if line.startswith("chosen"))
    assert f"${chosen.cost_p50_usd:,.2f}" in row and f"{chosen.p_meet_deadline:.2f}" in row
    median_h = (chosen.finish_p50 - quote.created_at).total_seconds() / 3600  # the futures' time, as their cost
    shown = render.duration(median_h)
    assert shown in " ".join(row) and shown != render.duration(quote.chosen.expected_wall_h)
    assert f"{quote.chosen.p_meet_deadline:.3f}" not in row
    job = Job(id="j", spec=_quote_spec(18.0), submitted_at=NOW, updated_at=NOW, quote=quote)
    assert quote.cost_usd == chosen.cost_p50_usd != quote.chosen.expected_cost_usd
    assert accounting.jobs_frame([job], NOW)["quote $"].iloc[0] == pytest.approx(chosen.cost_p50_usd, abs=1e-4)


def test_a_quote_launches_only_where_the_job_runs_as_fast_as_on_its_chosen_offer():
    from broker.core.forecast import zones_for

    base = _quote_spec(30.0)
    spec = type(base).model_validate({**base.model_dump(), "resources": {"accelerators": ["V100:1", "T4:1"]}})
    v100, other_v100 = _offer("us-east-1a"), _offer("us-east-1b", price=0.8)
    t4 = _offer("us-east-1c", price=0.3).model_copy(update={"accelerator": "T4", "instance_type": "g4dn.xlarge"})
    zones = zones_for(spec, v100, [v100, other_v100, t4], 3.06)
    assert [o.id for o in zones] == [other_v100.id, v100.id]  # the cheap T4 is slower: not a zone of this quote
    bubble = _offer("us-east-1d", "bubble", 0.0).model_copy(update={"speed_factor": 0.5})
    slower = _offer("us-east-1e", "bubble", 0.0).model_copy(update={"speed_factor": 0.2})
    fill = spec.model_copy(update={"fill": True})
    assert {o.id for o in zones_for(fill, bubble, [bubble, slower, v100], 3.06)} == {bubble.id, slower.id}
    # ... but a job chosen for a bubble takes any free one (the policies do: its work is free there)


def test_a_quote_chosen_on_demand_runs_on_spot_while_in_time_under_a_policy_that_places_by_its_rule():
    """Uniform Progress's family places a job every round by its rule: spot while it can still make the deadline,
    whatever tier the quote chose. Its quotes play the same; a policy that keeps the quote's choice does not."""
    from broker.core.forecast import forecast

    model = MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)])
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    spec = _quote_spec(30.0).model_copy(update={"budget_usd": None})
    on_demand = Broker(None, OfferBook(offers), planning.get("on-demand"), SimulatedClock(NOW), model).quote(spec)
    assert on_demand.chosen.offer.tier == "on_demand"
    kept = forecast(spec, on_demand, offers, model, "hedge", NOW)
    replanned = forecast(spec, on_demand, offers, model, "hedge", NOW, spot_while_in_time=True)
    assert kept.spot_share == 0.0 and kept.rule == "on-demand"
    assert replanned.spot_share > 0.9 and replanned.cost_p50_usd < kept.cost_p50_usd / 2
    assert replanned.zones == [offers[0].id] and "run on spot whenever in time" in replanned.evidence
    late = NOW + timedelta(hours=on_demand.chosen.expected_wall_h * 0.5)  # no offer can finish in time
    soonest = spec.model_copy(update={"deadline": late, "if_late": "soonest"})
    assert forecast(soonest, on_demand, offers, model, "hedge", NOW, spot_while_in_time=True).spot_share == 0.0
    cheapest = spec.model_copy(update={"deadline": late, "if_late": "cheapest"})  # a lost deadline: spot if any
    played = forecast(cheapest, on_demand, offers, model, "hedge", NOW, spot_while_in_time=True)
    assert played.spot_share > 0.5
    late = NOW + timedelta(hours=on_demand.chosen.expected_wall_h * 0.7)  # lost, and in time in twice the window
    extend, cheapest = (spec.model_copy(update={"deadline": late, "if_late": i}) for i in ("extend", "cheapest"))
    second = forecast(extend, on_demand, offers, model, "hedge", NOW, spot_while_in_time=True)
    played = forecast(cheapest, on_demand, offers, model, "hedge", NOW, spot_while_in_time=True)
    assert second.spot_share > 0.5 and second.p_meet_deadline < 0.1  # P(meet) is still the deadline's
    assert late < second.finish_p50 <= NOW + 2 * (late - NOW) and second.finish_p50 != played.finish_p50
    assert planning.get("hedge").spot_while_in_time and not hasattr(planning.get("costslo"), "spot_while_in_time")


def test_a_job_chosen_for_a_bubble_is_quoted_on_spot_while_the_bubbles_are_busy():
    """Fill jobs wait for no bubble: where the bubbles are held by other jobs and spot is free, the policy places
    the job on spot at spot's pace, and its quote says so rather than the on-demand the futures fell back to."""
    from broker.core.fleet import RUNNING, Fleet
    from broker.core.forecast import forecast

    model = MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)])
    spot = _offer("us-east-1a")
    bubble = _offer("us-east-1d", "bubble", 0.0).model_copy(update={"speed_factor": 0.5})
    offers = [spot, bubble, _offer("us-east-1z", "on_demand", 3.06)]
    spec = _quote_spec(30.0).model_copy(update={"fill": True, "budget_usd": None})
    quote = Broker(None, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), model).quote(spec)
    chosen = quote.chosen.model_copy(update={"offer": bubble})
    on_bubble = quote.model_copy(update={"chosen": chosen})
    busy = Fleet(agents={bubble.id: 1, spot.id: 1}, others=[(frozenset({bubble.id}), 100.0, RUNNING)])
    bubbles_only = forecast(spec, on_bubble, offers, model, "hedge", NOW, fleet=busy)
    replanned = forecast(spec, on_bubble, offers, model, "hedge", NOW, fleet=busy, spot_while_in_time=True)
    assert bubbles_only.zones == [bubble.id] and bubbles_only.spot_share == 0.0  # only on-demand while it waits
    assert replanned.zones == [bubble.id, spot.id] and replanned.spot_share > 0.8
    assert replanned.cost_p50_usd < bubbles_only.cost_p50_usd / 2
    waiting = Job(
        id="w", spec=spec, submitted_at=NOW, updated_at=NOW, quote=on_bubble.model_copy(update={"forecast": replanned})
    )
    assert Fleet.of([], [waiting], NOW, []).others[0][0] == {bubble.id}  # it waits for a bubble: holds no spot
    # jobs that run only on spot hold spot slots, not the free bubble, however cheap the bubble is
    crowd = Fleet(agents={bubble.id: 1, spot.id: 1}, others=[(frozenset({spot.id}), 100.0, RUNNING)] * 5)
    free_bubble = forecast(spec, on_bubble, offers, model, "hedge", NOW, fleet=crowd, spot_while_in_time=True)
    assert free_bubble.cost_p50_usd == 0.0
    on_spot_usd = spot.price_usd_per_h * (exclusive_hours(spec, spot) + restart_hours(spec))
    assert exclusive_hours(spec, bubble) == pytest.approx(2 * exclusive_hours(spec, spot))
    assert replanned.cost_p50_usd < 1.2 * on_spot_usd  # at spot's pace, not the bubble's (twice as slow)


def test_quote_figures_count_errors_and_calibration():
    rows = [
        {"quoted_cost_usd": 10.0, "cost_usd": c, "p_meet": 0.9, "met": m}
        for c, m in [(11, True)] * 17 + [(5, False)] * 3
    ]
    assert cost_errors_pct(rows) == (10.0, 50.0)
    figures = reliability(rows)
    assert figures["calibration_max_gap_pts"] == pytest.approx(5.0) and figures["brier"] == pytest.approx(0.13)
    assert figures["calibration_mean_gap_pts"] == pytest.approx(5.0)
    # 20 jobs at 0.9 that meet at those odds: 18 meet with P 0.29, 17 or 19 with 0.46, 16 or fewer, or 20, with 0.25
    assert figures["calibration_max_gap_if_calibrated_pts"] == [5.0, 10.0]  # median and 90th percentile
    many = [{"quoted_cost_usd": 1.0, "cost_usd": 1.0, "p_meet": 0.9, "met": i % 10 != 0} for i in range(2000)]
    assert reliability(many)["calibration_max_gap_if_calibrated_pts"][1] < 2.0  # 2,000 jobs: a tight floor
    # the 20 jobs pooled under three policies: one job's rows meet or miss together, so the floor is the 20 jobs'
    pooled = [r | {"case": i} for i, r in enumerate(rows) for _ in range(3)]
    assert reliability(pooled)["calibration_max_gap_if_calibrated_pts"] == [5.0, 10.0]
    apart = reliability([r | {"case": (i, k)} for i, r in enumerate(rows) for k in range(3)])
    assert apart["calibration_max_gap_if_calibrated_pts"][1] < 10.0  # 60 outcomes drawn apart: a floor too low
    quoted = {"quoted_p10_usd": 8.0, "quoted_cost_usd": 10.0, "quoted_p90_usd": 12.0, "quoted_spread_pct": 10.0}
    quoted |= {"quoted_mean_usd": 10.0}
    spread = [quoted | {"cost_usd": c} for c in (7.0, 9.0, 11.0, 13.0)]
    free = [dict.fromkeys([*quoted, "cost_usd"], 0.0)] * 4  # free in every future, and free: right, not too dear
    coverage = cost_coverage(spread + free)
    assert coverage == {
        "cost_at_or_below_p10_p50_p90": [0.25, 0.5, 0.75],
        "median_quoted_spread_pct": 10.0,
        "cost_realised_over_quoted_mean": 1.0,
        "cost_realised_over_quoted_p50": 1.0,
    }
    # free in most futures (p10 = p50 = $0) and free: at its p10 and p50, half below each, and below its p90
    mostly_free = dict.fromkeys(["quoted_p10_usd", "quoted_cost_usd", "cost_usd"], 0.0)
    mostly_free |= {"quoted_p90_usd": 5.0, "quoted_spread_pct": 50.0, "quoted_mean_usd": 1.0}
    assert cost_coverage([mostly_free])["cost_at_or_below_p10_p50_p90"] == [0.5, 0.5, 1.0]
    assert cost_coverage(spread + [mostly_free] * 4)["cost_at_or_below_p10_p50_p90"] == [0.375, 0.5, 0.875]


def test_skewed_quotes_right_on_average_sum_to_their_means_not_their_medians():
    # most futures keep spot ($10), one in four pays on-demand through a long gap ($18): p50 $10, mean $12
    quoted = {"quoted_p10_usd": 9.0, "quoted_cost_usd": 10.0, "quoted_p90_usd": 18.0, "quoted_spread_pct": 5.0}
    rows = [quoted | {"quoted_mean_usd": 12.0, "cost_usd": c} for c in (10.0, 10.0, 10.0, 18.0)]
    coverage = cost_coverage(rows)
    assert coverage["cost_realised_over_quoted_mean"] == 1.0  # right on average
    assert coverage["cost_realised_over_quoted_p50"] == 1.2  # the medians' sum reads 20% low
    low = cost_coverage([r | {"quoted_mean_usd": 10.0} for r in rows])
    assert low["cost_realised_over_quoted_mean"] == 1.2  # means that leave out the dear futures read low


def test_the_runs_spot_took_back_are_summed_against_the_quotes_means():
    rows = [{"quoted_preemptions": 2.5, "preemptions": n} for n in (1, 4, 5)]
    assert preemptions_over_quoted(rows) == 1.333  # 10 taken back where the futures lost 7.5 on average
    on_demand = {"quoted_preemptions": 0.0, "preemptions": 0}
    assert preemptions_over_quoted([on_demand, {"quoted_preemptions": None, "preemptions": 3}]) is None


def test_a_rows_preemptions_are_the_runs_spot_took_back_after_its_quote_or_outlook_was_made():
    from broker.sim.calibration import job_rows

    quote = _quote(_choppy(), 40.0)
    job = _finished(quote, 1.0, "j")
    started = [NOW + timedelta(hours=1 + i) for i in range(3)]  # runs ending at 1:30, 2:30 and 3:30
    runs = [
        job.runs[0].model_copy(
            update={"fence": i + 1, "dispatched_at": t, "started_at": t, "ended_at": t + timedelta(minutes=30)}
            | {"end_reason": reason}
        )
        for i, (t, reason) in enumerate(zip(started, ["preempted", "preempted", "finished"]))
    ]
    job = job.model_copy(update={"runs": runs})
    end = NOW + timedelta(hours=10)
    assert job_rows([job], end)[0]["preemptions"] == 2  # both after the quote at submit
    outlook = {"j": (NOW + timedelta(hours=2), quote.forecast)}  # made between them: its futures count the second
    assert job_rows([job], end, outlook)[0]["preemptions"] == 1


def test_a_quote_says_how_many_runs_its_futures_lose_to_spot():
    choppy = _quote(_choppy(), 40.0).forecast.preemptions_mean
    assert 1.5 < choppy < 4  # up 4 hours at a time, down 2: a 10-hour job meets a gap or two, or three
    calm = MarketModel.fit([trace("us-east-1a", [1] * 36, 80)])  # never seen down: a gap is a rare draw
    assert _quote(calm, 40.0).forecast.preemptions_mean < 0.1


def _rated(spec):
    """The spec with its work as steps at a measured rate that takes as long as its GPU-hours are estimated to."""
    from broker.models.risk import exclusive_hours_on

    work = {
        "gpu_hours": None,
        "steps": 10_000,
        "steps_per_hour": {"V100": 10_000 / exclusive_hours_on(spec, "V100", 1)},
    }
    return spec.model_copy(update={"work": spec.work.model_copy(update=work)})


def _finished(
    quote, speed: float, name: str, state: JobState = JobState.done, spec_name: str = "train", rated: bool = False
) -> Job:
    """A finished (or `state`) job whose one run progressed at `speed` times the estimate for 3 productive hours;
    `rated`: its work given as steps at a measured rate (as many hours), not as GPU-hours."""
    offer, spec = quote.chosen.offer, _quote_spec(30.0).model_copy(update={"name": spec_name})
    if rated:
        spec = _rated(spec)
    started = NOW + timedelta(hours=1)
    run = Run(fence=1, agent="a", offer=offer, dispatched_at=started, started_at=started, progress_total=1000.0)
    run.last_progress_at = started + timedelta(hours=3 + spec.checkpoint.restore_minutes / 60 + 0.05)
    run.progress_done = 1000 * speed * 3 / quote.chosen.exclusive_h
    return Job(id=name, spec=spec, submitted_at=NOW, updated_at=NOW, quote=quote, runs=[run], state=state)


def test_each_alternative_is_played_on_its_own_offer_not_started_where_the_chosen_one_is():
    """Among all the zones the rule starts a job in the cheapest with room: played so, every alternative read the
    chosen one's cost. A user weighing an alternative asks what that offer would cost."""
    cheap = _offer("us-east-1a", price=0.9)
    dear = _offer("us-east-1b", price=1.8).model_copy(update={"instance_type": "p3.2xlarge-b"})  # another shape
    offers = [cheap, dear, _offer("us-east-1z", "on_demand", 3.06)]
    calm = MarketModel.fit([trace(z, [1] * 300 + [0] * 1, 20) for z in ("us-east-1a", "us-east-1b")])
    broker = Broker(None, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), calm, explained=True)
    quote = broker.quote(_quote_spec(30.0).model_copy(update={"budget_usd": None}))
    alt = next(o for o in quote.alternatives if o.offer.id == dear.id)
    assert quote.chosen.offer.id == cheap.id and alt.forecast.zones == [dear.id]
    assert alt.forecast.cost_p50_usd == pytest.approx(2 * quote.forecast.cost_p50_usd, rel=0.1)


def test_a_live_brokers_quote_plays_the_guard_it_runs_under_not_one_a_market_tick_coarse():
    """10 h of work in 10.6 h: 0.2 h beyond the net. Under a guard that looks once a 10-minute tick (the simulated
    server's, the default) the job goes to on-demand at once; the live server looks every second and the agents
    checkpoint on the notice, so a live broker's quote (wiring.make_broker) plays the job on spot, where it runs."""
    model = MarketModel.fit([trace("us-east-1a", [1] * 300 + [0] * 1, 20)])
    offers = [_offer("us-east-1a"), _offer("us-east-1z", "on_demand", 3.06)]
    spec = _quote_spec(10.6).model_copy(update={"budget_usd": None, "deadline_probability": 0.5})
    ticked = Broker(None, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), model)
    pass_h = make_broker(with_store=False).guard_pass_h
    assert pass_h == GUARD_EVERY_S / 3600
    live = Broker(None, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), model, guard_pass_h=pass_h)
    on_demand, on_spot = ticked.quote(spec).forecast, live.quote(spec).forecast
    assert on_spot.cost_p50_usd < on_demand.cost_p50_usd / 2 and on_spot.p_meet_deadline > 0.5
    assert on_demand.cost_p50_usd > 3.06 * 10  # all on on-demand: its 10 h and the restart


def test_a_quotes_alternatives_are_the_best_by_their_futures_and_listed_by_what_those_say():
    """The money model ranks the alternatives (spot always launchable): here its next four are zones spot is seldom
    up in, whose futures pay for on-demand. A quote a person reads plays twice as many and shows the best by their
    futures, listed as their rows read: those that keep the asked odds first, then by median cost."""
    calm = [1] * 300 + [0]
    seldom = [
        _offer(f"us-east-1{zone}", price=0.55 + i / 100).model_copy(update={"instance_type": f"g4dn.{zone}"})
        for i, zone in enumerate("bdef")
    ]
    steady = _offer("us-east-1c", price=0.7).model_copy(update={"instance_type": "g5.xlarge"})
    model = MarketModel.fit(
        [trace("us-east-1a", calm, 20), trace("us-east-1c", calm, 20, "g5.xlarge")]
        + [trace(o.zone, [1] * 2 + [0] * 10, 300, o.instance_type) for o in seldom]
    )
    on_demand = _offer("us-east-1z", "on_demand", 3.06)
    offers = [_offer("us-east-1a", price=0.5), *seldom, steady, on_demand]
    spec = _quote_spec(30.0).model_copy(update={"budget_usd": None})
    money = planning.get("hedge").quote(spec, offers, NOW)
    assert [o.offer for o in money.alternatives] == seldom  # the money model's next four: the seldom zones
    broker = Broker(None, OfferBook(offers), planning.get("hedge"), SimulatedClock(NOW), model, explained=True)
    listed = broker.quote(spec).alternatives
    assert [o.offer.id for o in listed[:2]] == [steady.id, on_demand.id] and len(listed) == 4
    # the cheapest two seldom zones by their futures
    assert all(o.offer.id in [s.id for s in seldom] for o in listed[2:])
    costs = [o.forecast.cost_p50_usd for o in listed]
    assert costs == sorted(costs) and all(o.forecast.p_meet_deadline > 0.99 for o in listed)
    assert listed[2].forecast.cost_p50_usd > on_demand.price_usd_per_h * 4  # a seldom zone pays for on-demand


def test_the_likeliest_cost_is_where_the_futures_crowd_and_never_a_wider_miss_than_the_median():
    """Futures in three humps (spot held: about $100; a move to on-demand midway: $200; on-demand soon: $300): the
    median lands on the thin middle hump, half the futures 50% off it; the likeliest cost is the middle of their
    narrowest half, which no point quote beats in the futures' median miss. One hump alone: near its median."""
    import numpy as np

    from broker.core.forecast import likeliest

    rng = np.random.default_rng(0)
    humps = np.concatenate([rng.normal(100, 2, 400), rng.normal(200, 4, 200), rng.normal(300, 6, 400)])
    q, e = likeliest(humps)
    assert np.median(np.abs(humps / q - 1)) == pytest.approx(e, abs=1e-3)  # half the futures within e of it
    misses = {at: np.median(np.abs(humps / at - 1)) for at in (np.median(humps), *np.linspace(80, 320, 49))}
    assert all(e <= miss + 1e-9 for miss in misses.values())
    assert e < 0.25 and misses[np.median(humps)] > 0.45
    one = rng.lognormal(np.log(50), 0.1, 1001)
    q, e = likeliest(one)
    assert q == pytest.approx(np.median(one), rel=0.02) and e == pytest.approx(0.067, abs=0.01)


def test_the_forecast_line_names_the_likeliest_cost_only_where_it_is_away_from_the_median():
    from broker.app.render import forecast_line

    f = _quote(_choppy(), 18.0).forecast
    assert f.cost_likely_usd is not None and f.cost_likely_spread_pct <= f.cost_spread_pct + 1e-6
    near = f.model_copy(update={"cost_likely_usd": f.cost_p50_usd * 1.02})
    away = f.model_copy(update={"cost_likely_usd": f.cost_p50_usd * 0.7, "cost_likely_spread_pct": 3.0})
    assert "most near" not in forecast_line(near)
    assert f"most near ${f.cost_p50_usd * 0.7:,.2f} (half within 3%)" in forecast_line(away)
    assert f"{f.spot_share:.0%} on spot, {f.preemptions_mean:.1f} preemptions on average; market" in forecast_line(f)
    assert f"{f.spot_share:.0%} on spot; market" in forecast_line(f.model_copy(update={"preemptions_mean": None}))
    bubbles = ["local/llm.stage1/bubble:llm/bubble", "local/llm.stage0/bubble:llm/bubble"]
    assert "% in bubbles, " in forecast_line(f.model_copy(update={"zones": bubbles}))  # not "on spot"
    assert "% on spot or in bubbles, " in forecast_line(f.model_copy(update={"zones": [*f.zones, *bubbles]}))
