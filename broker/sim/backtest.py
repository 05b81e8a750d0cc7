"""The backtest: the live core (core.broker.Broker, core.server.BrokerServer, the registered policies, the store)
on a simulated clock, cloud and fleet, driven by real spot traces.

Each policy runs the same workload on its own key prefix in one Redis: jobs are submitted through
`Broker.submit` (the policy quotes them), the server folds the fleet's reports, guards deadlines and
dispatches with the policy, and the fleet runs what it is given. A policy written `name+bubbles`
also sees the bubble offers of the main jobs. The omniscient bound is solved per job on the known
future, and for all jobs at once with capacity shared (its LP relaxation). Nothing here decides where a job
runs: that is the policies' code, imported, not copied.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from broker import planning
from broker.agents.checkpoints import CheckpointStore
from broker.core.broker import Broker
from broker.core.clock import SimulatedClock
from broker.core.server import BrokerServer
from broker.domain.errors import BrokerError, InfeasibleError
from broker.domain.figures import hours_late, missed_deadline, spend_usd
from broker.domain.model import Forecast, Job, JobState
from broker.planning.option_table import measured_speed
from broker.pricing.availability import MarketModel
from broker.sim.calibration import cost_errors_pct, job_rows, reliability
from broker.sim.fleet import SimFleet
from broker.sim.market import Market, OfferBook
from broker.sim.omniscient import Bound, joint, joint_schedule, omniscient
from broker.sim.workloads import Arrival
from broker.store.jobs import Store

DEFAULT_POLICIES = (
    "on-demand",
    "skypilot-eager",
    "cbl-greedy",
    "uniform-progress",
    "costslo",
    "costslo+bubbles",
    "hedge",
    "hedge+bubbles",
)
OMNISCIENT = "omniscient"
JOINT = "joint omniscient"  # a row of the summary: all jobs at once, capacity shared (asked for with omniscient)
SCHEDULE = "joint schedule"  # a row too: an offline schedule of them all; the joint optimum lies between the two
BUBBLES = "+bubbles"


@dataclass
class Outcome:
    """What one policy did with the workload: its jobs as the store holds them at the end."""

    policy: str
    jobs: list[Job]
    end: datetime
    refused: list[str] = field(default_factory=list)  # jobs the policy's quote refused at submit
    ticks: int = 0
    # job id -> (when, its outlook): Broker.outlook once the job's speed was measured (when asked for)
    outlooks: dict[str, tuple[datetime, Forecast]] = field(default_factory=dict)

    def cost_usd(self) -> float:
        return sum(spend_usd(j, self.end) for j in self.jobs)

    def misses(self) -> int:
        return sum(missed_deadline(j, self.end) for j in self.jobs) + len(self.refused)

    def on_time(self) -> dict[str, float]:
        """Cost of each job that finished by its deadline."""
        return {j.id: j.cost_usd for j in self.jobs if j.state == JobState.done and not missed_deadline(j, self.end)}

    def tier_hours(self) -> dict[str, float]:
        return tier_hours(self.jobs, self.end)


def tier_hours(jobs: list[Job], end: datetime) -> dict[str, float]:
    """Instance hours of the jobs' runs by tier."""
    hours = {"bubble": 0.0, "spot": 0.0, "on_demand": 0.0}
    for job in jobs:
        for run in job.runs:
            hours[run.offer.tier.value] += run.hours(end)
    return hours


def check_policies(names: list[str]) -> list[str]:
    """The requested policies, each a registered name (optionally +bubbles) or `omniscient`."""
    known = planning.names()
    for name in names:
        base = name.removesuffix(BUBBLES)
        if name != OMNISCIENT and base not in known:
            raise BrokerError(
                f"policies: unknown policy {name!r}; choose from {', '.join(known)}, any of them "
                "+bubbles, or omniscient"
            )
    return names


