"""A planning round's decisions: where each job goes, and why the others wait (Unplaced)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, computed_field


def relative_gap(objective: float, bound: float) -> float:
    """How far a solution's objective is above a lower bound, as a share of the objective."""
    return max(0.0, objective - bound) / max(abs(objective), 1e-9)


class Unplaced(StrEnum):
    """Why a planning round left a job pending."""

    resources = "resources"  # no offer has the hardware or tier the job asks for
    memory = "memory"  # the hardware fits, but not the job's memory
    deadline = "deadline"  # nothing that fits finishes by the job's deadline
    budget = "budget"  # nothing that fits finishes within the job's own budget
    round_budget = "round budget"  # the round's spending limit (BROKER_ROUND_BUDGET_USD) is used up
    capacity = "capacity"  # offers fit, but none has room now
    waiting = "waiting for spot"  # cheaper capacity is expected before the deadline needs on-demand

    @property
    def own_constraint(self) -> bool:
        """The job's own deadline or budget cannot be met: it is late or over either way, so it may run anyway."""
        return self in (Unplaced.deadline, Unplaced.budget)


class Plan(BaseModel):
    """One planning round's decisions: where each job goes, and why the others wait."""

    policy: str
    assignments: dict[str, str] = {}  # job id -> offer id
    fallbacks: dict[str, str] = {}  # job id -> on-demand offer id the deadline guard keeps in reserve
    unplaced: dict[str, Unplaced] = {}  # job id -> why it waits
    expected_cost_usd: float = 0.0
    objective: float | None = None  # the program's objective (cost plus pending penalties)
    bound: float | None = None  # a proven lower bound on it (the LP relaxation)
    stats: dict[str, float] = {}  # how the solve went: seconds pricing, building, solving; passes; columns

    @computed_field
    @property
    def gap(self) -> float | None:
        return None if self.objective is None or self.bound is None else relative_gap(self.objective, self.bound)
