"""The domain types: options, quotes, and jobs with their runs (a place to run: offer.py; a round's Plan: plan.py).

Every place a job can run is an Offer (bubbles too); the planner prices them all alike. The job spec
types live in jobspec.py and are imported from here too.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import Enum

from pydantic import BaseModel, ConfigDict, computed_field

from broker.domain.jobspec import (  # noqa: F401  (re-exported: the domain's types in one place)
    AcceleratorOption,
    CheckpointSpec,
    IfLate,
    IfOverBudget,
    JobSpec,
    Resources,
    Tier,
    TransformerSpec,
    Work,
    parse_deadline,
)
from broker.domain.offer import Offer


class JobState(str, Enum):
    queued = "queued"
    running = "running"
    migrating = "migrating"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobState.done, JobState.failed, JobState.cancelled)


DEMO_TAG = "demo"  # a job copied from `broker demo`'s own namespace to be shown (Job.demo_copy)
ODDS_NOISE = 0.005  # two forecasts' odds closer than this are the same: the sampling noise of 1,000 futures


class Forecast(BaseModel):
    """An option (the chosen one, or the on-demand baseline) played out by the policy's rule on sampled futures of
    the market model (core/forecast.py): what the job may cost and when it may finish, with the odds."""

    futures: int
    rule: str  # the policy's rule the futures were run with (greedy, uniform, spot-only, on-demand)
    zones: list[str]  # the spot offers the job may launch in, cheapest first
    cost_p10_usd: float
    cost_p50_usd: float
    cost_p90_usd: float
    cost_mean_usd: float
    cost_spread_pct: float = 0.0  # median |cost / p50 - 1| over the futures: the miss to expect were the model right
    # the cost half the futures lie closest to: the middle of their narrowest half (relative width), where the
    # median miss over the futures is least (core/forecast.likeliest); None: a forecast made before it was kept
    cost_likely_usd: float | None = None
    cost_likely_spread_pct: float | None = None  # median |cost / cost_likely - 1| over the futures
    finish_p50: datetime | None  # None: later than the futures' horizon
    finish_p90: datetime | None
    # when the futures finish with the odds the spec asked for (its deadline_probability quantile; None: later than
    # the horizon): the deadline that would be met that often, were the job run as it is here
    finish_at_odds: datetime | None = None
    p_meet_deadline: float
    p_within_budget: float
    # the spec's `if_over_budget: stop`: a future over the budget ends there unfinished, at the budget's cost
    budget_capped: bool = False
    # capped, the least budget with which the futures finish by the deadline at the odds asked (None: not capped, or
    # no budget does): what a quote the cap falls short tells the user to raise it to
    budget_at_odds: float | None = None
    spot_share: float  # mean share of the job's instance hours on spot
    # the runs spot takes back, on average over the futures (None: a forecast made before it was kept)
    preemptions_mean: float | None = None
    evidence: str  # what the market model of its zones rests on
    # the log sd of the job's true speed over the estimate the futures were sampled with; the deadline guard keeps
    # the same margin for it until the speed is measured (None: not recorded, the prior)
    speed_sigma: float | None = None
    # the job's speed over the estimate the futures were centred on, which the guard plans with until it is measured:
    # 1, or what the measured jobs of its kind of estimate and the earlier jobs of its name showed
    # (core/fleet.Fleet.speed_prior)
    speed_median: float = 1.0
    # the odds were found to hold with the job's speed measured on spot (Broker.quote): the guard's reserve for a
    # speed not yet measured keeps it off spot only while it waits with no spot to take (Progress.measures_on_spot)
    measures_on_spot: bool = False

    @property
    def over_budget(self) -> bool:
        """Whether more of the futures cost more than the budget than keep it (the money model admits an option
        whose expected cost is within it)."""
        return self.p_within_budget < 0.5 and not self.budget_capped  # capped: short of odds, not over


class Option(BaseModel):
    """One job priced on one offer: what it would take and cost, and its deadline odds."""

    offer: Offer
    fallback: Offer | None = None  # on-demand kept in reserve: the deadline guard moves the job there
    exclusive_h: float
    checkpoint_interval_h: float | None
    expected_wall_h: float
    expected_cost_usd: float
    p_meet_deadline: float
    expected_finish: datetime
    meets_deadline: bool
    within_budget: bool
    forecast: Forecast | None = None  # the on-demand baseline at the chosen one's spread of speeds (Broker.quote)

    @computed_field
    @property
    def feasible(self) -> bool:
        return self.meets_deadline and self.within_budget


class Quote(BaseModel):
    """The broker's answer to a submit: the chosen option, alternatives, and the savings; `forecast` is the
    chosen option simulated on the market model's futures (None where no market model was given)."""

    policy: str
    created_at: datetime
    chosen: Option
    alternatives: list[Option]
    on_demand_baseline: Option | None
    forecast: Forecast | None = None
    deadline_probability: float | None = None  # the odds of meeting the deadline the spec asked for
    deadline: datetime | None = None  # the one its odds are of (`broker amend` may give the job another since)

    @property
    def short_of_odds(self) -> bool:
        """Whether the forecast meets the deadline less often than the spec asked (the money model, which knows
        neither the market's gaps nor how far off the speed estimate may be, chose an option it thought would)."""
        asked = self.deadline_probability
        return self.forecast is not None and asked is not None and self.forecast.p_meet_deadline < asked - ODDS_NOISE

    @property
    def over_budget(self) -> bool:
        """Whether the forecast's futures overrun the budget more often than not (Forecast.over_budget)."""
        return self.forecast is not None and self.forecast.over_budget

    @property
    def measures_on_spot(self) -> bool:
        """Whether the deadline's odds hold with the speed measured on spot (Forecast.measures_on_spot)."""
        return self.forecast is not None and self.forecast.measures_on_spot

    @property
    def cost_usd(self) -> float:
        """What the quote says the job will cost: its forecast's median, else the money model's expectation."""
        return self.forecast.cost_p50_usd if self.forecast is not None else self.chosen.expected_cost_usd

    @property
    def p_meet_deadline(self) -> float:
        """The quote's odds of meeting the deadline: its forecast's, else the money model's."""
        return self.forecast.p_meet_deadline if self.forecast is not None else self.chosen.p_meet_deadline

    @property
    def simulated_savings(self) -> bool:
        """Whether the savings are of the forecasts' medians (the chosen option and the baseline both simulated)."""
        return (
            self.forecast is not None
            and self.on_demand_baseline is not None
            and self.on_demand_baseline.forecast is not None
        )

    def _costs(self) -> tuple[float, float] | None:
        """(chosen, on-demand) cost: the forecasts' medians when both were simulated, else the money model's."""
        base = self.on_demand_baseline
        if base is None:
            return None
        if self.simulated_savings:
            return self.cost_usd, base.forecast.cost_p50_usd
        return self.chosen.expected_cost_usd, base.expected_cost_usd

    @computed_field
    @property
    def savings_usd(self) -> float | None:
        costs = self._costs()
        return None if costs is None else costs[1] - costs[0]

    @computed_field
    @property
    def savings_pct(self) -> float | None:
        costs = self._costs()
        if costs is None or costs[1] <= 0:
            return None
        return 100.0 * (costs[1] - costs[0]) / costs[1]