def run_policy(
    name: str,
    redis_url: str,
    market: Market,
    arrivals: list[Arrival],
    seed: int,
    on_tick: Callable[[int], None] | None = None,
    model: MarketModel | None = None,
    outlooks: bool = False,
    history: Sequence[Job] = (),
) -> Outcome:
    """Run one policy over the workload on the simulated clock; its keys are deleted afterwards. With a
    market `model` every quote carries a forecast (simulated on the model's futures, not the traces'); with
    `outlooks`, each job's outlook is taken once, in the first tick its speed is measured (the quote made again
    from where the job stands: Broker.outlook). `history`: finished jobs stored first, a warm broker's
    (sim/history.py); they are not the outcome's."""
    base, bubbles = name.removesuffix(BUBBLES), name.endswith(BUBBLES)
    prefix = f"backtest:{seed}:{name}:"
    store = Store(redis_url, prefix=prefix)
    store.clear_namespace()
    for job in history:
        store.add_job(job)
    clock = SimulatedClock(market.start)
    policy = planning.get(base)
    broker = Broker(store, OfferBook(market.offers(bubbles)), policy, clock, model)
    checkpoints = CheckpointStore(f"memory://backtest/{seed}/{name}")
    server = BrokerServer(store, policy, clock, checkpoints, consumer="backtest")
    fleet = SimFleet(store, checkpoints, market, bubbles, {a.id: a.true_speed for a in arrivals}, seed)
    tick_h = market.tick_s / 3600
    queue, refused, taken = list(arrivals), [], {}
    last_tick = horizon(market, arrivals)
    tick = 0
    try:
        for tick in range(last_tick):
            now = clock.now()
            while queue and queue[0].at_h <= tick * tick_h + 1e-9:
                arrival = queue.pop(0)
                spec = (
                    arrival.spec.model_copy(update={"deadline": now + timedelta(hours=arrival.window_h)})
                    if arrival.window_h
                    else arrival.spec
                )
                try:
                    broker.submit(spec, job_id=arrival.id)
                except InfeasibleError:
                    refused.append(arrival.id)
            fleet.provision(tick, now, store.pending_count())
            dispatched = server.step()
            if fleet.obey(now):  # a live agent hands a moved job back within a second: re-dispatched at once
                dispatched += server.step()
            fleet.take(dispatched, now)
            if outlooks and model is not None:
                _take_outlooks(broker, store, taken, now)
            fleet.advance(now, tick_h)
            clock.advance(hours=tick_h)
            if on_tick:
                on_tick(tick)
            if not queue and not fleet.runs and store.pending_count() == 0 and not store.active_jobs():
                server.step()  # fold the last reports
                if store.pending_count() == 0:
                    break
        server.step()
        earlier = {job.id for job in history}
        jobs = [job for job in store.list_jobs() if job.id not in earlier]
        return Outcome(name, jobs, clock.now(), refused, tick + 1, taken)
    finally:
        fleet.close()
        checkpoints.fs.rm(checkpoints.root, recursive=True) if checkpoints.fs.exists(checkpoints.root) else None
        store.clear_namespace()


def _take_outlooks(broker: Broker, store: Store, taken: dict, now: datetime) -> None:
    """The outlook of each active job whose speed is measured and that has none yet."""
    for job in store.active_jobs():
        if job.id not in taken and measured_speed(job) is not None:
            outlook = broker.outlook(job)
            if outlook is not None:
                taken[job.id] = (now, outlook)


def horizon(market: Market, arrivals: list[Arrival]) -> int:
    """Ticks a backtest may run: until every job's deadline has passed three times over, or the traces end."""
    return min(
        market.ticks, math.ceil(max(a.at_h + 3 * (a.window_h or 72.0) for a in arrivals) / (market.tick_s / 3600))
    )


