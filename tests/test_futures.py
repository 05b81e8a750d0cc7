"""A job played out on availability futures (models/futures.py) and the slots other jobs hold (models/contention.py)."""

from dataclasses import replace

import numpy as np
import pytest

from broker.models.contention import launchable
from broker.models.futures import Hedge, Setting, simulate


def _setting(**changes) -> Setting:
    base = dict(
        work_h=10.0,
        od_work_h=10.0,
        spot_prices=(1.0,),
        od_price=3.0,
        restart_h=0.1,
        checkpoint_h=0.0,
        interval_h=1.0,
        window_h=20.0,
        rule="greedy",
    )
    return Setting(**{**base, **changes})


def test_always_available_spot_costs_the_work_plus_one_restart():
    out = simulate(_setting(), np.ones((1, 3, 200), dtype=bool), 1 / 6)
    assert out.cost_usd == pytest.approx(np.full(3, 10.1)) and out.finish_h == pytest.approx(np.full(3, 10.1))


def test_without_spot_the_safety_net_moves_the_job_to_on_demand_in_time():
    out = simulate(_setting(), np.zeros((1, 2, 200), dtype=bool), 1 / 6)
    assert (out.finish_h <= 20.0).all() and out.od_h == pytest.approx(np.full(2, 10.1))
    blind = simulate(_setting(rule="spot-only"), np.zeros((1, 2, 200), dtype=bool), 1 / 6)
    assert np.isinf(blind.finish_h).all() and (blind.cost_usd == 0).all()


def test_the_safety_net_keeps_the_changeover_the_live_guard_counts_not_only_the_restart_paid():
    available = np.zeros((1, 1, 200), dtype=bool)  # no spot: the job waits (greedy) for the net
    paid = simulate(_setting(), available, 1 / 6)
    counted = simulate(_setting(changeover_h=0.5), available, 1 / 6)
    # the net fires when time left < 10 h + 2 changeovers + a tick (the guard's pass) + the restart a start on spot
    # would pay (the job waits): the first tick past 9.53 h with 0.1 h, past 8.73 h with 0.5 h
    assert paid.finish_h[0] == pytest.approx(9 + 4 / 6 + 0.1 + 10)
    assert counted.finish_h[0] == pytest.approx(8 + 5 / 6 + 0.1 + 10)
    assert counted.od_h[0] == pytest.approx(paid.od_h[0])  # the restart paid is the same


def test_the_rule_sees_the_estimate_until_the_speed_is_measured_and_keeps_a_reserve_for_it():
    """The estimate says 10 h on on-demand; the job is slower, 12 h. 14 h to go and no spot for the first 3 h.
    Knowing its speed, greedy waits until the net (at 1.5 h) and makes it. Believing the estimate, it waits until spot
    comes at 3 h, learns its speed half an hour in and misses. With the reserve for a slower speed (30%, 13 h), it
    goes on-demand at 0.5 h and makes it. A job as fast as estimated, on spot from the start, stays there: its
    progress takes the reserve down faster than time passes, and half an hour in its speed is measured. One whose
    window holds the work but not the reserve starts on on-demand and leaves it once measured."""
    available = np.ones((1, 1, 200), dtype=bool)
    available[0, 0, :30] = False
    slow = dict(work_h=12.0, od_work_h=12.0, window_h=14.0, changeover_h=0.25, interval_h=None)
    known = simulate(_setting(**slow), available, 0.1)
    believed = _setting(**slow, od_estimate_h=10.0, measured_after_h=0.5)
    blind = simulate(believed, available, 0.1)
    reserved = simulate(replace(believed, unmeasured_margin=0.3), available, 0.1)
    assert known.finish_h[0] <= 14.0 and known.od_h[0] == pytest.approx(12.1)
    assert blind.finish_h[0] > 14.0 and blind.spot_h[0] == pytest.approx(0.6, abs=0.11)  # measured, then the net
    assert reserved.finish_h[0] <= 14.0 and reserved.od_h[0] == pytest.approx(12.1) and reserved.spot_h[0] == 0
    assert reserved.finish_h[0] < known.finish_h[0]  # it went sooner than the known speed's net needed
    as_estimated = replace(believed, work_h=10.0, od_work_h=10.0, unmeasured_margin=0.3)
    on_spot = simulate(as_estimated, np.ones((1, 1, 200), dtype=bool), 0.1)
    assert on_spot.od_h[0] == 0 and on_spot.finish_h[0] == pytest.approx(10.1)
    # 13.3 h to go: the reserve (13 h + 2d) does not fit, so it starts on on-demand, but not to the end: measured as
    # fast as estimated, Uniform Progress leaves on-demand once ahead, as the live guard would
    tight = simulate(replace(as_estimated, window_h=13.3, rule="uniform"), np.ones((1, 1, 200), dtype=bool), 0.1)
    assert 1.0 < tight.od_h[0] < 3.0 and tight.spot_h[0] > 7.0 and tight.finish_h[0] <= 13.3
    # where the quote found the odds hold with the speed measured on spot, it starts there and stays; while it waits
    # with no spot (the first 3 h), the reserve still sends it to on-demand
    spot_first = replace(as_estimated, window_h=13.3, rule="uniform", measures_on_spot=True)
    measured_on_spot = simulate(spot_first, np.ones((1, 1, 200), dtype=bool), 0.1)
    assert measured_on_spot.od_h[0] == 0 and measured_on_spot.finish_h[0] == pytest.approx(10.1)
    waiting = simulate(spot_first, available, 0.1)
    assert waiting.od_h[0] > 0.5 and waiting.finish_h[0] <= 13.3
    believed_h, reserve = replace(believed, unmeasured_margin=0.3).believed_od_h(np.array([0.4, 0.5]))
    assert believed_h == pytest.approx([10.0, 12.0]) and reserve == pytest.approx([0.3, 0.0])  # measured at 0.5 h