MAX_PROGRESS_POINTS = 120


class Run(BaseModel):
    """One attempt of a job on one agent; its fence token makes older attempts stale."""

    fence: int
    agent: str
    offer: Offer
    on_cloud: bool = True  # run by an agent on the offer's cloud instance (AgentInfo.on_cloud): market evidence
    resume_from: str | None = None
    dispatched_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    end_reason: str | None = None  # finished, failed, preempted, lost, fenced, cancelled, moved, unfit
    exit_code: int | None = None
    progress_done: float = 0.0
    progress_total: float | None = None
    last_progress_at: datetime | None = None
    # (server time, done) of its progress reports, thinned to at most MAX_PROGRESS_POINTS: the job's progress on
    # the same clock as its runs (the agents' own clocks differ, and the demo compresses the server's)
    progress_points: list[tuple[datetime, float]] = []
    checkpoint_url: str | None = None
    checkpoint_step: int | None = None
    checkpoint_at: datetime | None = None
    checkpoint_error: str | None = None  # why the newest save failed (a full disk...); cleared by the next good one
    # the deadline guard asked for a checkpoint now (a preemption would lose work the deadline can no longer spare);
    # the run's next checkpoint report, or failed save, settles it
    checkpoint_requested_at: datetime | None = None
    checkpoints_asked: int = 0  # checkpoints written on the guard's request: their writes are not the job's pace
    cost_usd: float = 0.0
    work_lost_s: float = 0.0

    @property
    def id(self) -> str:
        return f"r{self.fence}"

    def record_progress(self, at: datetime, done: float) -> None:
        """Keep a progress point; when full, every other older point goes (the curve keeps its shape)."""
        kept = self.progress_points[::2] if len(self.progress_points) >= MAX_PROGRESS_POINTS else self.progress_points
        self.progress_points = [*kept, (at, done)]  # a new list: the run may be a shallow copy of the stored one

    def hours(self, until: datetime) -> float:
        """Billed hours: from start (or dispatch, for a run that never started) to its end or `until`."""
        begin = self.started_at or self.dispatched_at
        return max(0.0, ((self.ended_at or until) - begin).total_seconds() / 3600)


