"""A job's figures as the readers that show every job need them (the dashboard's overview, `broker cost-report`,
the spend chart): small enough to keep for every job a store ever ran, beside it (store/figures.py), where a parsed
job with its quote is 7-20 KB."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from broker.domain.model import Job, JobState, Run


def run_cost_usd(run: Run, now: datetime) -> float:
    """An ended run at its cost, a running one up to `now`."""
    return run.cost_usd if run.ended_at else run.offer.price_usd_per_h * run.hours(now)


def spend_usd(job: Job, now: datetime) -> float:
    """What the job has cost so far."""
    return sum(run_cost_usd(r, now) for r in job.runs)


def hours_past(deadline: datetime | None, state: JobState, end: datetime) -> float:
    if deadline is None or state == JobState.cancelled:
        return 0.0
    return max(0.0, (end - deadline).total_seconds() / 3600)


def missed_deadline(job: Job, now: datetime) -> bool:
    """Finished after its deadline, or still unfinished past it."""
    return hours_late(job, now) > 0


def hours_late(job: Job, now: datetime) -> float:
    """Hours past its deadline it finished, or is still unfinished at `now`; 0 when on time, cancelled or without
    one."""
    end = job.runs[-1].ended_at if job.state == JobState.done else now
    return hours_past(job.spec.deadline, job.state, end)


@dataclass(frozen=True, slots=True)
class RunSpend:
    """A run's tier, zone, span (its end: `now` while it runs) and cost."""

    tier: str
    zone: str | None
    begin: datetime
    end: datetime
    cost_usd: float

    @property
    def hours(self) -> float:
        """Billed hours, as Run.hours."""
        return max(0.0, (self.end - self.begin).total_seconds() / 3600)


@dataclass(frozen=True, slots=True)
class JobFigures:
    """What the overview, the spend chart and the cost report need of a job: small enough to keep for every job a store
    ever ran (a parsed job with its quote is about 20 KB), and final once the job has ended and its last run with
    it."""

    id: str
    submitted_at: datetime
    state: JobState
    tags: tuple[str, ...]
    spend_usd: float
    on_demand_usd: float
    budget_usd: float | None
    deadline: datetime | None
    finished_at: datetime | None  # a done job's last run's end
    runs: tuple[RunSpend, ...]
    final: bool  # ended, and its last run with it: these figures no longer change
    # what its quote said (Quote.cost_usd, its forecast's p10 and p90, Quote.p_meet_deadline), to set what it cost
    # and when it finished against (`figures` says where they are not kept); None in a record kept before they were
    quoted_usd: float | None = None
    quoted_p10_usd: float | None = None
    quoted_p90_usd: float | None = None
    quoted_p_meet: float | None = None

    def hours_late(self, now: datetime) -> float:
        """As `hours_late` of the job."""
        return hours_past(self.deadline, self.state, self.finished_at if self.state == JobState.done else now)

    def met_deadline(self, now: datetime) -> bool:
        """Finished by its deadline (or without one)."""
        return self.state == JobState.done and self.hours_late(now) == 0

    def to_json(self) -> str:
        """A compact record of the figures (store/figures.py keeps them): a list, times in ISO 8601."""
        return json.dumps(
            [
                self.submitted_at.isoformat(),
                self.state.value,
                self.tags,
                self.spend_usd,
                self.on_demand_usd,
                self.budget_usd,
                _iso(self.deadline),
                _iso(self.finished_at),
                [[r.tier, r.zone, r.begin.isoformat(), r.end.isoformat(), r.cost_usd] for r in self.runs],
                self.final,
                [self.quoted_usd, self.quoted_p10_usd, self.quoted_p90_usd, self.quoted_p_meet],
            ]
        )

    @classmethod
    def from_json(cls, job_id: str, text: str) -> JobFigures:
        """The figures `to_json` recorded for the job (a record without `final` was kept only once final; one without
        the quote's figures, before they were kept)."""
        submitted, state, tags, spend, on_demand, budget, deadline, finished, runs, *rest = json.loads(text)
        final = rest[0] if rest else True
        quoted = rest[1] if len(rest) > 1 else [None] * 4
        at = datetime.fromisoformat
        return cls(
            id=job_id,
            submitted_at=at(submitted),
            state=JobState(state),
            tags=tuple(tags),
            spend_usd=spend,
            on_demand_usd=on_demand,
            budget_usd=budget,
            deadline=deadline and at(deadline),
            finished_at=finished and at(finished),
            runs=tuple(RunSpend(tier, zone, at(begin), at(end), cost) for tier, zone, begin, end, cost in runs),
            final=final,
            quoted_usd=quoted[0],
            quoted_p10_usd=quoted[1],
            quoted_p90_usd=quoted[2],
            quoted_p_meet=quoted[3],
        )


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


def figures(job: Job, now: datetime) -> JobFigures:
    """The job's figures as of `now` (a run under way up to `now`). What its quote said is kept only where what it did
    can be set against it: not where a run was on a local stand-in (`broker run`, a demo), at this machine's speed."""
    quote = job.quote if all(r.on_cloud for r in job.runs) else None
    forecast = quote.forecast if quote else None
    return JobFigures(
        id=job.id,
        submitted_at=job.submitted_at,
        state=job.state,
        tags=tuple(job.tags),
        spend_usd=spend_usd(job, now),
        on_demand_usd=job.on_demand_usd(now),
        budget_usd=job.spec.budget_usd,
        deadline=job.spec.deadline,
        finished_at=job.runs[-1].ended_at if job.state == JobState.done and job.runs else None,
        runs=tuple(
            RunSpend(
                r.offer.tier.value,
                r.offer.zone,
                r.started_at or r.dispatched_at,
                r.ended_at or now,
                run_cost_usd(r, now),
            )
            for r in job.runs
        ),
        final=job.final,
        quoted_usd=quote.cost_usd if quote else None,
        quoted_p10_usd=forecast.cost_p10_usd if forecast else None,
        quoted_p90_usd=forecast.cost_p90_usd if forecast else None,
        # the odds are of the deadline quoted: none where `broker amend` gave the job another since
        quoted_p_meet=quote.p_meet_deadline
        if quote and job.spec.deadline and quote.deadline == job.spec.deadline
        else None,
    )
