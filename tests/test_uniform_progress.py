"""Uniform Progress (Can't Be Late): the paper's rule table, and deadlines kept on hand-made spot traces."""

from dataclasses import replace
from datetime import timedelta

import pytest
from test_baselines import offer

from broker import planning
from broker.agents.checkpoints import CheckpointStore
from broker.agents.contract import Contract
from broker.core.broker import Broker
from broker.core.clock import SimulatedClock
from broker.core.server import BrokerServer
from broker.domain.model import Tier
from broker.models.risk import changeover_hours, exclusive_hours
from broker.planning.option_table import PlanItem
from broker.planning.uniform_progress import Move, Progress, UniformProgress, checkpoint_due, decide
from broker.store.jobs import Store
from conftest import NOW, make_spec

D = 0.2  # changeover delay (hours), as in the paper's evaluation


def at(done_h, elapsed_h, total_h=48.0, window_h=72.0):
    return Progress(total_h=total_h, done_h=done_h, elapsed_h=elapsed_h, window_h=window_h, changeover_h=D)


def test_idle_and_behind_goes_on_demand():
    assert decide(at(done_h=10, elapsed_h=24), on=None, spot_available=False) == Move.on_demand  # ep = 16


def test_idle_and_ahead_waits_for_spot():
    assert decide(at(done_h=20, elapsed_h=24), on=None, spot_available=False) == Move.wait


def test_spot_available_is_taken_even_when_behind():
    assert decide(at(done_h=10, elapsed_h=24), on=None, spot_available=True) == Move.spot


def test_a_job_on_spot_stays_until_preempted():
    assert decide(at(done_h=10, elapsed_h=24), on=Tier.spot, spot_available=True) == Move.spot
    assert decide(at(done_h=10, elapsed_h=24), on=Tier.bubble, spot_available=False) == Move.spot


def test_safety_net_goes_on_demand_whatever_else_holds():
    p = at(done_h=20, elapsed_h=43.7)  # R = 28.3 < C + 2d = 28.4
    assert decide(p, on=Tier.spot, spot_available=True) == Move.on_demand
    assert decide(p, on=Tier.on_demand, spot_available=True) == Move.on_demand


def test_on_demand_is_left_only_once_ahead_of_the_expected_progress_two_changeovers_on():
    ep_later = (24 + 2 * D) * 48 / 72  # 16.27
    assert decide(at(done_h=16.1, elapsed_h=24), on=Tier.on_demand, spot_available=True) == Move.on_demand
    assert decide(at(done_h=ep_later + 0.01, elapsed_h=24), on=Tier.on_demand, spot_available=True) == Move.spot
    assert decide(at(done_h=ep_later + 0.01, elapsed_h=24), on=Tier.on_demand, spot_available=False) == Move.wait


def test_a_run_near_the_net_checkpoints_when_a_preemption_would_put_it_past_the_net():
    # 18 h of work left, 18.6 h to go: 0.2 h beyond the net's 18 + 2d
    near = at(done_h=30, elapsed_h=53.4)
    assert not checkpoint_due(near, unsaved_h=0.15, checkpoint_h=0.01)  # the slack covers what a preemption loses
    assert checkpoint_due(near, unsaved_h=0.25, checkpoint_h=0.01)  # it does not: checkpoint now
    assert checkpoint_due(replace(near, pass_h=0.1), unsaved_h=0.15, checkpoint_h=0.01)  # ... by the guard's next pass
    assert not checkpoint_due(near, unsaved_h=0.25, checkpoint_h=0.3)  # the write costs more than the work it keeps
    # the job checkpoints on the cloud's notice: a preemption loses the lead (2 minutes), which the slack covers
    assert not checkpoint_due(near, unsaved_h=0.25, checkpoint_h=0.01, notice_h=2 / 60)
    assert checkpoint_due(near, unsaved_h=0.25, checkpoint_h=0.01, notice_h=0.25)  # a lead longer than the slack
    assert not checkpoint_due(at(done_h=30, elapsed_h=53.7), unsaved_h=5.0, checkpoint_h=0.01)  # past: the net's
    assert not checkpoint_due(at(done_h=30, elapsed_h=40), unsaved_h=5.0, checkpoint_h=0.01)  # far: Young's interval