def test_a_preemption_loses_the_work_since_the_last_checkpoint():
    available = np.ones((1, 1, 200), dtype=bool)
    available[0, 0, 10] = False  # preempted after 1 h 40 min, back 10 minutes later
    hourly = simulate(_setting(), available, 1 / 6)
    never = simulate(_setting(interval_h=None), available, 1 / 6)
    assert hourly.finish_h[0] < never.finish_h[0]
    assert never.finish_h[0] == pytest.approx(11 / 6 + 0.1 + 10, abs=1e-6)  # all its progress lost
    # checkpointed on the cloud's notice (the agents do, risk.notice_loss_h): only the notice's 2 minutes are lost
    noticed = simulate(_setting(interval_h=None, notice_h=2 / 60), available, 1 / 6)
    progress_h = 10 / 6 - 0.1  # ten ticks less the restart
    assert noticed.finish_h[0] == pytest.approx(11 / 6 + 0.1 + 10 - progress_h + 2 / 60, abs=1e-6)


def test_each_future_counts_the_runs_spot_took_back():
    available = np.ones((1, 3, 200), dtype=bool)
    available[0, 1, 10] = False  # one gap in the second future
    available[0, 2, [10, 30]] = False  # two in the third
    out = simulate(_setting(), available, 1 / 6)
    assert out.preemptions.tolist() == [0, 1, 2]
    waiting = np.zeros((1, 1, 200), dtype=bool)
    waiting[0, 0, 5:] = True
    waiting[0, 0, 70] = False  # a gap after the net sent the job to on-demand: nothing of it runs on spot
    assert simulate(_setting(window_h=11.0), waiting, 1 / 6).preemptions.tolist() == [0]


def test_near_the_net_a_run_checkpoints_so_that_a_preemption_does_not_cost_the_deadline():
    """10 h of work, 11.5 h to go, a checkpoint every 5 h of progress, and spot gone for good at 8.33 h. With the
    periodic checkpoint alone the preemption falls back to 5 h of work: on-demand from then finishes at 13.4 h. Near the
    net the run checkpoints whenever a preemption would cross it (planning/uniform_progress.checkpoint_due), so
    on-demand from its newest checkpoint still makes the deadline; each write is paid."""
    available = np.ones((1, 1, 120), dtype=bool)
    available[0, 0, 50:] = False
    free = simulate(_setting(window_h=11.5, interval_h=5.0, changeover_h=0.3), available, 1 / 6)
    paid = simulate(_setting(window_h=11.5, interval_h=5.0, changeover_h=0.3, checkpoint_h=0.01), available, 1 / 6)
    for out in (free, paid):
        assert out.finish_h[0] <= 11.5 and out.spot_h[0] == pytest.approx(50 / 6)
    assert 0.1 + 10 - 50 / 6 < free.od_h[0] < 0.1 + 10 - 50 / 6 + 1.0  # less than the net's margin of work was lost
    assert paid.cost_usd[0] > free.cost_usd[0]


