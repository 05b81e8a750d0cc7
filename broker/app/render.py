"""How the CLI shows things: rich tables for people and plain dicts for `--json` (the same data)."""

from __future__ import annotations

from datetime import UTC, datetime

from rich.table import Table

from broker.app.narrow import Fitted, narrow_safe
from broker.domain.figures import missed_deadline, spend_usd
from broker.domain.model import Forecast, IfLate, IfOverBudget, Job, Option, Quote, Tier
from broker.domain.offer import tier_of
from broker.domain.rounding import up_to_cent, up_to_minute


def money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def duration(value: float) -> str:
    return f"{value:,.1f} h" if value >= 1 else f"{value * 60:,.0f} min"


def when(value: datetime | None) -> str:
    return "-" if value is None else f"{value:%Y-%m-%d %H:%M}"


def relative(value: datetime, now: datetime) -> str:
    """A moment as people say it: "3 min ago", "in 16.2 h", "4 days ago", "now"."""
    seconds = (value - now).total_seconds()
    if abs(seconds) < 60:
        return "now"
    hours = abs(seconds) / 3600
    span = duration(hours) if hours < 48 else f"{hours / 24:.0f} days"
    return f"in {span}" if seconds > 0 else f"{span} ago"


def moment(value: datetime, now: datetime, job: Job | None = None) -> str:
    """A time with its distance from now: "2026-11-23 17:14 UTC (3 min ago)"; one of a `job`'s as its clock reads
    it (since)."""
    return f"{value:%Y-%m-%d %H:%M} UTC ({since(value, job, now) if job else relative(value, now)})"


def after(value: datetime, start: datetime) -> str:
    """A moment's distance from a start: "+8 min", for times on a demo's compressed clock (from now they would read
    "in 39 min" for what has ended)."""
    return f"+{duration(max(0.0, (value - start).total_seconds()) / 3600)}"


def since(value: datetime, job: Job, now: datetime) -> str:
    """A moment of the job as its clock reads it: from now, or from its submission for a demo's copy."""
    return after(value, job.submitted_at) if job.demo_copy else relative(value, now)


def where(option: Option) -> str:
    """The offer in a few words: cloud, instance type and location."""
    o = option.offer
    return f"{o.cloud} {o.instance_type} {o.zone or o.region}"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def shown_of(shown: int, total: int | None) -> str:
    """A jobs table's title: how many, or which of how many when it shows the newest only."""
    if total is None or total == shown:
        return plural(shown, "job")
    return f"the newest {shown:,} of {total:,} jobs (--limit 0 for all)"


def gpus(option: Option) -> str:
    return f"{option.offer.accelerator_count}x {option.offer.accelerator}"


def quote_dict(quote: Quote, job_id: str | None, stored: bool) -> dict:
    return {"job": job_id, "stored": stored, "quote": quote.model_dump(mode="json")}


