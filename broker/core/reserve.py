"""The on-demand side of a quote for a policy that places by its rule (Uniform Progress's family): the baseline the
deadline guard measures a job's progress on and falls back to, which must hold the reserve for a speed not yet
measured, and whether the job starts on on-demand for that reserve or on spot."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from datetime import datetime

from broker.core.fleet import Fleet
from broker.domain.model import ODDS_NOISE, Forecast, JobSpec, Option, Quote, Tier
from broker.domain.offer import Offer
from broker.models.fit import fits
from broker.models.risk import evaluate, unmeasured_margin
from broker.planning.cheapest import ALTERNATIVES
from broker.planning.uniform_progress import SPEEDS_DIFFER, holds_reserve, starts_on_demand

MAX_BASELINES = 3  # on-demand speeds a quote plays as the job's baseline, cheapest first

# where neither start reaches the asked odds, the reserve's start on on-demand is bought only for this much more odds
# (or when it costs no more): bench/cost.py's default 0.8% less at the same 16 misses (none avoidable), 36 more spot
# starts; bench/forecast.py's 2.0% less with one avoidable miss in 480 jobs (bench/results/cost.md)
ODDS_TRADE = 0.02


def on_demand_start(quote: Quote) -> Quote:
    """The quote of a job that starts on on-demand: quoted where it starts (so the quote, `broker run`'s local agent
    and the Terraform plan name where the job will run), the money model's spot choice first among the alternatives
    (a quote a person reads then lists them by their futures); as many as the quote had, at least ALTERNATIVES."""
    started = quote.on_demand_baseline.offer.id
    kept = max(len(quote.alternatives), ALTERNATIVES)
    alternatives = [o for o in [quote.chosen, *quote.alternatives] if o.offer.id != started][:kept]
    return quote.model_copy(update={"chosen": quote.on_demand_baseline, "alternatives": alternatives})


def spot_start_reason(on_spot: Forecast, reserved: Forecast, asked: float) -> str | None:
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


def spot_start_note(on_spot: Forecast, reserved: Forecast) -> str:
    """The odds and cost of the start on spot the reserve turned down, and the asked odds at which the job starts
    there: the user weighs the reserve's price (it can be several times the spot start's) against the odds it adds."""
    at_most = math.floor(round((on_spot.p_meet_deadline + ODDS_NOISE) * 100, 6)) / 100
    said = (
        f" (P(meet deadline) {reserved.p_meet_deadline:.3f}; from a start on spot {on_spot.p_meet_deadline:.3f} at"
        f" ${on_spot.cost_p50_usd:,.2f} p50"
    )
    return said + (f": a deadline_probability of {at_most:.2f} or less starts it there)" if at_most > 0 else ")")


def baselines_with_reserve(
    quote: Quote, spec: JobSpec, offers: list[Offer], now: datetime, fleet: Fleet
) -> list[Option]:
    """The on-demand options a job's baseline may be, cheapest first: those whose window holds the reserve for a speed
    not yet measured, the cheapest of each speed, at most MAX_BASELINES; the money model's (the cheapest that meets
    the deadline at the estimated speed) first where it holds it; it alone where none does. The guard measures the
    job's progress on the baseline and the futures fall back to it: an L4 with its work taking nearly the whole window
    sent the job to on-demand at once and met the deadline 0.55 of the time, where an A100 held the reserve and let it
    run on spot at 1.00. Which of them is cheapest for the job is the futures' to say (cheapest_at_odds)."""
    baseline = quote.on_demand_baseline
    if baseline is None or spec.deadline is None:
        return [baseline] if baseline is not None else []
    unsure, speed = _reserve(spec, fleet)

    @functools.cache
    def holds_in(hours: float) -> bool:
        return holds_reserve(spec, offers, now, unsure, speed, hours)

    def holds(option: Option) -> bool:  # the offers of one speed hold it or not together
        return holds_in(option.exclusive_h)

    on_demand = (evaluate(spec, o, now) for o in offers if o.tier == Tier.on_demand and fits(spec, o))
    held = [o for o in sorted(on_demand, key=lambda o: o.expected_cost_usd) if holds(o)]
    if holds(baseline):
        held = [baseline, *held]
    speeds: list[Option] = []
    for option in held:  # zones of one speed differ by their price alone: the cheapest stands for them
        if not any(_same_speed(option, kept) for kept in speeds):
            speeds.append(option)
    return speeds[:MAX_BASELINES] or [baseline]


def _same_speed(a: Option, b: Option) -> bool:
    return max(a.exclusive_h, b.exclusive_h) <= SPEEDS_DIFFER * min(a.exclusive_h, b.exclusive_h)


def cheapest_at_odds(baselines: list[Option], played: Callable[[Option], Forecast], asked: float) -> Option:
    """The baseline whose futures (`played`: the chosen option run with it to fall back to) cost least in the mean
    while meeting the `asked` odds; where none does, the surest unless it adds less than ODDS_TRADE to the cheapest's
    odds. A cheap on-demand baseline whose work barely fits the window with the reserve leaves the guard no slack:
    finetune-lora with 23 h to go ran all on an L4 on-demand ($13.24, P(meet) 0.956), where with an A100 to fall
    back to it ran on L4 spot."""
    if len(baselines) < 2:
        return baselines[0]
    futures = [(b, played(b)) for b in baselines]
    meeting = [(b, f) for b, f in futures if f.p_meet_deadline >= asked - ODDS_NOISE]
    if meeting:
        return min(meeting, key=lambda t: t[1].cost_mean_usd)[0]
    cheapest = min(futures, key=lambda t: t[1].cost_mean_usd)
    surest = max(futures, key=lambda t: (t[1].p_meet_deadline, -t[1].cost_mean_usd))
    return surest[0] if surest[1].p_meet_deadline >= cheapest[1].p_meet_deadline + ODDS_TRADE else cheapest[0]


def starts_for_reserve(quote: Quote, spec: JobSpec, offers: list[Offer], now: datetime, fleet: Fleet) -> bool:
    """Whether a policy that places by its rule starts the job on on-demand, whatever the money model chose: its
    window does not hold the reserve for a speed not yet measured (uniform_progress.starts_on_demand). Its quote
    then chooses its on-demand baseline, so the quote, `broker run`'s local agent and the Terraform plan name where
    the job will run. The money model's own choice of on-demand (no spot offer alone keeps the odds) is no start
    there: the rule still runs the job on spot while in time, so it too may measure its speed there."""
    if quote.on_demand_baseline is None:
        return False
    if quote.chosen.offer.tier == Tier.on_demand and not any(
        o.tier != Tier.on_demand and fits(spec, o) for o in offers
    ):
        return False  # no spot to measure the speed on
    unsure, speed = _reserve(spec, fleet)
    # the guard measures progress on the baseline's hours (PlanItem.from_job), not on the fastest on-demand offer's
    return starts_on_demand(spec, offers, now, unsure, speed, quote.on_demand_baseline.exclusive_h)


def _reserve(spec: JobSpec, fleet: Fleet) -> tuple[float, float]:
    """The share of its work a job whose speed is not yet measured keeps in reserve, and the speed it is expected
    at, from the fleet's speed prior for it."""
    prior = fleet.speed_prior(spec)
    return unmeasured_margin(prior.sigma, spec.deadline_probability), prior.median