def test_on_spot_within_a_tick_of_the_net_the_run_goes_to_on_demand():
    """The guard looks once a tick: a run on spot within a tick of the net may be preempted past it before the guard
    can act, even checkpointed every pass, so off on-demand the net keeps a tick more (Progress.pass_h live): a job
    there starts on on-demand, not on spot it would leave a tick later."""
    available = np.ones((1, 1, 120), dtype=bool)
    tight = simulate(_setting(window_h=10.8, changeover_h=0.3), available, 1 / 6)  # 0.1 h past the net's 0.6 h
    loose = simulate(_setting(window_h=11.0, changeover_h=0.3), available, 1 / 6)  # 0.3 h: more than a tick
    start = simulate(_setting(window_h=10.7, changeover_h=0.3), available, 1 / 6)  # at the start, within a tick
    assert tight.od_h[0] > 9.5 and tight.finish_h[0] <= 10.8
    assert start.spot_h[0] == 0 and start.finish_h[0] == pytest.approx(10.1)
    assert loose.od_h[0] == 0 and loose.finish_h[0] == pytest.approx(10.1)


def test_where_the_notice_bounds_a_preemptions_loss_the_net_keeps_the_live_guards_pass_not_a_tick():
    """The live guard looks every second (Setting.pass_h). Where the job checkpoints on the cloud's notice, a
    preemption before it looks again loses at most the notice's lead, which the net's changeovers cover: 0.2 h from
    the net the job starts on spot and stays, where a guard that looks once a tick sends it to on-demand. Without a
    notice the tick stays. Preempted for good near the end, it still makes it on on-demand."""
    available = np.ones((1, 1, 120), dtype=bool)
    live = dict(window_h=10.8, changeover_h=0.3, pass_h=1 / 3600)
    on_spot = simulate(_setting(**live, notice_h=2 / 60), available, 1 / 6)
    assert on_spot.od_h[0] == 0 and on_spot.finish_h[0] == pytest.approx(10.1)
    no_notice = simulate(_setting(**live), available, 1 / 6)
    ticked = simulate(_setting(window_h=10.8, changeover_h=0.3, notice_h=2 / 60), available, 1 / 6)
    assert no_notice.od_h[0] > 9.5 and ticked.od_h[0] > 9.5
    gone = available.copy()
    gone[..., 30:] = False  # spot gone from 5 h on
    preempted = simulate(_setting(**live, notice_h=2 / 60), gone, 1 / 6)
    assert preempted.od_h[0] > 5.0 and preempted.finish_h[0] <= 10.8


def test_hedge_goes_back_to_spot_only_with_the_slack_for_a_changeover_and_a_tick():
    """Back on spot with the slack of one changeover only, a job is within a tick of the net: the next tick moves it
    to on-demand again, two changeovers for nothing (planning/hedge.leaves_on_demand keeps the guard's pass)."""
    market = Hedge(np.arange(50) * 100.0, 100.0, (), 100.0)  # gaps that never end, up-spells of 100 h
    available = np.zeros((1, 1, 120), dtype=bool)
    available[:, :, 6:] = True  # spot from the first hour on; on-demand until then
    # an hour in, 9.1 h of work left: 0.2 h of slack beyond the net (one changeover of 0.1 h, not a tick more)
    tight = simulate(_setting(rule="hedge", window_h=10.5), available, 1 / 6, market)
    roomy = simulate(_setting(rule="hedge", window_h=10.7), available, 1 / 6, market)  # 0.4 h of slack
    assert tight.spot_h[0] == 0 and tight.finish_h[0] == pytest.approx(10.1)
    assert roomy.spot_h[0] > 9 and roomy.finish_h[0] <= 10.7


