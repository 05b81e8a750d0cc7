"""Expected cost to go under the market model (models/cost_to_go.py) and the futures' rule that plays it."""

from datetime import timedelta
from functools import cache

import numpy as np
import pytest
from test_uniform_progress import offer

from broker import planning
from broker.core.forecast import forecast
from broker.core.hedging import MarketHedge
from broker.domain.model import AgentInfo, Tier
from broker.models.cost_to_go import IDLE, OD, SPOT, CostToGo, SpellChain
from broker.models.futures import Hedge, Setting, simulate
from broker.models.risk import exclusive_hours
from broker.planning.option_table import PlanItem
from broker.planning.uniform_progress import Progress
from broker.pricing.availability import MarketModel, ZoneModel
from conftest import NOW, make_spec

TICK_H = 0.1


def test_a_spells_chance_to_end_is_read_by_age_and_the_tail_by_its_mean_residual():
    chain = SpellChain.from_spells(up=[1, 1, 2, 4], down=[3], ages=3)
    up = chain.ends[1]
    assert up[0] == pytest.approx(0.5)  # 2 of 4 spells end after their first tick
    assert up[1] == pytest.approx(0.5)  # 1 of the 2 left ends after its second
    assert up[2] == pytest.approx(0.5)  # past age 2 only the 4-tick spell: 2 more ticks on average
    assert chain.ends[0][:2] == pytest.approx([1e-3, 1e-3])  # a 3-tick gap never ends before its third tick


def brute_force(chain: SpellChain, spot: float, od: float, restart: int, shrink: float = 0.0):
    """The same program written as a recursion over single states: the reference for the vectorised solve."""
    ends, ages = chain.ends, chain.ends.shape[1]

    @cache
    def value(left: int, work: int, up: int, age: int, on: int) -> float:
        if work <= 0:
            return 0.0
        if left == 0:
            return 1e9
        if on == SPOT and not up:
            on = IDLE  # preempted

        def after(work_next: int, move: int) -> float:
            older = min(age + 1, ages - 1)
            stay = value(left - 1, work_next, up, older, move)
            if move == SPOT and up:  # the pool shrinks under the run while it stays up
                stay = (1 - shrink) * stay + shrink * value(left - 1, work_next, up, older, IDLE)
            turn = value(left - 1, work_next, 1 - up, 0, move)
            return (1 - ends[up, age]) * stay + ends[up, age] * turn

        options = [after(work, IDLE)]
        for move, price in ((SPOT, spot), (OD, od)):
            if move == SPOT and not up:
                continue
            extra = 0 if on == move else restart
            options.append(price * TICK_H + after(work - 1 + extra, move))
        return min(min(options), 1e9)

    return value


@pytest.mark.parametrize("seed, shrink", [(0, 0.0), (1, 0.0), (2, 0.0), (3, 0.2)])
def test_the_vectorised_solve_has_the_recursions_expected_costs(seed, shrink):
    rng = np.random.default_rng(seed)
    chain = SpellChain.from_spells(rng.integers(1, 6, 30), rng.integers(1, 4, 30), ages=3)
    ticks = 9
    table = CostToGo.solve(chain, ticks, spot_usd=1.0, od_usd=3.0, tick_h=TICK_H, restart_ticks=2, shrink=shrink)
    value = brute_force(chain, 1.0, 3.0, 2, shrink)
    for work in range(ticks + 1):
        for up in (0, 1):
            for age in range(3):
                for on in (IDLE, SPOT, OD):
                    assert table.cost[work, up, age, on] == pytest.approx(value(ticks, work, up, age, on), rel=1e-9)


def test_in_a_gap_it_waits_while_the_slack_affords_it_and_pays_on_demand_when_it_does_not():
    chain = SpellChain.from_spells(np.full(20, 50), np.full(20, 5))  # gaps of 0.5 h, up-spells of 5 h
    table = CostToGo.solve(chain, 200, spot_usd=1.0, od_usd=3.0, tick_h=TICK_H, restart_ticks=2)
    assert table.move(left=200, work=100, up=False, age=0, on=IDLE) == IDLE  # 10 h of slack: wait the gap out
    assert table.move(left=102, work=100, up=False, age=0, on=IDLE) == OD  # exactly the changeover to spare
    assert table.move(left=200, work=100, up=True, age=0, on=IDLE) == SPOT
    # every up-spell lasts 5 h: one that has lasted 1 h ends sooner than a new one, so with the slack to spare it
    # waits for the next (one preemption and changeover fewer)
    assert table.move(left=200, work=100, up=True, age=10, on=IDLE) == IDLE
    assert table.move(left=120, work=100, up=True, age=10, on=IDLE) == SPOT
    assert table.move(left=90, work=100, up=True, age=10, on=IDLE) == OD  # lost: the soonest finish


