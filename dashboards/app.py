"""The broker dashboard (Streamlit): cost, savings, jobs, prices and risk, bubbles, backtests.

Read-only on the live store: BROKER_REDIS_URL (or the embedded server's URL, which
`broker dashboard` passes in) and BROKER_PREFIX. Live pages refresh every few seconds.
"""

from __future__ import annotations

import functools
import os
from datetime import UTC, datetime
from pathlib import Path

import altair as alt
import pandas as pd
import redis
import streamlit as st

from broker.app import render_costs, wiring
from broker.app.ledger import Ledger
from broker.app.render import money
from broker.app.settings import Settings
from broker.core.broker import Broker
from broker.core.waiting import waiting_for
from broker.domain.bubbles import stage_agent_id
from broker.domain.errors import BrokerError
from broker.domain.model import IfOverBudget
from broker.models import accounting
from broker.planning import DEFAULT_POLICY
from broker.pricing.catalog import PriceCatalog
from broker.sim import results
from broker.sim.backtest import BUBBLES
from broker.store.prices import PriceHistory
from broker.store.profiles import load_fill_stats, load_profiles
from broker.store.shards import ShardedStore

REFRESH_S = 5
JOBS_SHOWN = 200  # the Jobs page's table and picker: the newest jobs (a store keeps every job it ever ran)
PAGES = ["Overview", "Jobs", "Prices and risk", "Bubbles", "Backtest"]


@st.cache_resource
def store() -> ShardedStore:
    """The store as every command opens it: BROKER_REDIS_URL (`broker dashboard` passes the embedded one's),
    BROKER_PREFIX and BROKER_SHARDS (one shard read alone showed none of a sharded broker's jobs)."""
    return wiring.store_for(Settings.from_env())


@st.cache_resource
def ledger() -> Ledger:
    """Every job's figures, an ended job's kept once read (a store keeps every job it ever ran)."""
    return Ledger(store())


@st.cache_resource(ttl=60)
def catalog() -> PriceCatalog:
    """Priced as quotes and dispatch price it (newest prices, hazard with our agents' evidence); a minute old."""
    return wiring.live_catalog(store(), Settings.from_env())


@st.cache_resource(ttl=60)
def broker() -> Broker:
    """The broker as `broker status` makes it (its policy, live prices, the market model learned when first asked)."""
    return wiring.make_broker(live=True)


@st.cache_data(ttl=60, show_spinner=False)
def outlook(job_id: str, updated_at: datetime) -> dict | None:
    """A job's outlook (Broker.outlook) as of its last change, at most a minute old."""
    ahead = broker().outlook(store().get_job(job_id))
    return ahead.model_dump() if ahead else None


def now() -> datetime:
    return datetime.now(UTC)


def unreadable(error: Exception) -> None:
    """Why the store cannot be read, and the fix, in one message."""
    if isinstance(error, KeyError):
        why = "BROKER_REDIS_URL is not set; start the dashboard with `broker dashboard`, or set it"
    elif isinstance(error, redis.ConnectionError):
        why = f"lost the connection to Redis ({error}); check that it runs"
    else:
        why = str(error)  # a BrokerError names its own fix
    st.error(f"cannot read the store: {why}")


def store_errors_shown(page):
    """A page's store errors as one message: a fragment's end at Streamlit's own handler (a traceback), not main's."""

    @functools.wraps(page)
    def shown() -> None:
        try:
            page()
        except (BrokerError, redis.ConnectionError) as error:  # unreachable, or gone since the page first read it
            unreadable(error)

    return shown


@st.fragment(run_every=REFRESH_S)
@store_errors_shown
def overview() -> None:
    with st.spinner("reading every job once (20,000 take a few seconds); then only those not yet ended"):
        jobs = ledger().figures(now())
    if not jobs:
        st.info("no jobs yet: run `broker submit examples/finetune-lora.yaml` (or `broker demo`)")
        return
    kpi = accounting.overview(jobs, now())
    cols = st.columns(4)
    cols[0].metric("Spend to date", money(kpi["spend_usd"]))
    cols[1].metric(
        "Savings vs on-demand",
        money(kpi["savings_usd"]),
        None if kpi["savings_pct"] is None else f"{kpi['savings_pct']:.1f}%",
    )
    cols[2].metric("Deadline misses", kpi["deadline_misses"])
    cols[3].metric("Budget used", "-" if kpi["budget_used_pct"] is None else f"{kpi['budget_used_pct']:.1f}%")
    cols = st.columns(5)
    for col, state in zip(cols, ("running", "queued", "done", "failed", "cancelled")):
        col.metric(f"Jobs {state}", kpi[state])
    if line := render_costs.quote_record_line(accounting.quote_record(jobs, now())):
        st.caption(line)
    spend = accounting.spend_over_time(jobs, now())
    if not spend.empty:
        long = spend.reset_index(names="time").melt("time", var_name="tier", value_name="spend $")
        chart = alt.Chart(long).mark_area().encode(x="time:T", y=alt.Y("spend $:Q", stack=True), color="tier:N")
        st.subheader("Spend over time by tier")
        st.altair_chart(chart, width="stretch")