class Job(BaseModel):
    """A submitted job as the store keeps it, with its history of runs. Frozen: a change is a model_copy, and the
    store hands out one parsed Job for each stored text (store/jobs.py)."""

    model_config = ConfigDict(frozen=True)

    id: str
    spec: JobSpec
    state: JobState = JobState.queued
    submitted_at: datetime
    updated_at: datetime
    quote: Quote
    reason: str | None = None
    fence: int = 0  # the token of the newest run; events carrying another are stale
    restarts: int = 0
    pinned_tier: Tier | None = None  # set by the deadline guard: dispatch only to this tier
    move_requested: bool = False  # the guard asked the agent to checkpoint and give the job back
    stopped_at_budget: bool = False  # failed by the budget cap (core/budget.py): a larger budget resumes it
    runs: list[Run] = []
    log_tail: list[str] = []
    tags: list[str] = []  # DEMO_TAG: a copy of a demo's job, shown beside the user's own

    @property
    def demo_copy(self) -> bool:
        """A demo's job copied here to be shown: its runs are on a compressed clock and local agents, so neither
        the hazard nor the fleet's speeds and arrivals learn from it."""
        return DEMO_TAG in self.tags

    def market_runs(self) -> list[Run]:
        """Its ended spot runs that are evidence of their market's preemptions: run on the cloud instance they stand
        for (not a local stand-in), and not a demo's copy."""
        if self.demo_copy:
            return []
        return [r for r in self.runs if r.offer.tier == Tier.spot and r.ended_at is not None and r.on_cloud]

    @property
    def current_run(self) -> Run | None:
        """The newest run while it has not ended."""
        return self.runs[-1] if self.runs and self.runs[-1].ended_at is None else None

    @property
    def pending(self) -> bool:
        """Waiting for capacity: queued or migrating, with no run under way."""
        return self.state in (JobState.queued, JobState.migrating) and self.current_run is None

    @property
    def urgency(self) -> float:
        """Dispatch order, smallest first (JobSpec.urgency)."""
        return self.spec.urgency(self.submitted_at)

    @property
    def final(self) -> bool:
        """Ended, and its last run with it: what it cost no longer changes."""
        return self.state.terminal and all(r.ended_at for r in self.runs)

    @property
    def cost_usd(self) -> float:
        """What its ended runs cost."""
        return sum(r.cost_usd for r in self.runs)

    def productive_hours(self, until: datetime) -> float:
        """Its runs' hours (a run under way up to `until`) less the work they lost."""
        return max(0.0, sum(r.hours(until) for r in self.runs) - sum(r.work_lost_s for r in self.runs) / 3600)

    def on_demand_usd(self, until: datetime) -> float:
        """What its productive hours would have cost at the price of the on-demand option its quote was compared
        with: the baseline of its savings."""
        baseline = self.quote.on_demand_baseline
        return (baseline.offer.price_usd_per_h if baseline else 0.0) * self.productive_hours(until)

    @property
    def migrations(self) -> int:
        return sum(1 for r in self.runs[:-1] if r.end_reason in ("preempted", "lost", "moved", "unfit"))

    @property
    def unfit_zones(self) -> list[str]:
        """Where a run was handed back as unfit: the bubbles whose windows none of its configurations fits."""
        return sorted({r.offer.zone for r in self.runs if r.end_reason == "unfit"})


AGENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")  # a pool's agents are <pool>.<host>; no glob, ':' or '/'


def agent_id_problem(agent_id: str) -> str | None:
    """Why `agent_id` cannot name an agent (it names Redis keys, ACL users and key patterns, log files, tokens)."""
    if AGENT_ID.fullmatch(agent_id):
        return None
    return (
        f"{agent_id!r} is not an agent id; use up to 200 letters, digits, '.', '_' or '-', starting with a letter or "
        "digit"
    )


class AgentInfo(BaseModel):
    """An agent as it registers: the instance (Offer) it stands for, and the job it runs. Frozen: the store hands
    out one parsed record for each stored one (store/agents.py)."""

    model_config = ConfigDict(frozen=True)

    id: str
    offer: Offer
    host: str
    pid: int
    registered_at: datetime
    token: str | None = None  # registration token (agents/tokens.py), when the broker asks for one
    # on the cloud instance it stands for (it watches that cloud's preemption notices); False: a local stand-in
    # (`broker run`, the demo, an agent without a cloud's notices), whose runs and uptime are no market evidence
    on_cloud: bool = True
    report_key: str | None = None  # a secret of this agent process: its reports carry it (Store.report)
    for_job: str | None = None  # started for this job alone (`broker run`): no other job is planned on it
    job: str | None = None
    fence: int | None = None

    def may_take(self, job_id: str) -> bool:
        """Whether it may run the job at all: it was started for no job, or for this one (core/reserved.py)."""
        return self.for_job in (None, job_id)