def test_uniform_progress_leaves_on_demand_to_wait_for_spot_once_ahead():
    """Can't Be Late's rule, as the live guard runs it (planning/uniform_progress.leaves_on_demand_to_wait): past
    ep(t + 2d) a job leaves on-demand to wait for spot even with none free, and catches spot when it comes; with no
    spot at all that is a changeover each time it falls behind again."""
    none = np.zeros((1, 1, 200), dtype=bool)
    never = simulate(_setting(rule="uniform"), none, 1 / 6)
    assert never.od_h[0] > 12 and never.finish_h[0] > 19  # 21 changeovers more, idle near half the window
    later = np.zeros((1, 1, 200), dtype=bool)
    later[:, :, 30:] = True  # spot from the fifth hour on
    caught = simulate(_setting(rule="uniform"), later, 1 / 6)
    assert caught.spot_h[0] > 4 and caught.od_h[0] < 5


def test_hedge_leaves_on_demand_to_wait_in_a_queue_not_in_a_long_gap():
    """Under hedge a job on on-demand, ahead of its line, leaves to wait for spot where the rule would have it wait:
    in a queue (spot up, other jobs hold it) until a slot frees, not in a market gap older than it waits out."""
    market = Hedge(np.arange(50) * 100.0, 100.0, (), 100.0)  # gaps that never end: it waits none of them out
    up = np.ones((1, 1, 200), dtype=bool)
    queue = np.zeros((1, 1, 200), dtype=bool)
    queue[:, :, 30:] = True  # a slot frees for the job from the fifth hour on
    queued = simulate(_setting(rule="hedge", window_h=20.0), up, 1 / 6, market, launchable=queue)
    gap = simulate(_setting(rule="hedge", window_h=20.0), np.zeros_like(up), 1 / 6, market)
    # past ep(t + 2d) it waits in the queue rather than pay on-demand until the slot frees (4.8 h on it otherwise)
    assert queued.od_h[0] == pytest.approx(3.0) and queued.spot_h[0] > 7
    assert gap.od_h[0] == pytest.approx(10.1) and gap.spot_h[0] == 0  # on-demand once, to the end


def test_hedge_counts_its_wait_in_a_gap_from_when_the_job_went_idle():
    """Idle in a gap, hedge waits a* counted from when the job went idle (the live rule's idle_since), not from the
    gap's start: a job that left on-demand mid-gap waits its a* again before it goes back. With no spot at all that is
    a changeover every few hours (10.6 h on on-demand for 10 h of work), not one each tick past a*."""
    market = Hedge(np.arange(50) * 0.3, 100.0, (), 100.0)  # a wait of a few ticks is affordable
    out = simulate(_setting(rule="hedge", window_h=20.0), np.zeros((1, 1, 200), dtype=bool), 1 / 6, market)
    assert out.od_h[0] == pytest.approx(10.6) and out.finish_h[0] <= 20.0


def test_a_run_its_shrinking_pool_took_back_starts_again_there_at_once_not_in_a_dearer_zone():
    up = np.ones((2, 1, 200), dtype=bool)
    survives = up.copy()
    survives[0, 0, 10] = False  # the cheap zone's pool took back the job's instance, and stayed up
    setting = _setting(spot_prices=(1.0, 2.0), interval_h=None)
    again = simulate(setting, survives, 1 / 6, launchable=up)
    assert again.preemptions.tolist() == [1] and again.finish_h[0] == pytest.approx(10 / 6 + 0.1 + 10, abs=1e-6)
    assert again.cost_usd[0] == pytest.approx(again.spot_h[0])  # all of it in the cheap zone, at $1 an hour
    gone = simulate(setting, survives, 1 / 6)  # read as the zone down: it starts again in the dear zone
    assert gone.cost_usd[0] == pytest.approx(10 / 6 + 2 * 10.1, abs=1e-6)


def test_the_next_zone_takes_the_job_when_the_cheapest_has_no_capacity():
    available = np.zeros((2, 1, 200), dtype=bool)
    available[1] = True
    out = simulate(_setting(spot_prices=(1.0, 2.0)), available, 1 / 6)
    assert out.cost_usd[0] == pytest.approx(2 * 10.1)


