"""The broker core: quote, submit, cancel and look up jobs. The CLI and the backtest both drive it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from functools import cached_property

from broker.core.fleet import Fleet, pool_sizes
from broker.core.forecast import FUTURES, Underway, forecast
from broker.core.hedging import MarketHedge
from broker.core.refusals import told_by_futures
from broker.core.reserve import (
    baselines_with_reserve,
    cheapest_at_odds,
    on_demand_start,
    spot_start_note,
    spot_start_reason,
    starts_for_reserve,
)
from broker.domain.errors import BrokerError, InfeasibleError, SpecError
from broker.domain.model import (
    ODDS_NOISE,
    AgentInfo,
    Forecast,
    IfOverBudget,
    Job,
    JobSpec,
    JobState,
    Option,
    Quote,
    Tier,
)
from broker.domain.offer import Offer
from broker.models.fit import fits
from broker.models.launch_waits import with_launch_waits
from broker.models.placement import unknown_exclusions
from broker.planning.cheapest import ALTERNATIVES
from broker.pricing.availability import MarketModel, seen_counts
from broker.pricing.catalog import PriceCatalog
from broker.store.capacity import fleet_seen, zone_of
from broker.store.jobs import Store

OTHERS_SEEN = 1000  # jobs a quote looks at: those waiting ahead of it, and the finished ones it learns speed from
ALTERNATIVE_FUTURES = 250  # an alternative's odds to within about a point (their sd over seeds: 0.1-0.5 points)
CANDIDATES = 2 * ALTERNATIVES  # played for a quote a person reads, the best ALTERNATIVES by their futures shown
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
        guard_pass_h: float | None = None,
    ):
        self.store = store
        self.catalog = catalog
        self.policy = policy
        self.clock = clock
        self._market = market  # when given, quotes carry a forecast: the choice simulated on its futures
        # quotes a person reads: the alternatives simulated too, each on its own offer (what a user weighs them by),
        # and a refusal's fixes read from the quotes they lead to (core/refusals.py); backtests never show them
        self.explained = explained
        # the time between the deadline guard's passes where quoted jobs run, for their futures (Setting.pass_h): a
        # live server's (wiring.make_broker); None: the market model's tick, as the simulated server steps
        self.guard_pass_h = guard_pass_h
        # (when learned, the model with our spells, our pools' sizes lately: core/fleet.pool_sizes)
        self._recent: tuple[datetime, MarketModel, dict[str, float]] | None = None
        self.hedges = MarketHedge(self.market_now, lambda: self.catalog.offers) if market is not None else None
        if self.hedges and getattr(policy, "hedge", False) is None:  # a policy that decides from the market
            policy.hedge = self.hedges
        if store is not None and getattr(policy, "live_spot", False) is None:  # ... and tells market from queue
            policy.live_spot = self.live_spot
        self._live_spot: tuple[datetime | None, list[AgentInfo]] = (None, [])
        self._catalog_offers: tuple[object, object, list[Offer]] = (None, None, [])  # (market, catalog's list, offers)

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
            regions = {zone: o.region for o in self.catalog.offers if (zone := zone_of(o)) in counts}
            self._recent = (now, base.with_recent(counts, regions), pool_sizes(counts))
        return self._recent[1]

    def offers(self, agents: list[AgentInfo] | None = None) -> list[Offer]:
        """The catalog's offers and the bubble offers of the fill executors registered now (`agents`, read from
        the store when not given); a spot offer's launch odds are the market model's where it measured the zone
        (the traces, its siblings', our fleet's spells lately), not its region's mean of traces."""
        offers = self._priced_catalog()
        if self.store is not None:
            known = {o.id for o in offers}
            agents = self.store.agents() if agents is None else agents
            bubbles = {a.offer.id: a.offer for a in agents if a.offer.tier == Tier.bubble and a.offer.id not in known}
            offers += bubbles.values()
        return offers

    def _priced_catalog(self) -> list[Offer]:
        """The catalog's offers with the market model's spells and the waits for capacity they give, computed again
        only when the model (learned again once a tick) or the catalog changes: each quote, outlook and hedge view
        reads them (27 ms on the packaged catalog's 4,190 offers)."""
        market, catalog = self.market_now(), self.catalog.offers
        if self._catalog_offers[0] is not market or self._catalog_offers[1] is not catalog:
            offers = [with_market_spells(o, market) for o in catalog] if market else list(catalog)
            self._catalog_offers = (market, catalog, with_launch_waits(offers))
        return list(self._catalog_offers[2])

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
        if unknown := unknown_exclusions(spec, offers):
            raise SpecError(unknown)
        market = self.market_now()
        try:
            candidates = CANDIDATES if explained and market is not None else ALTERNATIVES
            quote = self.policy.quote(spec, offers, now, alternatives=candidates)
        except InfeasibleError as error:
            if not explained or market is None:
                raise
            raise told_by_futures(error, spec, now, lambda asked: self._quote(asked, agents, False)) from None
        fleet = self._fleet(agents, now) if market is not None and self.store is not None else None
        places_by_rule = getattr(self.policy, "spot_while_in_time", False)
        baselines = baselines_with_reserve(quote, spec, offers, now, fleet or Fleet()) if places_by_rule else []
        rule = getattr(self.policy, "rule", "greedy")

        def simulated(
            option: Option,
            spot: bool = False,
            measures_on_spot: bool = False,
            futures: int = FUTURES,
            alone=False,
            baseline: Option | None = None,
            as_spec: JobSpec = spec,
        ) -> Forecast:
            baseline = baseline or quote.on_demand_baseline
            played = quote.model_copy(update={"chosen": option, "on_demand_baseline": baseline})
            return forecast(
                as_spec,
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
                pass_h=self.guard_pass_h,
            )

        if baselines:  # the futures say which one keeps the odds cheapest, where a market model can play them
            if market is not None:
                chosen = quote.chosen
                played = lambda b: simulated(chosen, True, futures=ALTERNATIVE_FUTURES, baseline=b)  # noqa: E731
                baselines = [cheapest_at_odds(baselines, played, spec.deadline_probability)]
            quote = quote.model_copy(update={"on_demand_baseline": baselines[0]})
        started_on_demand = places_by_rule and starts_for_reserve(quote, spec, offers, now, fleet or Fleet())
        if market is None:
            return on_demand_start(quote) if started_on_demand else quote
        # a policy that places by its rule every round runs the job on spot while in time, whatever tier it chose
        if not started_on_demand:
            played, note = simulated(quote.chosen, places_by_rule), ""
        else:  # a run on spot measures the speed as well as one on on-demand: it starts there if the odds hold so
            on_spot = simulated(quote.chosen, places_by_rule, measures_on_spot=True)
            reserved = simulated(quote.on_demand_baseline, places_by_rule)
            reason = spot_start_reason(on_spot, reserved, spec.deadline_probability)
            if reason:
                played, note = on_spot, f"; measures its speed on spot: {reason}"
            else:
                quote, played = on_demand_start(quote), reserved
                note = "; starts on on-demand: the window holds no reserve for a slower speed until it is measured"
                note += spot_start_note(on_spot, reserved)
        update: dict = {"forecast": played.model_copy(update={"evidence": played.evidence + note})}
        baseline = quote.on_demand_baseline
        if baseline is not None:  # no market randomness there: only the speed's (cheap); run to its end whatever
            # the budget cap, as what the savings are against
            uncapped = spec.model_copy(update={"if_over_budget": IfOverBudget.run})
            update["on_demand_baseline"] = baseline.model_copy(
                update={"forecast": simulated(baseline, as_spec=uncapped)}
            )
        if explained:  # each on its own offer and fallback, not placed by the rule's zones: among
            # them all the rule would start each where it starts the chosen one, and every row would read the same
            alternatives = [
                o.model_copy(update={"forecast": simulated(o, futures=ALTERNATIVE_FUTURES, alone=True)})
                for o in quote.alternatives
            ]
            # the best by their futures, listed as their rows read: those that keep the asked odds first, then by
            # their median cost (the money model's next cheapest, by its means, may keep the odds less often)
            asked = spec.deadline_probability - ODDS_NOISE
            update["alternatives"] = sorted(
                alternatives, key=lambda o: (o.forecast.p_meet_deadline < asked, o.forecast.cost_p50_usd)
            )[:ALTERNATIVES]
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
            pass_h=self.guard_pass_h,
        )

    def _fleet(self, agents: list[AgentInfo], now: datetime, without: str | None = None) -> Fleet:
        """The fleet a job meets: the agents that may take it (one started for another job takes no other), the jobs
        ahead of it (running, then the most urgent waiting; not the job itself, `without`), and the newest."""
        others = self.store.active_jobs() + self.store.pending_jobs(0, OTHERS_SEEN)
        others = [j for j in others if j.id != without]
        recent = [j for j in self.store.recent_jobs(OTHERS_SEEN) if not j.demo_copy]
        self.market_now()  # our fleet's spot capacity lately, read once a model tick
        sizes = self._recent[2] if self._recent else {}
        return Fleet.of([a for a in agents if a.may_take(without)], others, now, recent, sizes)

    def submit(self, spec: JobSpec, job_id: str | None = None) -> Job:
        """Quote the job and store it as queued; an infeasible job is refused and nothing is stored.
        The id is the name plus a random suffix unless given (the backtest's are reproducible); in a sharded store,
        one in the shard with the most agents it fits (store.new_job_id)."""
        agents = self.store.working_agents()  # read once: for the quote and for the shard the job goes to
        quote = self.quote(spec, agents)
        fitting = [a for a in agents if a.for_job is None and fits(spec, a.offer)]  # not one started for another job
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

    def amend(self, job_id: str, deadline: str | None = None, budget_usd: float | None = None) -> Job:
        """Give a job that has not ended another deadline or budget (validated as `submit` validates them, with
        the same one-line errors): the planner, the deadline guard, the budget cap and the job's outlook read them
        from the next round; its quote stays the one it was given at submit. The change is an event of the job.
        A job the budget cap stopped is not over: a larger budget puts it back in the queue (budget.resumed)."""
        from broker.core.budget import resumed
        from broker.domain.specfile import OPTIONS, validate_spec

        now = self.clock.now()
        given = {f: v for f, v in (("deadline", deadline), ("budget_usd", budget_usd)) if v is not None}
        if not given:
            raise BrokerError("amend: nothing to change; give --deadline or --budget")

        def change(job: Job) -> Job:
            if job.state.terminal and not (job.stopped_at_budget and budget_usd is not None):
                fix = "; give --budget above what it spent to resume it" if job.stopped_at_budget else ""
                raise BrokerError(f"job: {job.id} is already {job.state.value}; nothing to change{fix}")
            data = {**job.spec.model_dump(mode="json", exclude_none=True), **given}
            options = {field: OPTIONS[field] for field in given}
            # a deadline kept as it was is checked as at its submission (it may have passed since: a late job)
            spec = validate_spec(data, now if deadline else job.submitted_at, f"job {job.id}", options)
            if job.state.terminal:
                return resumed(job, spec, now)
            return job.model_copy(update={"spec": spec, "updated_at": now})

        def event(shard, pipe, job: Job) -> None:  # the shard whose transaction writes the job
            said = [f"deadline {job.spec.deadline:%Y-%m-%d %H:%M} UTC"] if "deadline" in given else []
            said += [f"budget ${job.spec.budget_usd:,.2f}"] if "budget_usd" in given else []
            shard.event(pipe, job.id, job.state, now, "amended: " + ", ".join(said))

        return self.store.update_job(job_id, change, also=event)

    def get(self, job_id: str) -> Job:
        return self.store.get_job(job_id)


def with_market_spells(offer: Offer, market: MarketModel) -> Offer:
    """A spot offer as the market model measured its zone: its share of time up, a run's preemptions (one an
    up-spell) and the spells down a start waits out. The hazard model's rate is its region's mean over traces: a zone
    our fleet saw up 10 minutes at a time was priced as if a run there lasted 5 hours."""
    spells = market.spot_spells(offer) if offer.tier == Tier.spot else None
    if spells is None:
        return offer
    share, up_h, down_h = spells
    update = {"availability": share, "mean_down_h": down_h}
    if up_h > 0:
        update |= {"hazard_per_h": 1 / up_h, "hazard_source": "the market model's spells up"}
    return offer.model_copy(update=update)
