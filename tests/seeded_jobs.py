"""Five stored jobs in every state, with known runs, and the numbers the overview must show of them (the `seeded`
fixture, conftest.py): the dashboard's, the ledger's and the accounting's tests read them."""

from datetime import UTC, datetime, timedelta

from broker import planning
from broker.domain.model import Job, JobState, Run, Tier
from conftest import make_spec


def offer(catalog, tier):
    return min(
        (o for o in catalog.offers if o.accelerator == "L4" and o.accelerator_count == 1 and o.tier == tier),
        key=lambda o: o.price_usd_per_h,
    )


def ended_run(fence, off, start, hours, reason, lost_s=0.0):
    end = start + timedelta(hours=hours)
    return Run(
        fence=fence,
        agent=f"a{fence}",
        offer=off,
        dispatched_at=start,
        started_at=start,
        ended_at=end,
        end_reason=reason,
        cost_usd=off.price_usd_per_h * hours,
        work_lost_s=lost_s,
    )


def seed_jobs(store, catalog):
    """Five jobs in every state, with known runs; returns them with the numbers the overview must show."""
    now = datetime.now(UTC)
    spot, on_demand = offer(catalog, Tier.spot), offer(catalog, Tier.on_demand)
    base = dict(resources={"accelerators": ["L4:1"]}, work={"gpu_hours": 1}, budget_usd=20)

    def job(name, state, runs, deadline_h=24.0):
        spec = make_spec(name=name, deadline=f"+{deadline_h}h", now=now - timedelta(hours=6), **base)
        quote = planning.get().quote(spec, [spot, on_demand], now - timedelta(hours=6))
        j = Job(
            id=name,
            spec=spec,
            state=state,
            submitted_at=now - timedelta(hours=6),
            updated_at=now,
            quote=quote,
            runs=runs,
            fence=len(runs),
        )
        assert store.add_job(j)
        return j

    t0 = now - timedelta(hours=5)
    jobs = [
        job(
            "migrated",
            JobState.done,
            [
                ended_run(1, spot, t0, 2, "preempted", 600),
                ended_run(2, on_demand, t0 + timedelta(hours=2), 1, "finished"),
            ],
        ),
        job(
            "late", JobState.done, [ended_run(1, spot, t0, 4, "finished")], deadline_h=3
        ),  # ends 2 h after its deadline
        job("crashed", JobState.failed, [ended_run(1, spot, t0, 0.5, "failed")]),
        job("waiting", JobState.queued, []),
        job("stopped", JobState.cancelled, []),
    ]
    spend = sum(r.cost_usd for j in jobs for r in j.runs)
    baseline = sum(
        j.quote.on_demand_baseline.offer.price_usd_per_h
        * (sum((r.ended_at - r.started_at).total_seconds() for r in j.runs) - sum(r.work_lost_s for r in j.runs))
        / 3600
        for j in jobs
    )
    return {"jobs": jobs, "spend": spend, "baseline": baseline, "budget_used": 100 * spend / (20 * len(jobs))}