def quote_table(quote: Quote, title: str) -> Fitted:
    """The chosen option first, then the alternatives, with the on-demand baseline last."""
    table = Table(title=title, title_justify="left", caption_justify="left")
    for col in ("", "tier", "offer", "gpus", "$/h", "time", "cost", "P(meet)", "finish UTC"):
        table.add_column(col, justify="right" if col in ("$/h", "time", "cost", "P(meet)") else "left", no_wrap=True)
    rows = [("chosen", quote.chosen)] + [(f"alt {i}", o) for i, o in enumerate(quote.alternatives, 1)]
    if quote.on_demand_baseline is not None:
        rows.append(("on-demand", quote.on_demand_baseline))
    for label, option in rows:
        f = quote.forecast if label == "chosen" else option.forecast
        table.add_row(
            f"[bold green]{label}[/]" if label == "chosen" else label,
            option.offer.tier.value + ("+od" if option.fallback else ""),
            where(option),
            gpus(option),
            f"{option.offer.price_usd_per_h:,.4f}",
            duration(_hours_to(f.finish_p50, quote.created_at) if f and f.finish_p50 else option.expected_wall_h),
            money(f.cost_p50_usd if f else option.expected_cost_usd),
            f"{f.p_meet_deadline:.2f}" if f else f"{option.p_meet_deadline:.3f}",
            when(f.finish_p50 if f and f.finish_p50 else option.expected_finish),
        )
    notes = [short_of_odds(quote)] if quote.short_of_odds else []
    if quote.over_budget:
        notes.append(over_budget(quote.forecast))
    if quote.forecast is not None:
        note = "time, cost and finish are the futures' medians, P(meet) their odds"
        if any(o.forecast is None for o in quote.alternatives):  # a quote made without them (a backtest's)
            note += (
                " (alternatives: the money model's: mean waits for capacity, a constant hazard, the estimated speed)"
            )
        elif quote.alternatives:
            note += "; each alternative run on its own offer"
        notes.append(note)
        on_fallback = [label for label, o in rows if _on_fallback(o, quote.forecast if label == "chosen" else None)]
        if on_fallback:
            notes.append(f"{', '.join(on_fallback)}: on on-demand in nearly every future (under 1% of hours on spot)")
    if quote.savings_usd is not None:
        notes.append(
            # against the on-demand row: the baseline the job falls back to, not always the cheapest on-demand hour
            f"savings vs on-demand on {quote.on_demand_baseline.offer.instance_type}: {money(quote.savings_usd)}"
            f" ({quote.savings_pct:.1f}%)" + (" of the futures' medians" if quote.simulated_savings else "")
        )
    if quote.chosen.fallback is not None:
        notes.append(
            f"+od: the deadline guard moves the job to {quote.chosen.fallback.instance_type} "
            "on-demand if it falls behind"
        )
    if quote.forecast is not None:
        notes.append(forecast_line(quote.forecast))
    table.caption = "\n".join(notes) or None
    return narrow_safe(table, "offer", "gpus", "finish UTC", optional=("gpus", "tier", "finish UTC"))


def _on_fallback(option: Option, played: Forecast | None = None) -> bool:
    """Whether an option off on-demand ran on its on-demand fallback in nearly every future (its tier misleads):
    its own forecast, or `played` (the chosen option's is the quote's). pretrain-gpt-1b3 at twice its on-demand time
    is chosen on spot with too little slack for a start there: its futures run it all on on-demand."""
    f = played or option.forecast
    return f is not None and option.offer.tier != Tier.on_demand and f.spot_share < 0.01


def _hours_to(at: datetime, since: datetime) -> float:
    return (at - since).total_seconds() / 3600


def short_of_odds(quote: Quote) -> str:
    """The warning for a quote whose futures meet the deadline less often than asked, and what would."""
    f, asked = quote.forecast, quote.deadline_probability
    if f.p_within_budget < asked and f.budget_at_odds is not None:  # the budget cap stops the futures it needs
        return (
            f"[yellow]P(meet deadline) {f.p_meet_deadline:.2f} is below the {asked:.2f} asked[/]: the budget cap "
            f"(if_over_budget: stop) ends {1 - f.p_within_budget:.0%} of the futures unfinished; "
            f"raise --budget to {money(f.budget_at_odds)} for the odds asked"
        )
    by = f"by {when(f.finish_at_odds)} UTC" if f.finish_at_odds else "not within the horizon"
    return (
        f"[yellow]P(meet deadline) {f.p_meet_deadline:.2f} is below the {asked:.2f} asked[/]: the futures finish "
        f"{by} that often; move --deadline there, or lower deadline_probability"
    )


def over_budget(f) -> str:
    """The warning for a quote whose futures cost more than the budget more often than not (the money model
    admits an option whose expected cost is within it), and the budget 9 in 10 of them keep."""
    return (
        f"[yellow]P(within budget) {f.p_within_budget:.2f}[/]: the futures cost more than the budget"
        f" {1 - f.p_within_budget:.0%} of the time; raise --budget to {money(f.cost_p90_usd)} for 9 in 10"
    )