def test_other_jobs_hold_the_cheapest_slots_for_the_hours_they_have_left():
    available = np.ones((3, 1, 6), dtype=bool)
    available[2, 0, :] = False  # the third zone has no spot
    free = launchable(available, np.array([1, 2, 5]), np.array([4, 2]))
    assert free[0, 0].tolist() == [False] * 4 + [True] * 2  # the first other job holds zone 0 for 4 ticks
    assert free[1, 0].tolist() == [True] * 6  # the second takes one of zone 1's two slots
    assert not free[2].any()  # slots where spot is down are no slots
    running_in_dear = np.zeros((3, 6))
    running_in_dear[1, :3] = 2  # both of zone 1's slots held by jobs running there, for 3 ticks
    free = launchable(available, np.array([1, 2, 5]), np.array([], dtype=int), pinned=running_in_dear)
    assert free[0, 0].all() and free[1, 0].tolist() == [False] * 3 + [True] * 3  # zone 0 stays free


def test_a_job_starts_where_a_slot_is_free_and_is_not_evicted_when_others_want_it():
    setting = _setting(spot_prices=(1.0, 2.0))
    available = np.ones((2, 1, 200), dtype=bool)
    alone = simulate(setting, available, 1 / 6)
    crowded = launchable(available, np.array([1, 1]), np.array([30]))  # zone 0 taken for 5 h
    late = simulate(setting, available, 1 / 6, launchable=crowded)
    assert alone.cost_usd[0] == pytest.approx(10.1)
    assert late.cost_usd[0] == pytest.approx(2 * 10.1)  # started in zone 1 and stayed: no eviction, no move
    both_taken = launchable(available, np.array([1, 1]), np.array([30, 30]))
    waited = simulate(setting, available, 1 / 6, launchable=both_taken)
    assert waited.finish_h[0] == pytest.approx(5 + 10.1) and waited.cost_usd[0] == pytest.approx(10.1)


def test_a_slower_zone_takes_longer_and_a_run_moves_only_to_a_cheaper_zone_as_fast():
    always = np.ones((2, 1, 400), dtype=bool)
    slow_only = np.stack([np.zeros((1, 400), dtype=bool), np.ones((1, 400), dtype=bool)])
    paced = _setting(spot_prices=(0.5, 1.0), zone_pace=(1.0, 2.0), window_h=40.0)
    assert simulate(paced, slow_only, 0.1).spot_h[0] == pytest.approx(0.1 + 20.0)  # twice the work's hours there
    # on the cheap but slower zone from the start, it stays: a move to the dearer, faster zone saves nothing
    cheap_slow = replace(paced, spot_prices=(0.5, 1.0), zone_pace=(2.0, 1.0), rule="hedge")
    hedge = Hedge.from_spells(np.array([400]), np.array([1]), 0.1, 50)
    assert simulate(cheap_slow, always, 0.1, hedge).spot_h[0] == pytest.approx(0.1 + 20.0)
    # begun on the dear, fast zone while the cheap one is down, it does not move to the cheap one when it is slower
    later = always.copy()
    later[0, :, :5] = False
    fast_first = replace(cheap_slow, spot_prices=(0.5, 1.0), zone_pace=(2.0, 1.0))
    assert simulate(fast_first, later, 0.1, hedge).cost_usd[0] == pytest.approx(1.0 * 10.1)
    same_pace = replace(fast_first, zone_pace=(1.0, 1.0))
    assert simulate(same_pace, later, 0.1, hedge).cost_usd[0] < 8.0  # as fast: it follows the cheaper zone


def test_jobs_still_to_arrive_hold_slots_at_the_rate_jobs_came_for_as_long_as_they_ran():
    from broker.models.contention import arrivals

    held = arrivals(np.random.default_rng(0), 4000, 20, 0.5, np.array([4]))  # one job every 2 ticks, 4 ticks each
    assert held[:, 0].mean() == pytest.approx(0.5, abs=0.05)
    assert held[:, 10:].mean() == pytest.approx(2.0, abs=0.05)  # Little's law: rate x time held
    assert not arrivals(np.random.default_rng(0), 10, 20, 0.0, np.array([4])).any()