def test_a_run_on_spot_or_a_start_there_within_one_guard_pass_of_the_net_goes_to_on_demand():
    # 18 h of work left, 18.5 h to go: 0.1 h beyond the net's 18 + 2d, less than the guard's 10-minute pass
    near = replace(at(done_h=30, elapsed_h=53.5), pass_h=1 / 6)
    # a preemption before the next pass, even of a checkpoint a pass, crosses it; an idle job would start on spot
    # only to be moved at that pass (or be preempted past the net before it)
    for on in (Tier.spot, Tier.bubble, None):
        assert decide(near, on=on, spot_available=True) == Move.on_demand
        assert decide(replace(near, pass_h=0.05), on=on, spot_available=True) == Move.spot  # the pass fits the slack
    # a start pays its restart before the first step: with the pass it no longer fits, and the job would move off
    # spot at the next pass having paid a start for nothing; a run already on spot has paid it
    started = replace(near, pass_h=0.05, start_h=0.08)
    assert [decide(started, on=on, spot_available=True) for on in (None, Tier.spot)] == [Move.on_demand, Move.spot]
    assert not checkpoint_due(near, unsaved_h=0.5, checkpoint_h=0.01)  # at the net: on-demand, not a checkpoint


def test_a_job_whose_speed_is_not_measured_keeps_the_work_a_slower_speed_would_need():
    # 48 h estimated, 52 h to go: 3.6 h beyond the net; 20% more work (9.6 h) were it as slow as the error allows
    unsure = Progress(48.0, 0.0, 20.0, 72.0, D, unsure_h=9.6)
    measured = replace(unsure, unsure_h=0.0)
    greedy = dict(on=None, spot_available=False, uniform=False)  # waits for spot until the net
    assert decide(measured, **greedy) == Move.wait and decide(unsure, **greedy) == Move.on_demand
    for on in (None, Tier.spot):  # a spot run that turned out slow would be past the net by the time it knows
        assert decide(measured, on=on, spot_available=True) == Move.spot
        assert decide(unsure, on=on, spot_available=True) == Move.on_demand
    assert unsure.slack_h() == pytest.approx(3.6 - 9.6) and measured.slack_h() == pytest.approx(3.6)
    assert not unsure.lost(None)  # at the estimate's speed on-demand is in time: the deadline is not given up


def test_a_job_whose_quote_holds_its_odds_measures_its_speed_on_spot():
    """Where the quote found the odds hold with the speed measured on spot (Progress.measures_on_spot), the reserve
    for a speed not yet measured keeps the job off spot only while it waits with none to take: a run on spot measures
    the speed as well as one on on-demand. On on-demand it stays until measured, as any job within the reserve."""
    on_spot = Progress(48.0, 0.0, 20.0, 72.0, D, unsure_h=9.6, measures_on_spot=True)
    for on in (None, Tier.spot, Tier.bubble):
        assert decide(on_spot, on=on, spot_available=True) == Move.spot
        assert decide(replace(on_spot, measures_on_spot=False), on=on, spot_available=True) == Move.on_demand
    assert decide(on_spot, on=None, spot_available=False, uniform=False) == Move.on_demand  # waiting: the reserve
    assert decide(on_spot, on=Tier.on_demand, spot_available=True) == Move.on_demand
    # the net itself stays: without the reserve, past it
    assert decide(replace(on_spot, elapsed_h=24.0), on=Tier.spot, spot_available=True) == Move.on_demand


def test_the_server_plans_a_start_on_spot_keeping_the_guards_pass(redis_url, catalog, tmp_path):
    """The planner's Progress carries the time between the guard's passes: a job within one pass of the net starts on
    on-demand though a spot agent is idle (on spot, the guard would move it at that pass, or a preemption before it
    would cross the net); with the passes a moment apart it starts on spot, unless the start's restore takes longer
    than the slack beyond the pass (it would pay a start on spot for nothing and move a few minutes later)."""

    l4 = [o for o in catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1]
    spot, od = (
        min((o for o in l4 if o.tier == t), key=lambda o: o.price_usd_per_h) for t in (Tier.spot, Tier.on_demand)
    )
    # odds of 0.5: no reserve for a speed not yet measured
    placed = {}
    for pass_min, restore_min in ((10, 2), (1, 2), (1, 12)):
        spec = make_spec(
            resources={"accelerators": ["L4:1"]},
            work={"gpu_hours": 2},
            deadline_probability=0.5,
            checkpoint={"restore_minutes": restore_min},
        )
        net_h = exclusive_hours(spec, od) + 2 * changeover_hours(spec)
        store, clock = Store(redis_url, prefix=f"start-pass-{pass_min}-{restore_min}:"), SimulatedClock(NOW)
        server = BrokerServer(store, UniformProgress(), clock, CheckpointStore(str(tmp_path)), consumer="test")
        deadline = NOW + timedelta(hours=net_h + 0.25)  # 0.25 h beyond the net at submission, less a pass later
        Broker(store, catalog, UniformProgress(), clock).submit(spec.model_copy(update={"deadline": deadline}), "j")
        server.step()  # the guard's first pass
        clock.advance(minutes=pass_min)
        server.step()  # its next: a pass at the same time, below, is not a shorter one
        for agent in (spot, od):
            Contract(store, agent.tier.value).register(agent, 10**10, host="test", pid=0, at=clock.now())
        placed[pass_min, restore_min] = server.step()
    assert placed == {(10, 2): [("j", "on_demand")], (1, 2): [("j", "spot")], (1, 12): [("j", "on_demand")]}