def summary(
    outcomes: list[Outcome],
    bound: dict[str, Bound] | None,
    reference: Outcome | None = None,
    joint_bound: Bound | None = None,
    schedule: Bound | None = None,
) -> list[dict]:
    """One row per policy: cost, savings vs all on-demand (`reference`), misses, cost / omniscient (per-job and
    joint bounds, and the joint offline schedule, on the jobs some schedule can finish in time: a bound says nothing
    of the others), migrations, work lost, and how far realised costs were from the quotes."""
    reference = reference or next((o for o in outcomes if o.policy == "on-demand"), None)
    reference = reference.cost_usd() if reference else None
    bounded = {name: b for name, b in (bound or {}).items() if math.isfinite(b.cost_usd)}
    optimum = sum(b.cost_usd for b in bounded.values()) if bounded else None
    joint_usd = joint_bound.cost_usd if joint_bound and math.isfinite(joint_bound.cost_usd) else None
    schedule_usd = schedule.cost_usd if schedule and math.isfinite(schedule.cost_usd) else None

    def versus(out: Outcome, against: float | None) -> float | None:
        same = sum(spend_usd(j, out.end) for j in out.jobs if j.id in bounded)
        return round(same / against, 3) if against else None

    rows = []
    for out in outcomes:
        cost = out.cost_usd()
        quotes = job_rows(out.jobs, out.end)
        median_error, p90_error = cost_errors_pct(quotes)
        rows.append(
            {
                "policy": out.policy,
                "cost_usd": round(cost, 2),
                "savings_pct": round(100 * (1 - cost / reference), 1) if reference else None,
                "deadline_misses": out.misses(),
                "hours_late": round(sum(hours_late(j, out.end) for j in out.jobs), 1),
                "cost_vs_omniscient": versus(out, optimum),
                "cost_vs_joint_omniscient": versus(out, joint_usd),
                "cost_vs_joint_schedule": versus(out, schedule_usd),
                "migrations": sum(j.migrations for j in out.jobs),
                "work_lost_h": round(sum(r.work_lost_s for j in out.jobs for r in j.runs) / 3600, 2),
                "median_abs_cost_error_pct": median_error,
                "p90_abs_cost_error_pct": p90_error,
                "brier": reliability(quotes)["brier"],
                "unfinished": sum(1 for j in out.jobs if j.state != JobState.done),
                **{f"{tier}_h": round(h, 1) for tier, h in out.tier_hours().items()},
            }
        )
    for name, usd, hours in (
        (OMNISCIENT, optimum, [b.tier_hours for b in bounded.values()]),
        (JOINT, joint_usd, [joint_bound.tier_hours] if joint_bound else []),
        (SCHEDULE, schedule_usd, [schedule.tier_hours] if schedule else []),
    ):
        if usd is None:
            continue
        rows.append(
            {
                "policy": name,
                "cost_usd": round(usd, 2),
                "savings_pct": None,  # over fewer jobs than the reference when some cannot be met
                "deadline_misses": 0,
                "hours_late": 0.0,
                "cost_vs_omniscient": round(usd / optimum, 3) if optimum else None,
                "cost_vs_joint_omniscient": round(usd / joint_usd, 3) if joint_usd else None,
                "cost_vs_joint_schedule": round(usd / schedule_usd, 3) if schedule_usd else None,
                "migrations": 0,
                "work_lost_h": 0.0,
                "median_abs_cost_error_pct": None,
                "p90_abs_cost_error_pct": None,
                "brier": None,
                "unfinished": 0,
                **{
                    f"{tier}_h": round(sum(h.get(tier, 0.0) for h in hours), 1)
                    for tier in ("bubble", "spot", "on_demand")
                },
            }
        )
    return rows


@dataclass
class Result:
    """A whole backtest: its setting, each policy's outcome and row, the per-job bounds and the joint one."""

    setting: dict
    outcomes: list[Outcome]
    bound: dict[str, Bound]
    rows: list[dict]
    skipped: list[str]
    joint: Bound | None = None
    schedule: Bound | None = None


def run(
    market: Market,
    arrivals: list[Arrival],
    names: list[str],
    seed: int,
    redis_url: str,
    progress: Callable[[str, int, int], None] | None = None,
    setting: dict | None = None,
    model: MarketModel | None = None,
    outlooks_for: tuple[str, ...] = (),
    history: Sequence[Job] = (),
) -> Result:
    """Every requested policy over the workload (all on-demand too: savings are measured against it), then
    the omniscient bound when asked for; `progress(what, done, total)` is called as it goes. The policies named
    in `outlooks_for` take each job's outlook once its speed is measured; each starts with `history` stored
    (run_policy)."""
    check_policies(names)
    simulated = [n for n in names if n != OMNISCIENT]
    if "on-demand" not in simulated:
        simulated.insert(0, "on-demand")
    outcomes = []
    for name in simulated:
        last = horizon(market, arrivals)
        tick = (lambda t, n=name, last=last: progress(n, t + 1, last)) if progress else None
        outlooks = name in outlooks_for
        outcomes.append(run_policy(name, redis_url, market, arrivals, seed, tick, model, outlooks, history))
        if progress:
            progress(name, last, last)
    bound: dict[str, Bound] = {}
    joint_bound = schedule = None
    if OMNISCIENT in names:
        tick_h = market.tick_s / 3600
        for i, a in enumerate(arrivals):
            bound[a.id] = omniscient(
                a.spec, a.window_h or 72.0, market, math.ceil(a.at_h / tick_h - 1e-9), bubbles=True, speed=a.true_speed
            )
            if progress:
                progress(OMNISCIENT, i + 1, len(arrivals))
        feasible = [a for a in arrivals if math.isfinite(bound[a.id].cost_usd)]
        together = [(a.spec, a.window_h or 72.0, math.ceil(a.at_h / tick_h - 1e-9), a.true_speed) for a in feasible]
        joint_bound = joint(together, market) if together else None
        done = (lambda i, n: progress(SCHEDULE, i, n)) if progress else None
        schedule = joint_schedule(together, market, progress=done) if together else None
    rows = summary([o for o in outcomes if o.policy in names], bound or None, outcomes[0], joint_bound, schedule)
    return Result(setting or {}, outcomes, bound, rows, market.skipped, joint_bound, schedule)