@st.fragment(run_every=REFRESH_S)
@store_errors_shown
def jobs_page() -> None:
    jobs, total = store().recent_jobs(JOBS_SHOWN), store().job_count()
    if not jobs:
        st.info("no jobs yet: run `broker submit examples/finetune-lora.yaml` (or `broker demo`)")
        return
    if total > len(jobs):
        st.caption(f"the newest {len(jobs):,} of {total:,} jobs (`broker list --limit 0` lists them all)")
    st.dataframe(accounting.jobs_frame(jobs, now()), hide_index=True, width="stretch")
    chosen = st.selectbox("Job", [j.id for j in jobs], index=len(jobs) - 1)
    job = next(j for j in jobs if j.id == chosen)
    if waiting := waiting_for(store(), job):  # as `broker status` says it
        st.info(f"waiting: {waiting}")
    cols = st.columns(4)
    cols[0].metric("Quoted", money(job.quote.cost_usd))
    budget = job.spec.budget_usd
    capped = " (stops there)" if job.spec.if_over_budget == IfOverBudget.stop else ""
    of = f"of the {money(budget)} budget{capped}" if budget else None
    realised = money(accounting.spend_usd(job, now()))
    cols[1].metric("Realised so far", realised, delta=of, delta_color="off", delta_arrow="off")  # a note, no change
    cols[2].metric("Migrations", job.migrations)
    asked = job.quote.deadline_probability
    short = f"{job.quote.p_meet_deadline - asked:+.2f} vs the {asked:.2f} asked" if job.quote.short_of_odds else None
    cols[3].metric("Quoted P(meet deadline)", f"{job.quote.p_meet_deadline:.2f}", delta=short)
    if verdict := render_costs.quote_verdict(job, now()):  # finished: as `broker status` says it
        st.caption(verdict)
    ahead = None if job.state.terminal else outlook(job.id, job.updated_at)
    if ahead:
        cols = st.columns(3)
        cols[0].metric("Outlook cost p50", money(ahead["cost_p50_usd"]))
        cols[1].metric("Outlook cost p10 - p90", f"{money(ahead['cost_p10_usd'])} - {money(ahead['cost_p90_usd'])}")
        risk = None if asked is None else ahead["p_meet_deadline"] - asked  # None: no deadline, no odds asked
        cols[2].metric(
            "Outlook P(meet deadline)",
            f"{ahead['p_meet_deadline']:.2f}",
            delta=f"{risk:+.2f} vs the {asked:.2f} asked: at risk" if risk is not None and risk < 0 else None,
        )
        st.caption(
            "outlook: the quote made again from where the job stands (the work left, at its speed once measured, "
            "after what it has spent), on today's market and fleet"
        )
    if job.runs:
        st.subheader("Runs across offers")
        runs = [
            {
                "run": r.id,
                "agent": r.agent,
                "tier": r.offer.tier.value,
                "offer": r.offer.id,
                "started": r.started_at,
                "ended": r.ended_at,
                "end": r.end_reason or "running",
                "progress": r.progress_done,
                "checkpoint step": r.checkpoint_step,
                "cost $": round(r.cost_usd, 4),
                "work lost s": round(r.work_lost_s, 1),
            }
            for r in job.runs
        ]
        stamp = st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss")  # UTC, as the server stamps runs
        shown = {"started": stamp, "ended": stamp}
        st.dataframe(pd.DataFrame(runs), hide_index=True, width="stretch", column_config=shown)
        progress = accounting.progress_frame(job)
        if not progress.empty:
            st.subheader("Progress over time")
            st.line_chart(progress, x="time", y="done", color="run")
    if job.log_tail:
        st.subheader("Last output")
        st.code("\n".join(job.log_tail))


