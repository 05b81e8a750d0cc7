"""What a refused job is told to change, read from the quotes it would get: the money model's fixes (the estimate's
earliest finish, the expected cost) are what it admits, not what the futures bear out. Told the estimate's finish, a
job was quoted at P(meet) 0.34 with 0.95 asked; told its expected cost, P(within budget) read 0.48."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from broker.domain.errors import InfeasibleError
from broker.domain.model import IfOverBudget, JobSpec, Quote
from broker.planning.cheapest import move_deadline_to, raise_budget_to

DEADLINE_STEP = timedelta(minutes=5)  # how near the deadline told is to the earliest one that holds
DOUBLINGS = 4  # how far past the estimate's finish the deadline is looked for: up to 16 times its slack


def told_by_futures(
    error: InfeasibleError, spec: JobSpec, now: datetime, quote: Callable[[JobSpec], Quote]
) -> InfeasibleError:
    """The refusal with its fixes moved to where `quote` (the broker's, without alternatives or advice) holds: the
    budget 9 in 10 of the futures keep where the job is quoted with budget enough, and the earliest deadline at
    which the quote meets the asked odds within the budget (where none does, the job is not told to move it)."""
    told = str(error)
    if error.dearer is not None:  # with budget enough the job is quoted on the cheapest option in time
        enough = {"budget_usd": None, "if_over_budget": IfOverBudget.run}  # no budget: nothing to cap at
        p90 = quote(spec.model_copy(update=enough)).forecast.cost_p90_usd
        expected = raise_budget_to(error.dearer.expected_cost_usd)
        if p90 > error.dearer.expected_cost_usd:
            covers = expected.removeprefix("raise --budget to ")
            said = f"{raise_budget_to(p90)} (its futures cost that or less 9 times in 10; {covers} covers the"
            told = told.replace(expected, f"{said} expected cost)")
    if error.later is not None and spec.deadline is not None:
        finish, asked = error.later.expected_finish, spec.deadline_probability
        at = earliest_deadline(spec, finish, now, quote)
        if at is not None:
            told = told.replace(move_deadline_to(finish), move_deadline_to(at))
            told += f" (quoted there, it meets the deadline {asked:.2f} of the time)"
        else:  # the money model's deadline would be refused again, or quoted short of the odds or over budget
            far = now + 2**DOUBLINGS * (finish - now)
            instead = (
                ""
                if error.dearer is not None
                else "move --deadline later and raise --budget, or lower deadline_probability"
            )
            told = told.replace(f" or {move_deadline_to(finish)}", "").replace(move_deadline_to(finish), instead)
            told += f"; no deadline up to {far:%Y-%m-%dT%H:%MZ} is quoted at the {asked:.2f} asked within the budget"
    return InfeasibleError(told, error.later, error.dearer)


def earliest_deadline(
    spec: JobSpec, finish: datetime, now: datetime, quote: Callable[[JobSpec], Quote]
) -> datetime | None:
    """The earliest deadline, to DEADLINE_STEP, at which the job is quoted at the asked odds and within its budget
    more often than not (a quote with neither warning), looked for from the money model's earliest `finish` within
    the budget (None: none within 2**DOUBLINGS times its time from `now`). The odds grow with the deadline: its time
    is doubled until one holds, then halved between the last that did not and it."""

    def holds(at: datetime) -> bool:
        try:
            quoted = quote(spec.model_copy(update={"deadline": at}))
        except InfeasibleError:
            return False
        return not quoted.short_of_odds and not quoted.over_budget

    low = high = finish
    for _ in range(DOUBLINGS + 1):
        if holds(high):
            break
        low, high = high, now + 2 * (high - now)
    else:
        return None
    while high - low > DEADLINE_STEP:
        middle = low + (high - low) / 2
        low, high = (low, middle) if holds(middle) else (middle, high)
    return high