def test_a_lost_deadline_run_cheapest_takes_spot_whenever_there_is_some_and_is_never_idle():
    lost = Progress(48.0, 10.0, 40.0, 72.0, D, cheapest_if_late=True)  # 38 h of work, 32 h left: lost
    assert lost.lost(None) and not at(done_h=10, elapsed_h=40).runs_cheapest(None)
    assert decide(lost, on=Tier.spot, spot_available=False) == Move.spot  # no net: it stays until preempted
    assert decide(lost, on=None, spot_available=True) == Move.spot
    assert decide(lost, on=None, spot_available=False) == Move.on_demand
    assert decide(lost, on=Tier.on_demand, spot_available=True) == Move.spot
    assert decide(lost, on=Tier.on_demand, spot_available=False) == Move.on_demand
    assert decide(lost, on=Tier.bubble, spot_available=True) == Move.on_demand  # a bubble is left at the net
    in_time = Progress(48.0, 10.0, 33.7, 72.0, D, cheapest_if_late=True)  # 38.3 h to go < 38 + 2d: the net
    assert decide(in_time, on=Tier.spot, spot_available=True) == Move.on_demand


@pytest.mark.parametrize("name", ["uniform-progress", "hedge"])
@pytest.mark.parametrize("deadline, takes", [("+8h", "L4"), ("+30h", "T4")])
def test_spot_is_the_cheapest_work_that_still_makes_the_deadline_not_the_cheapest_hour(catalog, name, deadline, takes):
    """2 GPU-hours take 5.2 h on an L4 and 9.6 h on a T4, whose hour and work are both cheaper: with 8 h to go the
    T4 is no spot for the job (it could not finish there even uninterrupted), with 30 h it is the cheaper work."""
    offers = [
        min(
            (o for o in catalog.offers if o.accelerator == a and o.accelerator_count == 1 and o.tier == t),
            key=lambda o: o.price_usd_per_h,
        )
        for a in ("L4", "T4")
        for t in (Tier.spot, Tier.on_demand)
    ]
    spec = make_spec(resources={"accelerators": ["L4:1", "T4:1"]}, work={"gpu_hours": 2}, deadline=deadline)
    plan = planning.get(name).plan([PlanItem("j", spec, submitted_at=NOW)], offers, {}, NOW)
    chosen = next(o for o in offers if o.id == plan.assignments["j"])
    assert chosen.tier == Tier.spot and chosen.accelerator == takes


def test_the_policy_places_on_spot_when_available_and_waits_when_ahead():
    spot, od = offer("s", Tier.spot, 1.0), offer("o", Tier.on_demand, 3.0)
    item = PlanItem("j", make_spec(work={"gpu_hours": 10}, deadline="+40h"))
    assert UniformProgress().plan([item], [spot, od], {spot.id: 1}, NOW).assignments == {"j": spot.id}
    waiting = UniformProgress().plan([item], [spot, od], {spot.id: 0}, NOW)
    assert waiting.assignments == {} and waiting.unplaced == {"j": "waiting for spot"}
    tight = PlanItem("t", make_spec(work={"gpu_hours": 10}, deadline="+10.3h"))  # R < C + 2d: safety net
    assert UniformProgress().plan([tight], [spot, od], {spot.id: 0}, NOW).assignments == {"t": od.id}