def market(rng, futures: int, ticks: int, up_mean: float, down_mean: float) -> np.ndarray:
    """Futures of geometric up and down spells (the chain below is fitted on the same process)."""
    out = np.empty((futures, ticks), dtype=bool)
    state = rng.random(futures) < up_mean / (up_mean + down_mean)
    for t in range(ticks):
        flip = rng.random(futures) < np.where(state, 1 / up_mean, 1 / down_mean)
        state = np.where(flip, ~state, state)
        out[:, t] = state
    return out


def test_its_moves_meet_every_deadline_in_its_own_market_for_less_than_uniform_progress():
    rng = np.random.default_rng(7)
    up = rng.geometric(1 / 30, 400)
    down = rng.geometric(1 / 15, 400)
    hedge = Hedge.from_spells(up, down, TICK_H, 300).planned(300, spot_usd=1.0, od_usd=3.0, changeover_h=0.2)
    available = market(rng, 300, 300, 30, 15)[None]

    def run(rule: str):  # 20 h of work due in 30 h, spot $1/h, on-demand $3/h, d = 0.2 h
        setting = Setting(20.0, 20.0, (1.0,), 3.0, 0.2, 0.0, None, 30.0, rule, keeps_progress=True)
        return simulate(setting, available, TICK_H, hedge)

    runs = {rule: run(rule) for rule in ("uniform", "cost-to-go")}
    assert (runs["cost-to-go"].finish_h <= 30.0 + 1e-9).all()
    assert runs["cost-to-go"].cost_usd.mean() < 0.95 * runs["uniform"].cost_usd.mean()


def test_the_rule_needs_the_hedges_moves():
    hedge = Hedge.from_spells(np.full(5, 10), np.full(5, 2), TICK_H, 50)
    setting = Setting(1.0, 1.0, (1.0,), 3.0, 0.2, 0.0, None, 5.0, "cost-to-go", keeps_progress=True)
    with pytest.raises(ValueError, match="Hedge.planned"):
        simulate(setting, np.ones((1, 1, 50), dtype=bool), TICK_H, hedge)


def market_of_gaps(gap_ticks: int):
    """The Broker's view of a one-zone market (core/hedging.MarketHedge) whose spot gaps last `gap_ticks` ticks."""
    spot, od = offer("s", Tier.spot, 1.0), offer("o", Tier.on_demand, 3.0)
    zone = ZoneModel("aws", "s", "x", TICK_H, np.full(40, 100), np.full(40, gap_ticks))
    model = MarketModel(TICK_H, {("aws", "s", "x"): zone})
    return MarketHedge(lambda: model, lambda: [spot, od]), spot, od


@pytest.mark.parametrize("waited_h", [1.5, 3.0])
def test_in_a_gap_the_policy_waits_where_hedges_threshold_pays_on_demand(waited_h):
    """10 h of work due in 12 h, idle in a 3 h gap: hedge's a* is spent, so it pays on-demand. Waiting is free until
    the safety net, and spot may come back before it: the least expected cost to go is to wait."""
    market, spot, od = market_of_gaps(30)
    spec = make_spec(work={"gpu_hours": 10}, deadline="+12h")
    item = PlanItem("j", spec, submitted_at=NOW, idle_since=NOW - timedelta(hours=waited_h))

    def placed(name: str) -> dict:
        policy = planning.get(name, hedge=market, live_spot=lambda: [])
        return policy.plan([item], [spot, od], {spot.id: 0}, NOW).assignments

    assert placed("hedge") == {"j": od.id}
    assert placed("cost-to-go") == {}
    net = PlanItem("j", make_spec(work={"gpu_hours": 10}, deadline="+10.2h"), submitted_at=NOW, idle_since=NOW)
    assert planning.get("cost-to-go", hedge=market).plan([net], [spot, od], {spot.id: 0}, NOW).assignments == {
        "j": od.id
    }


def flickering_market():
    """One zone whose up-spells mostly last a tick (9 in 10), the rest 40 h: a spell just begun is likely a flicker,
    one that has lasted half an hour is a long one."""
    spot, od = offer("s", Tier.spot, 1.0), offer("o", Tier.on_demand, 3.0)
    zone = ZoneModel("aws", "s", "x", TICK_H, np.r_[np.full(90, 1), np.full(10, 400)], np.full(100, 30))
    model = MarketModel(TICK_H, {("aws", "s", "x"): zone})
    return MarketHedge(lambda: model, lambda: [spot, od]), spot, od


