"""Seeded workloads for the backtest: a mix of GPU jobs, and the main training jobs whose bubbles they may fill.

The ML mix (`ml_mix`): training and fine-tuning jobs of a few GPU-hours to days with Can't Be
Late's deadline slack (job fraction = work / time to deadline, drawn from 0.6-0.9), and smaller
fill-eligible jobs (evaluation, batch inference: a few GPU-hours, a few GB of GPU memory) that
are background work with loose deadlines (job fraction 0.1-0.3). Half the jobs carry a budget
of 1.3x their on-demand cost. Arrivals are a Poisson process over `arrival_h`. Main jobs are
4-stage pipelines in FreeRide's setting (GPipe m=4, 1F1B m=8) whose profiles come from the
analytic schedule model, with free memory rising from stage 0 to 3.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np

from broker.bubbles.capacity import bubble_offer
from broker.bubbles.profiler import forecast
from broker.domain.accelerators import ACCELERATORS
from broker.domain.model import JobSpec
from broker.domain.offer import Offer
from broker.models.risk import RESTART_OVERHEAD_H, STARTUP_H

# How far a job's real speed is from the planner's estimate (log-normal sigma): per-GPU throughput from a
# datasheet ratio is off by 10-20% for real models (input pipelines, kernels, memory-bound layers).
TRUE_SPEED_SIGMA = 0.15
# A job run again (a nightly evaluation, a fine-tune on new data) runs within a few percent of its earlier runs' speed
# on the same GPU type: a DL job repeats the same mini-batches (Gandiva's intra-job predictability). The `repeats`
# workload's assumption, not the default's.
REPEAT_SPEED_SIGMA = 0.03


@dataclass(frozen=True)
class Arrival:
    """A job entering the broker: when (hours after the start) and its spec; the deadline is `window_h`
    after it is submitted."""

    at_h: float
    spec: JobSpec
    window_h: float | None
    true_speed: float = 1.0  # the job's real speed over the planner's estimate: the backtest's truth, not its guess
    job_id: str = ""  # its id in the backtest: the spec's name, unless it is an earlier job run again (`repeats`)

    @property
    def id(self) -> str:
        return self.job_id or self.spec.name


@dataclass(frozen=True)
class MainJob:
    """A pipeline-parallel training job that lends its bubbles: its schedule and where it runs."""

    name: str
    schedule: str
    stages: int
    microbatches: int
    t_f_s: float
    t_b_s: float
    free_gb: tuple[float, ...]  # per stage
    accelerator: str = "V100"
    cloud: str = "aws"
    region: str = "us-east-1"

    def offers(self, at: datetime, price_usd_per_h: float = 0.0) -> list[Offer]:
        """Its stages as bubble offers, from the forecast profile (no measurement needed)."""
        profiles = forecast(
            self.name,
            self.schedule,
            self.stages,
            self.microbatches,
            [self.t_f_s] * self.stages,
            [self.t_b_s] * self.stages,
            [int(g * 1e9) for g in self.free_gb],
            self.accelerator,
            at,
        )
        offers = (bubble_offer(p, self.cloud, self.region, self.accelerator, price_usd_per_h) for p in profiles)
        return [o for o in offers if o is not None]


FREERIDE_MAIN_JOBS = (
    MainJob("llm-gpipe", "gpipe", 4, 4, 0.25, 0.5, (3.0, 6.0, 9.0, 12.0)),
    MainJob("llm-1f1b", "1f1b", 4, 8, 0.25, 0.5, (3.0, 6.0, 9.0, 12.0)),
)


def ml_mix(
    seed: int,
    jobs: int,
    od_price_usd_per_h: float,
    accelerator: str = "V100",
    arrival_h: float = 48.0,
    fill_share: float = 0.4,
    speed_sigma: float = TRUE_SPEED_SIGMA,
    repeats: float = 0.0,
    speed_median: float = 1.0,
) -> list[Arrival]:
    """`jobs` seeded arrivals of the ML mix on one accelerator type, oldest first; each job's true speed is off
    the planner's estimate by a log-normal factor of `speed_sigma` about `speed_median` (below 1: the estimates are
    optimistic, as a datasheet's ratio often is; 0 sigma and median 1: the estimate is the truth). With `repeats`,
    that share of the jobs (after the first) are an earlier one run again: its spec (name, work, window, budget) and
    its speed within REPEAT_SPEED_SIGMA (drawn from streams of their own: the other jobs are those without)."""
    rng = np.random.default_rng(seed)
    truth = np.random.default_rng([seed, 1])  # its own stream: the jobs drawn do not depend on it
    speed = ACCELERATORS[accelerator].speed("training")
    times = np.sort(rng.uniform(0.0, arrival_h, size=jobs))
    out = []
    for i, at_h in enumerate(times):
        fill = bool(rng.random() < fill_share)
        if fill:
            hours, fraction = float(np.clip(rng.lognormal(np.log(4), 0.6), 1, 16)), rng.uniform(0.1, 0.3)
            memory, size_gb, restore_min = float(rng.choice([2.0, 4.0, 6.0, 8.0])), float(rng.uniform(0.5, 2)), 1.0
        else:
            hours, fraction = float(np.clip(rng.lognormal(np.log(16), 0.9), 2, 72)), rng.uniform(0.6, 0.9)
            memory, size_gb, restore_min = None, float(rng.uniform(2, 20)), float(rng.uniform(1, 5))
        overhead_h = STARTUP_H + RESTART_OVERHEAD_H + restore_min / 60
        window_h = (hours + overhead_h) / fraction
        budget = round(1.3 * od_price_usd_per_h * (hours + overhead_h), 2) if rng.random() < 0.5 else None
        spec = JobSpec(
            name=f"{'fill' if fill else 'train'}-{i:04d}",
            run=["simulated"],
            fill=fill,
            budget_usd=budget,
            resources={"accelerators": [f"{accelerator}:1"], "gpu_memory_gb": memory},
            work={"gpu_hours": round(hours * speed, 4), "kind": "training"},
            checkpoint={"size_gb": round(size_gb, 2), "restore_minutes": round(restore_min, 2)},
        )
        true_speed = speed_median * float(np.clip(truth.lognormal(0.0, speed_sigma), 0.7, 1.4))
        out.append(Arrival(float(at_h), spec, float(window_h), true_speed))
    return _run_again(out, repeats, np.random.default_rng([seed, 2])) if repeats > 0 else out


def _run_again(arrivals: list[Arrival], share: float, rng: np.random.Generator) -> list[Arrival]:
    """The arrivals with `share` of them (after the first) replaced by an earlier job run again at the same time."""
    out = list(arrivals)
    for i in range(1, len(out)):
        if rng.random() < share:
            first = arrivals[int(rng.integers(i))]  # the job as it first came (not a run again of it)
            speed = first.true_speed * float(rng.lognormal(0.0, REPEAT_SPEED_SIGMA))
            job_id = f"{first.spec.name}-again-{i:04d}"
            out[i] = Arrival(out[i].at_h, first.spec, first.window_h, speed, job_id)
    return out


def backtest_workload(
    market, seed: int, jobs: int, arrival_hours: float = 48.0, repeats: float = 0.0, speed_median: float = 1.0
) -> list:
    """The seeded ML mix, priced against the market's cheapest on-demand offer (`repeats`, `speed_median`: ml_mix's)."""
    od_price = min(o.price_usd_per_h for o in market.on_demand)
    return ml_mix(
        seed,
        jobs,
        od_price,
        market.spot[0].offer.accelerator,
        arrival_hours,
        repeats=repeats,
        speed_median=speed_median,
    )