@pytest.mark.parametrize("name", ["uniform-progress", "hedge"])
@pytest.mark.parametrize("deadline, takes", [("+11h", "fast"), ("+40h", "slow")])
def test_a_job_sent_to_on_demand_runs_on_the_cheapest_that_finishes_it_in_time(name, deadline, takes):
    """It ran on the cheapest on-demand offer whatever its speed: with 10 h of work on the slow one, a third more
    for a speed not yet measured, and 11 h to go, it could miss there: the fast one. With 40 h to go, the cheapest."""
    slow, fast = offer("s", Tier.on_demand, 3.0), offer("f", Tier.on_demand, 8.0)
    fast = fast.model_copy(update={"speed_factor": 2.0, "instance_type": "fast"})
    spec = make_spec(work={"gpu_hours": 10}, deadline=deadline)
    fast_h = UniformProgress().options(spec, [fast], NOW)[0].exclusive_h
    item = PlanItem("j", spec, submitted_at=NOW - timedelta(hours=1), on_demand_h=fast_h, unsure=0.3)
    plan = planning.get(name).plan([item], [slow, fast], {}, NOW)
    assert plan.assignments == {"j": {"fast": fast.id, "slow": slow.id}[takes]}


@pytest.mark.parametrize("deadline, first", [("+10.5h", "fast"), ("+40h", "slow")])
def test_spot_whose_window_may_run_out_is_ranked_with_its_fall_back_to_on_demand(deadline, first):
    """8 GPU-hours: 10 h on a slow spot offer at $0.50 ($5 of work), 5 h on a fast one at $1.50 ($7.50). With
    10.5 h to go the slow one only just fits: a preemption or two and the guard moves the job to the $12-an-hour
    on-demand offer, so its work costs more than the fast one's. With 40 h to go the slow one is the cheaper work
    (price x hours ranked it first either way: an 8x A100 spot fell back to an 8x H100 at $46 an hour)."""
    slow = offer("s", Tier.spot, 0.5, hazard=0.3).model_copy(update={"speed_factor": 0.8})
    fast = offer("f", Tier.spot, 1.5, hazard=0.3).model_copy(update={"speed_factor": 1.6, "instance_type": "fast"})
    od = offer("o", Tier.on_demand, 12.0).model_copy(update={"speed_factor": 1.6, "instance_type": "fast"})
    spec = make_spec(work={"gpu_hours": 8}, deadline=deadline)
    assert [round(exclusive_hours(spec, o)) for o in (slow, fast)] == [10, 5]
    plan = planning.get("uniform-progress").plan([PlanItem("j", spec, submitted_at=NOW)], [slow, fast, od], {}, NOW)
    assert plan.assignments == {"j": {"fast": fast.id, "slow": slow.id}[first]}


@pytest.mark.parametrize(
    "deadline, sigma, first", [("+12h", 0.0, "slow"), ("+12h", 0.23, "fast"), ("+13h", 0.23, "slow")]
)
def test_spot_work_is_priced_over_the_speeds_a_job_not_yet_measured_may_have(deadline, sigma, first):
    """8 GPU-hours, 10 h on a slow spot offer at $0.50, 5 h on a fast one at $1.50, rarely preempted. With 12 h to go
    the slow one fits at the estimate, but a job 20% slower than estimated would not finish there and moves to the
    $12-an-hour on-demand: while its speed is not measured (log sd 0.23), the fast one is the cheaper work. With
    13 h the slow one keeps room for most of those speeds (pretrain-gpt-1b3 at 3.75x its on-demand time ran on 8x
    A100 spot that fit only at its estimate: $19.42, now $11.42 on 8x H100 spot)."""
    slow = offer("s", Tier.spot, 0.5, hazard=0.02).model_copy(update={"speed_factor": 0.8})
    fast = offer("f", Tier.spot, 1.5, hazard=0.02).model_copy(update={"speed_factor": 1.6, "instance_type": "fast"})
    od = offer("o", Tier.on_demand, 12.0).model_copy(update={"speed_factor": 1.6, "instance_type": "fast"})
    item = PlanItem("j", make_spec(work={"gpu_hours": 8}, deadline=deadline), submitted_at=NOW, speed_sigma=sigma)
    plan = planning.get("uniform-progress").plan([item], [slow, fast, od], {}, NOW)
    assert plan.assignments == {"j": {"fast": fast.id, "slow": slow.id}[first]}