@pytest.mark.parametrize("up_h, leaves", [(0.0, False), (0.5, True), (5.0, True)])
def test_from_on_demand_it_goes_back_to_a_spell_that_has_lasted_not_to_one_just_begun(up_h, leaves):
    """The spell's age is the oldest live spot agent's: capacity that has lasted that long."""
    market, spot, od = flickering_market()
    item = PlanItem("j", make_spec(work={"gpu_hours": 10}, deadline="+20h"), submitted_at=NOW)
    progress = Progress(total_h=10.0, done_h=2.0, elapsed_h=2.0, window_h=20.0, changeover_h=0.2)
    agent = AgentInfo(id="a", offer=spot, host="test", pid=0, registered_at=NOW - timedelta(hours=up_h))
    policy = planning.get("cost-to-go", hedge=market, live_spot=lambda: [agent])
    assert policy.leaves_on_demand(item, progress, spot, od, NOW) == leaves


def test_it_counts_the_work_left_on_spot_where_spot_is_slower_than_its_on_demand():
    """Progress is measured on on-demand; the table counts work on its spot zone. 8 h left on an on-demand H100 is
    far more on a spot A100: with 11 h to the deadline the job must stay, though 8 h would fit on spot."""
    market, spot, od = flickering_market()
    h100 = od.model_copy(update={"accelerator": "H100", "gpu_memory_gb": 80})
    spec = make_spec(work={"gpu_hours": 10}, deadline="+13h", resources={"accelerators": ["A100:1", "H100:1"]})
    slower = exclusive_hours(spec, spot) / exclusive_hours(spec, h100)
    assert slower > 11 / 8  # 8 h on the H100 is more than 11 h on the A100
    item = PlanItem("j", spec, submitted_at=NOW)
    progress = Progress(total_h=10.0, done_h=2.0, elapsed_h=2.0, window_h=13.0, changeover_h=0.2)
    agent = AgentInfo(id="a", offer=spot, host="test", pid=0, registered_at=NOW - timedelta(hours=5))
    policy = planning.get("cost-to-go", hedge=market, live_spot=lambda: [agent])
    assert not policy.leaves_on_demand(item, progress, spot, h100, NOW)
    same = Progress(total_h=10.0, done_h=2.0, elapsed_h=2.0, window_h=13.0, changeover_h=0.2)
    assert policy.leaves_on_demand(item, same, spot, od, NOW)  # the same work on an A100: spot has time for it


@pytest.mark.parametrize("size_gb, leaves", [(1.0, True), (2000.0, False)])
def test_it_goes_back_to_spot_only_where_the_work_a_preemption_loses_is_worth_it(size_gb, leaves):
    """Spot comes and goes every 2 h. A job that checkpoints in seconds loses little to a preemption and goes back;
    one whose checkpoint takes long writes seldom (Young's interval) and loses 1.5 h a preemption: it stays."""
    spot, od = offer("s", Tier.spot, 1.0).model_copy(update={"hazard_per_h": 0.5}), offer("o", Tier.on_demand, 3.0)
    zone = ZoneModel("aws", "s", "x", TICK_H, np.full(40, 20), np.full(40, 5))
    model = MarketModel(TICK_H, {("aws", "s", "x"): zone})
    spec = make_spec(work={"gpu_hours": 10}, deadline="+14h", checkpoint={"size_gb": size_gb})
    item = PlanItem("j", spec, submitted_at=NOW)
    progress = Progress(total_h=10.0, done_h=2.0, elapsed_h=3.0, window_h=14.0, changeover_h=0.2)
    agent = AgentInfo(id="a", offer=spot, host="test", pid=0, registered_at=NOW - timedelta(hours=0.5))
    policy = planning.get("cost-to-go", hedge=MarketHedge(lambda: model, lambda: [spot, od]), live_spot=lambda: [agent])
    assert policy.leaves_on_demand(item, progress, spot, od, NOW) == leaves


def test_from_on_demand_to_a_bubble_it_follows_hedge():
    """A bubble's work is free and it is not the spot market the table was solved for: hedge's rule decides."""
    market, spot, od = flickering_market()
    bubble = offer("b", Tier.bubble, 0.0)
    item = PlanItem("j", make_spec(work={"gpu_hours": 10}, deadline="+20h"), submitted_at=NOW)
    progress = Progress(total_h=10.0, done_h=2.0, elapsed_h=2.0, window_h=20.0, changeover_h=0.2)
    agent = AgentInfo(id="a", offer=spot, host="test", pid=0, registered_at=NOW)
    policy = planning.get("cost-to-go", hedge=market, live_spot=lambda: [agent])
    assert not policy.leaves_on_demand(item, progress, spot, od, NOW)  # to spot just up: it stays
    assert policy.leaves_on_demand(item, progress, bubble, od, NOW)
    assert planning.get("hedge", hedge=market).leaves_on_demand(item, progress, bubble, od, NOW)