def prices_page() -> None:
    history = PriceHistory(store())
    live = catalog().with_history(history.latest())  # the catalog is a minute old; its prices need not be
    offers = pd.DataFrame([o.model_dump() | {"offer": o.id} for o in live.offers])
    gpus = sorted(offers["accelerator"].unique())
    gpu = st.selectbox("Accelerator", gpus, index=gpus.index("A100") if "A100" in gpus else 0)
    rows = offers[offers["accelerator"] == gpu].assign(
        usd_per_gpu_h=lambda f: f["price_usd_per_h"] / f["accelerator_count"]  # an 8-GPU instance is not 8x dearer
    )
    cheapest = rows.groupby(["cloud", "tier"])["usd_per_gpu_h"].min().unstack("tier")
    st.subheader(f"Cheapest {gpu} price per GPU-hour by cloud")
    st.dataframe(cheapest, width="stretch")
    by_region = rows.groupby(["cloud", "region", "tier"])["usd_per_gpu_h"].min().reset_index()
    chart = (
        alt.Chart(by_region)
        .mark_bar()
        .encode(
            x=alt.X("region:N", sort="y"),
            y=alt.Y("usd_per_gpu_h:Q", title="$ per GPU-hour"),
            color="tier:N",
            xOffset="tier:N",
            tooltip=["cloud", "region", "tier", "usd_per_gpu_h"],
        )
    )
    st.subheader("Spot vs on-demand by region, per GPU-hour")
    st.altair_chart(chart, width="stretch")
    st.subheader("Preemption hazard per spot offer (per hour, with its 90% band)")
    spot = rows[rows["tier"] == "spot"]
    bands = [catalog().hazard.spot(c, r, i) for c, r, i in zip(spot["cloud"], spot["region"], spot["instance_type"])]
    spot = spot.assign(hazard_low=[b.low for b in bands], hazard_high=[b.high for b in bands])
    columns = ["offer", "price_usd_per_h", "hazard_per_h", "hazard_low", "hazard_high", "availability", "hazard_source"]
    st.dataframe(spot[columns].sort_values("price_usd_per_h"), hide_index=True, width="stretch")
    price_history(history, gpu, set(rows["offer"]))


def price_history(history: PriceHistory, gpu: str, offer_ids: set[str]) -> None:
    st.subheader(f"{gpu} price history")
    recorded = [o for o in history.offers() if o in offer_ids]
    if not recorded:
        st.info(
            f"no recorded {gpu} prices yet: run `broker prices refresh` or `broker prices import FILE`; "
            "prices above are the packaged snapshot"
        )
        return
    chosen = st.selectbox("Offer", recorded)
    series = history.series(chosen)
    chart = (
        alt.Chart(series)
        .mark_line(point=True, interpolate="step-after")
        .encode(x="at:T", y=alt.Y("usd:Q", title="USD per hour"))
    )
    st.altair_chart(chart, width="stretch")
    st.dataframe(series, hide_index=True, width="stretch")


def bubbles_page() -> None:
    profiles = load_profiles(store())
    if not profiles:
        st.info(
            "no main training jobs registered yet: pipeline bubbles become capacity once an instrumented "
            "DeepSpeed job reports its bubble profile"
        )
        return
    filled = load_fill_stats(store())
    served = {}
    for job in ledger().figures(now()):
        for run in job.runs:
            if run.tier == "bubble":
                served.setdefault(run.zone, set()).add(job.id)
    for main_job in sorted({p.main_job for p in profiles}):
        stages = sorted((p for p in profiles if p.main_job == main_job), key=lambda p: p.stage)
        st.subheader(f"Main job {main_job}")
        rows = []
        for p in stages:
            fill = filled.get((main_job, p.stage))
            share, slowdown = (fill.fill_share(), fill.slowdown(p)) if fill else (None, None)
            rows.append(
                {
                    "stage": p.stage,
                    "device": p.device,
                    "iteration s": p.iteration_s,
                    "bubble fraction": p.bubble_fraction(),
                    "usable share": p.usable_s(0.05) / p.iteration_s,
                    "free GB": min(w.free_bytes for w in p.windows) / 1e9,
                    "bubble time filled": share,
                    "windows missed": fill.missed if fill else None,
                    "main-job slowdown %": None if slowdown is None else 100 * slowdown,
                    "fill jobs served": len(served.get(stage_agent_id(main_job, p.stage), ())),
                    "measured": p.measured_at,
                }
            )
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
        windows = pd.DataFrame(
            [
                {"stage": f"stage {p.stage}", "kind": w.kind, "start": w.offset_s, "end": w.offset_s + w.median_s}
                for p in stages
                for w in p.windows
            ]
        )
        chart = (
            alt.Chart(windows)
            .mark_bar()
            .encode(
                x=alt.X("start:Q", title="seconds into the iteration"),
                x2="end:Q",
                y="stage:N",
                color="kind:N",
                tooltip=["stage", "kind", "start", "end"],
            )
        )
        st.altair_chart(chart, width="stretch")