def test_a_round_without_an_idle_on_demand_agent_measures_the_work_on_the_quoted_on_demand_offer():
    """A round's offers are its idle agents'. With none on on-demand, the work left is still the job's on-demand
    hours as quoted (as the guard measures it), not endless: a job inside the safety net waits for on-demand
    rather than running cheapest on spot as if its deadline were lost (the guard moved it off at its next pass),
    and a roomy job with `if_late: soonest` still takes spot."""
    spot, od = offer("s", Tier.spot, 1.0), offer("o", Tier.on_demand, 3.0)
    od_h = UniformProgress().options(make_spec(work={"gpu_hours": 10}), [od], NOW)[0].exclusive_h
    tight = PlanItem("t", make_spec(work={"gpu_hours": 10}, deadline="+10.3h"), on_demand_h=od_h)  # in the net
    roomy = PlanItem("r", make_spec(work={"gpu_hours": 10}, deadline="+40h", if_late="soonest"), on_demand_h=od_h)
    plan = UniformProgress().plan([tight, roomy], [spot], {spot.id: 2}, NOW)
    assert plan.assignments == {"r": spot.id} and plan.unplaced == {"t": "capacity"}


def test_lost_deadlines_run_cheapest_are_planned_after_the_jobs_that_can_still_make_theirs():
    spot, od = offer("s", Tier.spot, 1.0), offer("o", Tier.on_demand, 3.0)
    lost = PlanItem("lost", make_spec(work={"gpu_hours": 10}, deadline="+8h"))  # on-demand needs 10 h
    soonest = PlanItem("soonest", make_spec(work={"gpu_hours": 10}, deadline="+8h", if_late="soonest"))
    ahead = PlanItem("ahead", make_spec(work={"gpu_hours": 10}, deadline="+40h"))
    plan = UniformProgress().plan([lost, ahead], [spot, od], {spot.id: 1}, NOW)
    assert plan.assignments == {"ahead": spot.id, "lost": od.id}  # never idle: on-demand when no spot is left
    plan = UniformProgress().plan([lost, ahead], [spot, od], {spot.id: 2}, NOW)
    assert plan.assignments == {"ahead": spot.id, "lost": spot.id}  # spot nobody in time needs: taken
    plan = UniformProgress().plan([soonest, ahead], [spot, od], {spot.id: 2}, NOW)
    assert plan.assignments == {"soonest": od.id, "ahead": spot.id}  # Can't Be Late's net

    extend = PlanItem("extend", make_spec(work={"gpu_hours": 10}, deadline="+8h", if_late="extend"))
    plan = UniformProgress().plan([extend, ahead], [spot, od], {spot.id: 1}, NOW)
    assert plan.assignments == {"ahead": spot.id} and plan.unplaced == {"extend": "waiting for spot"}


def test_a_lost_deadline_with_if_late_extend_runs_to_a_second_window_by_the_rule():
    """30 h of on-demand work, 24 h to the deadline: lost. `extend` gives it 48 h from submit, in which it is ahead
    of its pace at the start (it waits for spot, where `cheapest` takes on-demand) and behind later (on-demand)."""
    first = Progress(30.0, 0.0, 0.0, 24.0, D, cheapest_if_late=True, extends=True)
    second = first.in_window(None)
    assert (second.window_h, second.extended) == (48.0, True) and second.in_window(None) == second
    assert decide(second, on=None, spot_available=False) == Move.wait
    assert decide(replace(first, extends=False), on=None, spot_available=False) == Move.on_demand  # cheapest
    behind = replace(first, elapsed_h=20.0, done_h=5.0).in_window(None)  # ep(20) = 12.5 h: behind
    assert behind.extended and decide(behind, on=None, spot_available=False) == Move.on_demand
    assert decide(behind, on=None, spot_available=True) == Move.spot  # spot is taken whenever there is some
    in_time = Progress(20.0, 0.0, 0.0, 24.0, D, cheapest_if_late=True, extends=True)
    assert in_time.in_window(None) == in_time  # not lost: its own window
    lost_again = replace(first, elapsed_h=40.0, done_h=20.0).in_window(None)  # 10 h left, 8 h to the second end
    assert lost_again.runs_cheapest(None) and decide(lost_again, on=None, spot_available=False) == Move.on_demand
    on_od = Progress(30.0, 6.0, 0.0, 24.0, D, cheapest_if_late=True, extends=True)  # 24 h left in 24 h: on it
    assert not on_od.in_window(Tier.on_demand).extended and on_od.in_window(None).extended  # a changeover short
