"""Can't Be Late's single-job setting: the exact bound, the hedge rule, and the mode on held-out traces."""

import json
import shutil

import numpy as np
import pytest
from test_futures import _setting
from typer.testing import CliRunner

from broker.app.cli.main import app
from broker.models.futures import Hedge, simulate
from broker.sim import single_job
from broker.sim.market import PACKAGED_TRACES
from broker.sim.omniscient import Choice, cheapest, cheapest_by_steps


def flicker(rng, ticks: int, flip: float) -> np.ndarray:
    state, out = True, np.zeros(ticks, dtype=bool)
    for t in range(ticks):
        if rng.random() < flip:
            state = not state
        out[t] = state
    return out


@pytest.mark.parametrize("seed", range(4))
def test_the_program_solved_by_steps_has_the_ilps_optimum(seed):
    rng = np.random.default_rng(seed)
    prices = np.array([1.0, 1.6, 3.0])
    available = np.stack([flicker(rng, 40, 0.2), flicker(rng, 40, 0.3), np.ones(40, dtype=bool)])
    ilp = cheapest([Choice("spot", p, 2.5, a) for p, a in zip(prices, available)], 0.2, 4.0, 0.1, 30)
    steps = cheapest_by_steps(prices, available[None], work_ticks=25, restart_ticks=2, dt=0.1)
    assert ilp.status == "optimal" and steps[0] == pytest.approx(ilp.cost_usd, abs=1e-6)


def test_hedge_waits_out_short_gaps_and_pays_on_demand_through_a_long_outage():
    """Spot flickers off for a tick every 2 h and is gone for 8 h once. Uniform Progress pays the changeover to
    on-demand at flickers whenever it is behind; the hedge rule knows gaps are short unless they have lasted."""
    tick_h, ticks = 0.1, 300
    available = np.ones(ticks, dtype=bool)
    available[19::20] = False
    available[100:180] = False
    hedge = Hedge.from_spells(np.full(50, 19), np.r_[np.ones(45), np.full(5, 80)], tick_h, ticks)
    setting = dict(work_h=24.0, od_work_h=24.0, restart_h=0.2, interval_h=None, window_h=30.0, keeps_progress=True)
    runs = {
        rule: simulate(_setting(**setting, rule=rule), available[None, None, :], tick_h, hedge)
        for rule in ("uniform", "hedge")
    }
    assert all(out.finish_h[0] <= 30.0 for out in runs.values())
    assert runs["hedge"].cost_usd[0] < runs["uniform"].cost_usd[0]
    assert 0 < runs["hedge"].od_h[0] < 8.0  # on-demand only inside the outage, after waiting a little


def test_the_single_job_mode_on_held_out_traces_bounds_every_rule_and_misses_nothing():
    rows = single_job.run(PACKAGED_TRACES, stride_h=48.0)
    assert {(r["setting"], r["deadline_h"]) for r in rows} == {
        (s, d) for s in ("1 zone", "9 zones") for d in single_job.DEADLINES_H
    }
    assert all(r["deadline_misses"] == 0 for r in rows)
    assert all(r["cost_vs_omniscient"] >= 1.0 for r in rows)  # a bound that a policy beats is no bound
    # the worst window is at least the mean's ratio (a ratio of sums is at most the largest ratio), the bound's is 1
    assert all(r["worst_vs_omniscient"] >= r["cost_vs_omniscient"] for r in rows)
    assert {r["worst_vs_omniscient"] for r in rows if r["policy"] == "omniscient"} == {1.0}
    by = {(r["setting"], r["deadline_h"], r["policy"]): r["mean_cost_usd"] for r in rows}
    for s, d, _ in [k for k in by if k[2] == "hedge"]:
        assert by[s, d, "hedge"] < by[s, d, "uniform"] < by[s, d, "on-demand"]
        if s == "1 zone":  # the moves of least expected cost under the model beat the hedge rule's thresholds
            assert by[s, d, "cost-to-go"] < by[s, d, "hedge"]
    for r in rows:  # the pooled saving is a weighted mean of the zones' own, so it lies within their range
        if r["setting"] == "1 zone":
            low, high = r["vs_uniform_zone_range_pct"]
            assert low - 0.1 <= r["vs_uniform_1_zone_pct"] <= high + 0.1
            assert (low, high) == (0.0, 0.0) if r["policy"] == "uniform" else low < high
        else:
            assert r["vs_uniform_zone_range_pct"] is None


def test_broker_backtest_single_job_prints_the_rows_as_json(tmp_path):
    """The command on traces of its own (two zones of the packaged set: the mode's figures are the test above's)."""
    traces = tmp_path / "traces"
    (traces / "aws-02-15-2023").mkdir(parents=True)
    for name in ("us-east-1a_v100_1.json", "us-west-2c_v100_1.json"):
        shutil.copy(PACKAGED_TRACES / "aws-02-15-2023" / name, traces / "aws-02-15-2023" / name)
    result = CliRunner().invoke(
        app, ["backtest", "--single-job", "--traces", str(traces), "--stride-hours", "96", "--json"]
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["traces"] == str(traces)
    assert {(r["setting"], r["deadline_h"]) for r in body["rows"]} == {
        (s, d) for s in ("1 zone", "2 zones") for d in single_job.DEADLINES_H
    }
    assert {r["policy"] for r in body["rows"]} == {
        "greedy",
        "uniform",
        "hedge",
        "cost-to-go",
        "on-demand",
        "omniscient",
    }