def backtest_page() -> None:
    directory = st.text_input("Backtest output directory", os.environ.get("BROKER_BACKTEST_DIR", ""))
    if not directory:
        st.info(
            "no backtest loaded: run `broker backtest --out DIR` and enter DIR here (or `broker "
            "dashboard --backtest DIR`)"
        )
        return
    try:
        table, spend, summary = results.load(Path(directory))
    except BrokerError as error:
        st.info(f"no backtest loaded: {error}")
        return
    if summary:
        st.caption(
            f"{summary.get('jobs')} jobs, seed {summary.get('seed')}, traces {summary.get('traces')}, "
            f"{len(summary.get('spot_offers', []))} spot offers"
        )
    rows = table.set_index("policy")
    best = next((p for p in (f"{DEFAULT_POLICY}{BUBBLES}", DEFAULT_POLICY) if p in rows.index), rows.index[0])
    cols = st.columns(4)
    cols[0].metric(f"Cost ({best})", money(rows.loc[best, "cost_usd"]))
    savings = rows.loc[best, "savings_pct"]
    cols[1].metric("Savings vs all on-demand", "-" if pd.isna(savings) else f"{savings:.1f}%")
    cols[2].metric("Deadline misses", int(rows.loc[best, "deadline_misses"]))
    # the joint bound (all jobs at once, capacity shared): a per-job bound ignores the contention no policy avoids
    joint = "cost_vs_joint_omniscient" in rows and not pd.isna(rows.loc[best, "cost_vs_joint_omniscient"])
    ratio = rows.loc[best, "cost_vs_joint_omniscient" if joint else "cost_vs_omniscient"]
    label = "Cost / joint bound" if joint else "Cost / omniscient (per job)"
    cols[3].metric(label, "-" if pd.isna(ratio) else f"{ratio:.2f}x")
    st.dataframe(table, hide_index=True, width="stretch")
    st.subheader("Cost by policy")
    bars = (
        alt.Chart(table)
        .mark_bar()
        .encode(
            x="cost_usd:Q",
            y=alt.Y("policy:N", sort=list(table.policy)),
            color=alt.Color("deadline_misses:O", title="misses", scale=alt.Scale(scheme="orangered")),
            tooltip=["policy", "cost_usd", "savings_pct", "deadline_misses", "cost_vs_omniscient"],
        )
    )
    st.altair_chart(bars, width="stretch")
    st.subheader("Cumulative spend")
    long = spend.reset_index().melt("hours", var_name="policy", value_name="spend $")
    st.altair_chart(alt.Chart(long).mark_line().encode(x="hours:Q", y="spend $:Q", color="policy:N"), width="stretch")
    st.subheader("Tier mix (instance hours)")
    mix = table.melt("policy", value_vars=["bubble_h", "spot_h", "on_demand_h"], var_name="tier", value_name="hours")
    st.altair_chart(
        alt.Chart(mix).mark_bar().encode(x=alt.X("hours:Q", stack=True), y="policy:N", color="tier:N"),
        width="stretch",
    )


def main() -> None:
    st.set_page_config(page_title="broker", layout="wide")
    st.title("broker")
    page = st.sidebar.radio("Page", PAGES)
    try:
        {
            "Overview": overview,
            "Jobs": jobs_page,
            "Prices and risk": prices_page,
            "Bubbles": bubbles_page,
            "Backtest": backtest_page,
        }[page]()
    except (BrokerError, KeyError, redis.ConnectionError) as error:
        unreadable(error)


main()