def outlook_line(f, asked: float, job_id: str = "JOB") -> str:
    """A job's outlook in a line, warned in yellow when its odds of meeting the deadline fell below those asked, or
    when more of its futures overrun the budget than keep it, with the `broker amend` that would do (the budget 9 in
    10 futures keep; the deadline, or under the budget cap the budget, that its futures meet at the odds asked)."""
    line = f"[bold]outlook now[/], from where it stands: {forecast_line(f)}"
    if f.over_budget:
        line = (
            f"[yellow]over budget likely: P(within budget) {f.p_within_budget:.2f}[/]; `broker amend {job_id} "
            f"--budget {up_to_cent(f.cost_p90_usd):.2f}` keeps 9 in 10 of its futures within it\n" + line
        )
    if f.p_meet_deadline < asked:
        fix = ""
        if f.budget_at_odds is not None and f.p_within_budget < asked:  # the cap stops the futures it needs
            fix = f"; `broker amend {job_id} --budget {f.budget_at_odds:.2f}` for the odds asked"
        elif f.finish_at_odds is not None:
            at = up_to_minute(f.finish_at_odds)
            fix = f"; `broker amend {job_id} --deadline {at:%Y-%m-%dT%H:%MZ}` for the odds asked"
        line = (
            f"[yellow]at risk: P(meet deadline) {f.p_meet_deadline:.2f}, below the {asked:.2f} asked[/]{fix}\n" + line
        )
    return line


def forecast_line(f) -> str:
    """The quote's forecast in a line: cost and finish percentiles and the odds, over how many futures; where the
    futures crowd away from their median (in humps: spot held, on-demand early), the cost most of them lie near."""
    finish = " - ".join(when(t) if t else "after the horizon" for t in (f.finish_p50, f.finish_p90))
    likely = ""
    if f.cost_likely_usd is not None and f.cost_p50_usd > 0 and abs(f.cost_likely_usd / f.cost_p50_usd - 1) >= 0.05:
        likely = f"; most near {money(f.cost_likely_usd)} (half within {f.cost_likely_spread_pct:.0f}%)"
    return (
        f"forecast over {f.futures:,} futures ({f.rule}): cost p10/p50/p90 {money(f.cost_p10_usd)} / "
        f"{money(f.cost_p50_usd)} / {money(f.cost_p90_usd)} (half the futures within {f.cost_spread_pct:.0f}% of "
        f"p50{likely}); finish p50-p90 {finish}; "
        f"P(meet deadline) {f.p_meet_deadline:.2f}, P(within budget) {f.p_within_budget:.2f}; "
        f"{f.spot_share:.0%} {_interruptible(f)}{_taken_back(f)}; market: {f.evidence}"
    )


def _taken_back(f) -> str:
    """How many runs the futures lose to spot on average (a forecast made before it was kept: nothing said)."""
    if f.preemptions_mean is None or f.spot_share <= 0:
        return ""
    return f", {f.preemptions_mean:.1f} preemptions on average"


def _interruptible(f) -> str:
    """Where the futures' interruptible hours are (a bubble offer plays as a spot zone): by its zones' tiers."""
    tiers = {tier_of(zone) for zone in f.zones}
    return " or ".join(w for t, w in ((Tier.spot, "on spot"), (Tier.bubble, "in bubbles")) if t in tiers) or "on spot"


def policies_table(rows: list[dict]) -> Table:
    table = Table(title="policies", title_justify="left")
    for col in ("name", "active", "what it does"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["name"], "yes" if row["active"] else "", row["summary"])
    return table


def jobs_table(jobs: list[Job], total: int | None = None, now: datetime | None = None) -> Fitted:
    """Jobs with where they run (or were quoted to run), the quote and what they spent up to `now` (a run under way
    too; None: the time of the call), late where they ended after their deadline or have not ended by it; `total`:
    how many there are, when these are the newest of them."""
    now = now or datetime.now(UTC)
    table = Table(title=shown_of(len(jobs), total), title_justify="left")
    for col in ("id", "state", "tier", "offer", "gpus", "quote", "spent", "budget", "runs", "deadline UTC"):
        table.add_column(col, justify="right" if col in ("quote", "spent", "budget", "runs") else "left")
    for job in jobs:
        chosen = job.quote.chosen
        offer = job.runs[-1].offer if job.runs else chosen.offer
        table.add_row(
            job.id,
            " ".join([job.state.value, *(f"({tag})" for tag in job.tags), *["(late)"] * missed_deadline(job, now)]),
            offer.tier.value,
            f"{offer.cloud} {offer.instance_type} {offer.zone or offer.region}",
            f"{offer.accelerator_count}x {offer.accelerator}",
            money(job.quote.cost_usd),
            money(spend_usd(job, now)),
            money(job.spec.budget_usd),
            str(len(job.runs)),
            when(job.spec.deadline),
        )
    return narrow_safe(table, "offer", "gpus", "deadline UTC", optional=("gpus", "budget", "deadline UTC", "offer"))