def test_a_quote_under_the_policy_plays_its_moves_on_the_futures():
    market, spot, od = market_of_gaps(30)
    spec = make_spec(work={"gpu_hours": 10}, deadline="+20h")
    policy = planning.get("cost-to-go", hedge=market)
    quote = policy.quote(spec, [spot, od], NOW)
    model = market.model()
    made = forecast(spec, quote, [spot, od], model, policy.rule, NOW, futures=200, hedges=market)
    alone = forecast(spec, quote, [spot, od], model, policy.rule, NOW, futures=200)  # the moves solved afresh
    assert made.rule == "cost-to-go"
    assert made.cost_p50_usd == pytest.approx(alone.cost_p50_usd)


def test_work_a_preemption_loses_makes_the_same_state_dearer():
    chain = SpellChain.from_spells(np.full(20, 10), np.full(20, 5))  # preempted every hour
    kept = CostToGo.solve(chain, 100, spot_usd=1.0, od_usd=3.0, tick_h=TICK_H, restart_ticks=2)
    lost = CostToGo.solve(chain, 100, spot_usd=1.0, od_usd=3.0, tick_h=TICK_H, restart_ticks=2, loss_ticks=3)
    assert lost.cost[40, 1, 0, SPOT] > kept.cost[40, 1, 0, SPOT] + 0.1  # 4 h of work: about 3 preemptions to redo


def test_a_pool_that_shrinks_under_its_runs_keeps_a_job_on_on_demand_until_spot_pays_its_restarts():
    """Spells that never end, but the pool takes back a run three ticks in ten, each start paying 2 ticks: a job on
    on-demand with 10 ticks of work goes back to spot when nothing is taken back, stays where its slack would go to
    restarts, and goes back where there is time for them."""
    chain = SpellChain.from_spells(np.full(20, 10_000), np.full(20, 1))
    solve = dict(ticks=80, spot_usd=1.0, od_usd=3.0, tick_h=TICK_H, restart_ticks=2)
    steady, shrinking = CostToGo.solve(chain, **solve), CostToGo.solve(chain, **solve, shrink=0.3)
    assert steady.move(20, 10, 1, 5, OD) == SPOT
    assert shrinking.move(20, 10, 1, 5, OD) == OD
    assert shrinking.move(60, 10, 1, 5, OD) == SPOT
    assert shrinking.cost[10, 1, 5, OD] > steady.cost[10, 1, 5, OD]


def test_the_broker_s_view_solves_its_moves_with_the_shrink_its_fleet_saw():
    """How often the pool our agents saw lost a run while it stayed up (ZoneModel.with_seen) is the table's shrink."""
    spot, od = offer("s", Tier.spot, 1.0), offer("o", Tier.on_demand, 3.0)
    zone = ZoneModel("aws", "s", "x", TICK_H, np.full(40, 1000), np.full(40, 1))
    counts = np.tile([10, 10, 9, 9], 50)  # the pool loses 1 of 10 one tick in four, never empty
    seen = MarketModel(TICK_H, {("aws", "s", "x"): zone}).with_recent({("aws", "s", "x"): counts})
    steady = MarketHedge(lambda: MarketModel(TICK_H, {("aws", "s", "x"): zone}), lambda: [spot, od])
    shrinking = MarketHedge(lambda: seen, lambda: [spot, od])
    assert seen.for_offer(spot).shrink == pytest.approx(0.025, rel=0.02)
    assert shrinking.for_zones([spot]).shrink == seen.for_offer(spot).shrink
    plans = [m.planned([spot], 100, 3.0, 0.2).plan for m in (steady, shrinking)]
    assert plans[1].cost[50, 1, 5, IDLE] > plans[0].cost[50, 1, 5, IDLE]  # the same state, dearer: runs lost


@pytest.mark.parametrize("gpu", ["L4", "V100"])
def test_zones_whose_spot_is_never_all_gone_are_seen_up_past_the_horizon_and_cost_to_go_runs_there(gpu):
    """A job's zones together (its cheapest dozen, or the nine of the packaged traces) have spot at every tick of
    every sampled future: no up-spell was seen whole, which read as spot gone at once (a mean up-spell of 0 h), and
    cost-to-go quoted and ran every such job on on-demand, at 4x hedge's cost."""
    from datetime import UTC, datetime

    from broker.app import wiring
    from broker.core.hedging import HORIZON_H
    from broker.domain.specfile import validate_spec

    broker = wiring.make_broker(with_store=False, policy="cost-to-go")
    fields = {"name": "j", "run": ["true"], "resources": {"accelerators": [f"{gpu}:1"]}, "work": {"gpu_hours": 2.0}}
    spec = validate_spec({**fields, "deadline": "+24h"}, datetime.now(UTC))  # quoted at the broker's clock
    zones = list(broker.hedges.zones_of(spec))
    view = broker.hedges.for_zones(zones)
    assert view.mean_up_h >= HORIZON_H / 2 and view.chain.ends[1].max() < 0.01  # up, and staying up
    quote = broker.quote(spec)
    assert quote.forecast.spot_share > 0.9 and quote.forecast.p_meet_deadline > 0.9
