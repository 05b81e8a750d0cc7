"""The first planner: each job alone on the cheapest offer that meets its deadline and budget."""

from __future__ import annotations

import difflib
import math
from datetime import datetime

from broker.domain.errors import InfeasibleError
from broker.domain.model import JobSpec, Option, Quote, Tier
from broker.domain.offer import Offer
from broker.domain.plan import Plan, Unplaced
from broker.domain.rounding import up_to_cent, up_to_minute
from broker.models.fit import allowed_tiers, fits, memory_fits, model_fits, shape_fits
from broker.models.placement import where
from broker.models.risk import evaluate
from broker.planning import register
from broker.planning.option_table import PlanItem

ALTERNATIVES = 4  # a quote shows the chosen option and this many others


def cost_order(option: Option) -> tuple:
    return (option.expected_cost_usd, option.expected_finish, option.offer.id)


def _shape(option: Option) -> tuple:
    return (option.offer.cloud, option.offer.instance_type, option.offer.tier)


def _where(option: Option) -> str:
    o = option.offer
    return f"{o.cloud} {o.instance_type} {o.tier.value} in {o.zone or o.region}"


def no_offer_fits(spec: JobSpec, offers: list[Offer]) -> str:
    """Why no offer fits the job, as the first of its asks that leaves none (tiers, shape, memory, place), with what
    there is instead: one line naming the field and the fix."""
    wanted = ", ".join(str(a) for a in spec.resources.accelerators)
    tiers = allowed_tiers(spec)
    if not tiers:
        return "tiers: bubbles run only fill jobs (fill: true, with a fill_task); add spot or on_demand to tiers"
    shaped = [o for o in offers if shape_fits(spec, o)]
    if not shaped:
        names = {a.name for a in spec.resources.accelerators}
        counts = sorted({(o.accelerator, o.accelerator_count) for o in offers if o.accelerator in names})
        there = ", ".join(f"{name}:{count}" for name, count in counts) or "none of them"
        return f"resources.accelerators: no offer has {wanted}; there are {there}"
    tiered = [o for o in shaped if o.tier in tiers]
    if not tiered:
        have = ", ".join(sorted({o.tier.value for o in shaped}))
        bubbles = (
            " (a training job lends bubbles while it runs: none is registered now)" if Tier.bubble in tiers else ""
        )
        return f"tiers: no {wanted} offer in {', '.join(sorted(t.value for t in tiers))}{bubbles}; it comes as {have}"
    sized = [o for o in tiered if memory_fits(spec, o)]
    if not sized and spec.transformer is not None and not any(model_fits(spec, o) for o in tiered):
        most = max(o.gpu_memory_gb for o in tiered)
        return (
            f"transformer: no layout of the model fits in the memory of {wanted} (at most {most:g} GB a GPU); "
            "allow more or larger GPUs, or a higher zero_stage (`broker layout` shows each shape)"
        )
    if not sized:
        most = max(tiered, key=lambda o: (o.gpu_memory_gb, o.memory_gb or 0, o.vcpus or 0))
        has = f"{most.gpu_memory_gb:g} GB a GPU, {most.memory_gb or 0:g} GB, {most.vcpus or 0:g} vCPUs"
        return (
            f"resources: no {wanted} offer has the GPU memory, host memory and CPUs asked (the most: {has}); "
            "ask for less or allow larger GPUs"
        )
    r = spec.resources
    level = next((name for name in ("zone", "region", "cloud") if getattr(r, name)), None)
    if level is None:  # only its exclusions leave none
        return f"resources: every {wanted} offer is in a place it excludes ({', '.join(r.exclude)}); exclude less"
    names = sorted({str(getattr(o, level)) for o in sized if getattr(o, level)})
    close = difflib.get_close_matches(getattr(r, level)[0], names, n=3)
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    there = f"did you mean {', '.join(close)}?" if close else f"it runs in {level} {shown}"
    return f"resources.{level}: no {wanted} offer in {where(spec)}; {there}"


