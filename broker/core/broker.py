"""The broker core: quote, submit, cancel and look up jobs. The CLI and the backtest both drive it."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import cached_property

from broker.core.fleet import Fleet
from broker.core.forecast import FUTURES, Underway, forecast
from broker.core.hedging import MarketHedge
from broker.core.refusals import told_by_futures
from broker.domain.errors import BrokerError, InfeasibleError
from broker.domain.model import ODDS_NOISE, AgentInfo, Forecast, Job, JobSpec, JobState, Offer, Option, Quote, Tier
from broker.models.risk import evaluate, fits, unmeasured_margin
from broker.planning.cheapest import ALTERNATIVES
from broker.planning.uniform_progress import holds_reserve, starts_on_demand
from broker.pricing.availability import MarketModel, seen_counts
from broker.pricing.catalog import PriceCatalog
from broker.store.capacity import fleet_seen
from broker.store.jobs import Store

OTHERS_SEEN = 1000  # jobs a quote looks at: those waiting ahead of it, and the finished ones it learns speed from
ALTERNATIVE_FUTURES = 250  # an alternative's odds to within about a point (their sd over seeds: 0.1-0.5 points)
RECENT_H = 7 * 24.0  # hours of our fleet's spot capacity the market model learns from
LIVE_SPOT_S = 1.0  # how stale the fleet's live spot offers may be when the policy tells a queue from a market gap


class Broker:
    """Jobs in, quotes and stored jobs out; the clock, store, catalog and policy are passed in."""

    def __init__(
        self,
        store: Store | None,
        catalog: PriceCatalog,
        policy,
        clock,
        market: MarketModel | Callable[[], MarketModel] | None = None,
        explained: bool = False,
    ):
        self.store = store
        self.catalog = catalog
        self.policy = policy
        self.clock = clock
        self._market = market  # when given, quotes carry a forecast: the choice simulated on its futures
        # quotes a person reads: the alternatives simulated too, each on its own offer (what a user weighs them by),
        # and a refusal's fixes read from the quotes they lead to (core/refusals.py); backtests never show them
        self.explained = explained
        self._recent: tuple[datetime, MarketModel] | None = None  # (when learned, the model with our spells)
        self.hedges = MarketHedge(self.market_now, lambda: self.catalog.offers) if market is not None else None
        if self.hedges and getattr(policy, "hedge", False) is None:  # a policy that decides from the market
            policy.hedge = self.hedges
        if store is not None and getattr(policy, "live_spot", False) is None:  # ... and tells market from queue
            policy.live_spot = self.live_spot
        self._live_spot: tuple[datetime | None, list[AgentInfo]] = (None, [])

    def live_spot(self) -> list[AgentInfo]:
        """The fleet's working spot agents, busy or idle; read at most once in LIVE_SPOT_S (the policy asks every
        plan page, and the server reads every agent each round already)."""
        read_at, agents = self._live_spot
        now = self.clock.now()  # the backtest's clock: a fresh read every simulated tick, the same on every machine
        if read_at is None or (now - read_at).total_seconds() >= LIVE_SPOT_S or now < read_at:
            agents = [a for a in self.store.working_agents() if a.offer.tier == Tier.spot]
            self._live_spot = (now, agents)
        return agents

    @cached_property
    def market(self) -> MarketModel | None:
        """The market model, learned on first use: commands that never quote (list, agent, server) skip the fit."""
        return self._market() if callable(self._market) else self._market

    def market_now(self) -> MarketModel | None:
        """The market model with the spot capacity our fleet had in the last RECENT_H hours (the market drifts
        from its traces: store/capacity.py), learned again once a model tick."""
        base = self.market
        if base is None or self.store is None:
            return base
        now = self.clock.now()
        if self._recent is None or now - self._recent[0] >= timedelta(hours=base.tick_h):
            since, tick_s = now - timedelta(hours=RECENT_H), base.tick_h * 3600
            seen = fleet_seen(self.store.shards, since)
            counts = {z: seen_counts(p, since.timestamp(), now.timestamp(), tick_s) for z, p in seen.items()}
            self._recent = (now, base.with_recent(counts))
        return self._recent[1]

    def offers(self, agents: list[AgentInfo] | None = None) -> list[Offer]:
        """The catalog's offers and the bubble offers of the fill executors registered now (`agents`, read from
        the store when not given)."""
        offers = list(self.catalog.offers)
        if self.store is not None:
            known = {o.id for o in offers}
            agents = self.store.agents() if agents is None else agents
            bubbles = {a.offer.id: a.offer for a in agents if a.offer.tier == Tier.bubble and a.offer.id not in known}
            offers += bubbles.values()
        return offers

    def quote(self, spec: JobSpec, agents: list[AgentInfo] | None = None) -> Quote:
        """Price the job on every offer and pick one, then simulate the choice by the policy's rule on the market
        model's futures, against the other jobs for the fleet's capacity, and the on-demand baseline at the same
        spread of speeds (what the savings are against); raises InfeasibleError when none fits. `agents`: the
        working agents, when the caller read them already."""
        if agents is None:
            agents = self.store.working_agents() if self.store is not None else []
        return self._quote(spec, agents, self.explained)

    def _quote(self, spec: JobSpec, agents: list[AgentInfo], explained: bool) -> Quote:
        now = self.clock.now()
        offers = self.offers(agents)
        market = self.market_now()
        try:
            quote = self.policy.quote(spec, offers, now)
        except InfeasibleError as error:
            if not explained or market is None:
                raise
            raise told_by_futures(error, spec, now, lambda asked: self._quote(asked, agents, False)) from None
        fleet = self._fleet(agents, now) if market is not None and self.store is not None else None
        places_by_rule = getattr(self.policy, "spot_while_in_time", False)
        if places_by_rule:
            quote = _baseline_with_reserve(quote, spec, offers, now, fleet or Fleet())
        started_on_demand = places_by_rule and _starts_on_demand(quote, spec, offers, now, fleet or Fleet())
        if market is None:
            return _on_demand_start(quote) if started_on_demand else quote
        rule = getattr(self.policy, "rule", "greedy")

        def simulated(
            option: Option, spot: bool = False, measures_on_spot: bool = False, futures: int = FUTURES, alone=False
        ) -> Forecast:
            played = quote.model_copy(update={"chosen": option})
            return forecast(
                spec,
                played,
                [option.offer] if alone else offers,  # alone: launched and relaunched there only
                market,
                rule,
                now,
                futures,
                fleet=fleet,
                hedges=self.hedges,
                spot_while_in_time=spot,
                measures_on_spot=measures_on_spot,
            )

        # a policy that places by its rule every round runs the job on spot while in time, whatever tier it chose
        if not started_on_demand:
            played, note = simulated(quote.chosen, places_by_rule), ""
        else:  # a run on spot measures the speed as well as one on on-demand: it starts there if the odds hold so
            on_spot = simulated(quote.chosen, places_by_rule, measures_on_spot=True)
            reserved = simulated(quote.on_demand_baseline, places_by_rule)
            reason = _spot_start_reason(on_spot, reserved, spec.deadline_probability)
            if reason:
                played, note = on_spot, f"; measures its speed on spot: {reason}"
            else:
                quote, played = _on_demand_start(quote), reserved
                note = "; starts on on-demand: the window holds no reserve for a slower speed until it is measured"
                note += _spot_start_note(on_spot, reserved)
        update: dict = {"forecast": played.model_copy(update={"evidence": played.evidence + note})}
        baseline = quote.on_demand_baseline
        if baseline is not None:  # no market randomness there: only the speed's (cheap)
            update["on_demand_baseline"] = baseline.model_copy(update={"forecast": simulated(baseline)})
        if explained:  # each on its own offer and fallback, not placed by the rule's zones: among
            # them all the rule would start each where it starts the chosen one, and every row would read the same
            update["alternatives"] = [
                o.model_copy(update={"forecast": simulated(o, futures=ALTERNATIVE_FUTURES, alone=True)})
                for o in quote.alternatives
            ]
        return quote.model_copy(update=update)

    def outlook(self, job: Job) -> Forecast | None:
        """What a job under way may still cost in all and when it may finish: its quote played again by the policy's
        rule from where it stands (the work left, at its speed once measured, after what it has spent), on the market
        and the fleet of now. None for a job that has ended (its cost is known) or without a market model."""
        market = self.market_now()
        if market is None or self.store is None or job.state.terminal:
            return None
        now = self.clock.now()
        agents = self.store.working_agents()
        return forecast(
            job.spec,
            job.quote,
            self.offers(agents),
            market,
            getattr(self.policy, "rule", "greedy"),
            now,
            fleet=self._fleet(agents, now, without=job.id),
            hedges=self.hedges,
            spot_while_in_time=getattr(self.policy, "spot_while_in_time", False),
            underway=Underway.of(job, now),
            measures_on_spot=job.quote.measures_on_spot,
        )

    def _fleet(self, agents: list[AgentInfo], now: datetime, without: str | None = None) -> Fleet:
        """The fleet a job meets: the agents, the jobs ahead of it (running, then the most urgent waiting; not the
        job itself, `without`), and the newest."""
        others = self.store.active_jobs() + self.store.pending_jobs(0, OTHERS_SEEN)
        others = [j for j in others if j.id != without]
        recent = [j for j in self.store.recent_jobs(OTHERS_SEEN) if not j.demo_copy]
        return Fleet.of(agents, others, now, recent)

    def submit(self, spec: JobSpec, job_id: str | None = None) -> Job:
        """Quote the job and store it as queued; an infeasible job is refused and nothing is stored.
        The id is the name plus a random suffix unless given (the backtest's are reproducible); in a sharded store,
        one in the shard with the most agents it fits (store.new_job_id)."""
        agents = self.store.working_agents()  # read once: for the quote and for the shard the job goes to
        quote = self.quote(spec, agents)
        fitting = [agent for agent in agents if fits(spec, agent.offer)]
        now = self.clock.now()
        while True:
            job = Job(
                id=job_id or self.store.new_job_id(spec.name, fitting),
                spec=spec,
                submitted_at=now,
                updated_at=now,
                quote=quote,
            )
            if self.store.add_job(job):
                return job
            if job_id:
                raise BrokerError(f"job id {job_id!r} exists already; submit it under another name")

    def cancel(self, job_id: str) -> Job:
        """Cancel a job that has not ended."""
        return self.store.set_state(job_id, JobState.cancelled, self.clock.now(), reason="cancelled by user")

    def get(self, job_id: str) -> Job:
        return self.store.get_job(job_id)

    def jobs(self, states: set[JobState] | None = None) -> list[Job]:
        return self.store.list_jobs(states)


# where neither start reaches the asked odds, the reserve's start on on-demand is bought only for this much more odds
# (or when it costs no more): bench/cost.py's default 0.8% less at the same 16 misses (none avoidable), 36 more spot
# starts; bench/forecast.py's 2.0% less with one avoidable miss in 480 jobs (bench/results/cost.md)
ODDS_TRADE = 0.02


def _on_demand_start(quote: Quote) -> Quote:
    """The quote of a job that starts on on-demand: quoted where it starts, the money model's spot choice heading the
    alternatives (so the quote, `broker run`'s local agent and the Terraform plan name where the job will run)."""
    started = quote.on_demand_baseline.offer.id
    alternatives = [o for o in [quote.chosen, *quote.alternatives] if o.offer.id != started][:ALTERNATIVES]
    return quote.model_copy(update={"chosen": quote.on_demand_baseline, "alternatives": alternatives})


def _spot_start_reason(on_spot: Forecast, reserved: Forecast, asked: float) -> str | None:
    """Why a job the reserve for a speed not yet measured would start on on-demand starts on spot instead (None: it
    does not): its futures meet the deadline as often as the spec asks, or as often as with the reserve's start
    (within the noise of the futures' sampling: both are drawn from the same seed, so they differ mostly by the
    start); or the reserve's start falls short of the asked odds too, costs more and adds less than ODDS_TRADE."""
    if on_spot.p_meet_deadline >= min(asked, reserved.p_meet_deadline) - ODDS_NOISE:
        return "the odds hold without the reserve's start"
    short = reserved.p_meet_deadline < asked - ODDS_NOISE
    dearer = reserved.cost_p50_usd > on_spot.cost_p50_usd
    if short and dearer and on_spot.p_meet_deadline >= reserved.p_meet_deadline - ODDS_TRADE:
        return (
            f"the reserve's start on on-demand falls short of the {asked:.2f} asked too, at P(meet deadline)"
            f" {reserved.p_meet_deadline:.3f} for ${reserved.cost_p50_usd:,.2f} p50"
        )
    return None


def _spot_start_note(on_spot: Forecast, reserved: Forecast) -> str:
    """The odds and cost of the start on spot the reserve turned down, and the asked odds at which the job starts
    there: the user weighs the reserve's price (it can be several times the spot start's) against the odds it adds."""
    at_most = math.floor(round((on_spot.p_meet_deadline + ODDS_NOISE) * 100, 6)) / 100
    said = (
        f" (P(meet deadline) {reserved.p_meet_deadline:.3f}; from a start on spot {on_spot.p_meet_deadline:.3f} at"
        f" ${on_spot.cost_p50_usd:,.2f} p50"
    )
    return said + (f": a deadline_probability of {at_most:.2f} or less starts it there)" if at_most > 0 else ")")


def _baseline_with_reserve(quote: Quote, spec: JobSpec, offers: list[Offer], now: datetime, fleet: Fleet) -> Quote:
    """The quote with the cheapest on-demand offer whose window holds the reserve for a speed not yet measured as its
    baseline, where the money model's (the cheapest that meets the deadline at the estimated speed) does not and
    another does. The guard measures the job's progress on the baseline and the futures fall back to it: an L4 with
    its work taking nearly the whole window sent the job to on-demand at once and met the deadline 0.55 of the time,
    where an A100 held the reserve and let it run on spot at 1.00."""
    unsure, speed = _reserve(spec, fleet)

    def holds(option: Option) -> bool:
        return holds_reserve(spec, offers, now, unsure, speed, option.exclusive_h)

    baseline = quote.on_demand_baseline
    if baseline is None or spec.deadline is None or holds(baseline):
        return quote
    on_demand = (evaluate(spec, o, now) for o in offers if o.tier == Tier.on_demand and fits(spec, o))
    held = next((o for o in sorted(on_demand, key=lambda o: o.expected_cost_usd) if holds(o)), None)
    return quote if held is None else quote.model_copy(update={"on_demand_baseline": held})


def _starts_on_demand(quote: Quote, spec: JobSpec, offers: list[Offer], now: datetime, fleet: Fleet) -> bool:
    """Whether a policy that places by its rule starts the job on on-demand, whatever the money model chose: its
    window does not hold the reserve for a speed not yet measured (uniform_progress.starts_on_demand). Its quote
    then chooses its on-demand baseline, so the quote, `broker run`'s local agent and the Terraform plan name where
    the job will run."""
    if quote.on_demand_baseline is None or quote.chosen.offer.tier == Tier.on_demand:
        return False
    unsure, speed = _reserve(spec, fleet)
    # the guard measures progress on the baseline's hours (PlanItem.from_job), not on the fastest on-demand offer's
    return starts_on_demand(spec, offers, now, unsure, speed, quote.on_demand_baseline.exclusive_h)


def _reserve(spec: JobSpec, fleet: Fleet) -> tuple[float, float]:
    """The share of its work a job whose speed is not yet measured keeps in reserve, and the speed it is expected
    at, from the fleet's speed prior for it."""
    prior = fleet.speed_prior(spec)
    return unmeasured_margin(prior.sigma, spec.deadline_probability), prior.median