def agent_rows(agents: list, leases: dict[str, str | None], now: datetime) -> list[dict]:
    """An agent per row: id, tier, offer, price, the job it runs, age, and its lease (alive, leaving, lapsed)."""
    rows = []
    for agent in sorted(agents, key=lambda a: a.id):
        lease = leases.get(agent.id)
        rows.append(
            {
                "id": agent.id,
                "tier": agent.offer.tier.value,
                "offer": agent.offer.id,
                "usd_per_h": agent.offer.price_usd_per_h,
                "job": agent.job,
                "age_h": round((now - agent.registered_at).total_seconds() / 3600, 2),
                "lease": "lapsed" if lease is None else ("leaving" if lease == "leaving" else "alive"),
                "host": agent.host,
                "on_cloud": agent.on_cloud,  # False: a local stand-in for the offer (no market evidence)
                "for_job": agent.for_job,  # started for this job alone (`broker run`)
            }
        )
    return rows


def agents_table(rows: list[dict]) -> Fitted:
    table = Table(title=plural(len(rows), "agent"), title_justify="left")
    for col in ("id", "tier", "offer", "$/h", "job", "age", "lease"):
        table.add_column(col, justify="right" if col in ("$/h", "age") else "left")
    for r in rows:
        age = duration(r["age_h"])
        offer = r["offer"].replace("/", " ")  # breakable at its parts: the numbers beside it stay whole
        tier = r["tier"] if r["on_cloud"] else f"{r['tier']} (local)"
        job = r["job"] or (f"- (for {r['for_job']} alone)" if r["for_job"] else "-")
        table.add_row(r["id"], tier, offer, f"{r['usd_per_h']:,.4f}", job, age, r["lease"])
    return narrow_safe(table, "offer", optional=("$/h", "age", "tier", "offer"))


def runs_table(job: Job) -> Fitted:
    """A job's runs across offers: where, when, why each ended, what it cost."""
    table = Table(title=f"runs of {job.id}", title_justify="left")
    for col in (
        "run",
        "agent",
        "tier",
        "offer",
        "started UTC",
        "ended UTC",
        "end",
        "progress",
        "checkpoint",
        "cost",
        "work lost",
    ):
        table.add_column(col, justify="right" if col in ("cost", "work lost", "progress") else "left", no_wrap=True)
    for run in job.runs:
        total = f"/{run.progress_total:g}" if run.progress_total else ""
        table.add_row(
            run.id,
            run.agent,
            run.offer.tier.value,
            f"{run.offer.cloud} {run.offer.instance_type}",
            when(run.started_at),
            when(run.ended_at),
            run.end_reason or "running",
            f"{run.progress_done:g}{total}",
            ("-" if run.checkpoint_step is None else f"step {run.checkpoint_step}")
            + ("; last save failed" if run.checkpoint_error else ""),
            money(run.cost_usd),
            f"{run.work_lost_s:.0f} s",
        )
    folded = ("offer", "started UTC", "ended UTC")
    return narrow_safe(table, *folded, optional=("work lost", "tier", "checkpoint", "offer", "ended UTC", "agent"))


def job_times(job: Job, now: datetime) -> str:
    """When the job came, when it must end and what it may spend, and what it has spent."""
    deadline = job.spec.deadline
    parts = [f"submitted {moment(job.submitted_at, now, job)}"]
    parts.append(f"deadline {moment(deadline, now, job)}" if deadline else "no deadline")
    if deadline and job.spec.if_late == IfLate.extend:  # its second window (planning/uniform_progress.Progress)
        parts[-1] += f", if lost on to {moment(deadline + (deadline - job.submitted_at), now, job)} (if_late: extend)"
    budget = job.spec.budget_usd
    capped = " (stops there: if_over_budget)" if job.spec.if_over_budget == IfOverBudget.stop else ""
    spent = f"spent ${spend_usd(job, now):,.4f}"  # a run under way up to now: a job hours in had spent "$0"
    parts.append(spent + (f" of {money(budget)}{capped}" if budget else " (no budget)"))
    return " · ".join(parts)


def job_dict(job: Job, events: list[dict] | None = None) -> dict:
    out = job.model_dump(mode="json")
    if events is not None:
        out["events"] = events
    return out