@register("cheapest")
class CheapestFeasible:
    """Minimum expected cost subject to P(meet deadline) >= target and expected cost <= budget."""

    name = "cheapest"
    rule = "greedy"  # how the job then runs (models/futures.py): wait for spot until the guard's safety net

    def options(self, spec: JobSpec, offers: list[Offer], now: datetime) -> list[Option]:
        """Every offer the job fits, priced, cheapest first."""
        return sorted((evaluate(spec, o, now) for o in offers if fits(spec, o)), key=cost_order)

    def plan(self, items: list[PlanItem], offers: list[Offer], capacity: dict[str, int], now: datetime) -> Plan:
        """Greedy: each job in the given order (most urgent first) on its cheapest feasible offer with room left."""
        left = {o.id: capacity.get(o.id, math.inf) for o in offers}
        plan = Plan(policy=self.name)
        for item in items:
            options = self.options(item.spec, [o for o in offers if left[o.id] >= 1], now)
            feasible = [o for o in options if o.feasible]
            if not feasible:
                on_time = any(o.meets_deadline for o in options)
                own = Unplaced.budget if on_time else Unplaced.deadline
                room = any(fits(item.spec, o) for o in offers)  # fits somewhere, but all of those are taken
                plan.unplaced[item.id] = own if options else Unplaced.capacity if room else Unplaced.resources
                continue
            chosen = feasible[0]
            plan.assignments[item.id] = chosen.offer.id
            if chosen.fallback is not None:
                plan.fallbacks[item.id] = chosen.fallback.id
            plan.expected_cost_usd += chosen.expected_cost_usd
            left[chosen.offer.id] -= 1
        return plan

    def quote(self, spec: JobSpec, offers: list[Offer], now: datetime, alternatives: int = ALTERNATIVES) -> Quote:
        """The cheapest feasible option, the next `alternatives` distinct ones, and the on-demand baseline."""
        options = self.options(spec, offers, now)
        if not options:
            raise InfeasibleError(no_offer_fits(spec, offers))
        feasible = [o for o in options if o.feasible]
        if not feasible:
            later = min((o for o in options if o.within_budget), key=lambda o: o.expected_finish, default=None)
            dearer = next((o for o in options if o.meets_deadline), None)  # options come cheapest first
            raise InfeasibleError(self._why_infeasible(spec, options), later, dearer)
        chosen = feasible[0]
        others, seen = [], {_shape(chosen)}
        for option in feasible[1:]:
            if _shape(option) not in seen:
                seen.add(_shape(option))
                others.append(option)
            if len(others) == alternatives:
                break
        on_demand = [o for o in options if o.offer.tier == Tier.on_demand]
        baseline = next((o for o in on_demand if o.meets_deadline), on_demand[0] if on_demand else None)
        return Quote(
            policy=self.name,
            created_at=now,
            chosen=chosen,
            alternatives=others,
            on_demand_baseline=baseline,
            deadline_probability=spec.deadline_probability if spec.deadline is not None else None,
            deadline=spec.deadline,
        )

    @staticmethod
    def _why_infeasible(spec: JobSpec, options: list[Option]) -> str:
        on_time = [o for o in options if o.meets_deadline]
        affordable = sorted((o for o in options if o.within_budget), key=lambda o: o.expected_finish)
        parts = []
        if on_time:
            best = on_time[0]
            parts.append(
                f"cheapest option meeting the deadline is {_where(best)} at {_up_to_cent(best.expected_cost_usd)}"
            )
        else:
            fastest = min(options, key=lambda o: o.expected_finish)
            parts.append(
                f"no offer meets the deadline; the earliest finish is {fastest.expected_finish:%Y-%m-%d %H:%M} UTC"
                f" on {_where(fastest)}"
            )
        if affordable and not on_time and affordable[0].expected_finish == fastest.expected_finish:
            parts[-1] += f", within the budget at ${affordable[0].expected_cost_usd:,.2f}"  # said once, not twice
        elif affordable:
            best = affordable[0]
            parts.append(
                f"earliest finish within the budget is {best.expected_finish:%Y-%m-%d %H:%M} UTC on {_where(best)}"
                f" at ${best.expected_cost_usd:,.2f}"
            )
        elif spec.budget_usd is not None:
            parts.append(f"nothing fits the budget of ${spec.budget_usd:,.2f}")
        return "deadline/budget: no offer meets both; " + "; ".join(parts) + "; " + _fix(on_time, affordable)


def _fix(on_time: list[Option], affordable: list[Option]) -> str:
    """The flags that would make the job feasible: a budget raise only where some option meets the deadline (to
    the cheapest of those), a later deadline only where some option fits the budget; both where neither does."""
    fixes = [raise_budget_to(on_time[0].expected_cost_usd)] if on_time else []
    if affordable:  # the money model's earliest finish within the budget; the broker moves it to its futures' odds
        fixes.append(move_deadline_to(affordable[0].expected_finish))
    return " or ".join(fixes) if fixes else "move --deadline later and raise --budget"


def _up_to_cent(usd: float) -> str:
    """A cost as a budget that admits it: rounded up (a budget of the cost rounded down refused it again)."""
    return f"${up_to_cent(usd):,.2f}"


def raise_budget_to(usd: float) -> str:
    """The budget fix."""
    return f"raise --budget to {_up_to_cent(usd)}"


def move_deadline_to(at: datetime) -> str:
    """The deadline fix, to the next minute (the flag takes minutes); "or later": spot at the asked odds may need
    more time than the option that finishes first."""
    return f"move --deadline to {up_to_minute(at):%Y-%m-%dT%H:%MZ} or later"
