"""Tables as people read them: at 80 and 100 columns every id and number stays whole on its row (app/narrow.py)."""

import io

from broker.domain.specfile import load_spec
from conftest import EXAMPLES, NOW


def test_tables_keep_numbers_and_ids_whole_in_narrow_terminals(catalog, store):
    from rich.console import Console

    from broker.app import render, render_costs
    from broker.domain.figures import figures
    from broker.domain.model import AgentInfo, Job, Run
    from broker.models import accounting
    from broker.planning import get

    spec = load_spec(EXAMPLES / "finetune-lora.yaml", NOW)
    quote = get("costslo").quote(spec, catalog.offers, NOW)
    jobs = [
        Job(id=f"finetune-llama3-8b-lora-{i:06x}", spec=spec, submitted_at=NOW, updated_at=NOW, quote=quote)
        for i in range(3)
    ]
    jobs[2] = jobs[2].model_copy(update={"tags": ["demo"]})  # a demo's copy says so in every table
    report = accounting.cost_report([figures(job, NOW) for job in jobs])
    agent = AgentInfo(
        id=f"local-{jobs[0].id}", offer=quote.chosen.offer, host="h", pid=1, job=jobs[1].id, registered_at=NOW
    )
    agents = render.agent_rows([agent], {agent.id: "1"}, NOW)
    run = Run(fence=1, agent=agent.id, offer=quote.chosen.offer, dispatched_at=NOW, started_at=NOW, cost_usd=1.23)
    ran = jobs[0].model_copy(update={"runs": [run]})
    for width in (80, 100):
        console = Console(width=width, record=True)
        for table in (render.quote_table(quote, "quote"), render.jobs_table(jobs), render.runs_table(ran)):
            console.print(table)
        for table in (render_costs.cost_report_table(report), render.agents_table(agents)):
            console.print(table)
        text = console.export_text()
        assert "…" not in text and max(len(line) for line in text.splitlines()) <= width
        rows = [line.split() for line in text.splitlines()]
        assert ["total", "0.00", "0.00", "0.00", "0.00", "0.00", "-"] in rows, text  # every column of the report
        for job in jobs:  # id, quote, spent and runs on the job's own line
            line = next(row for row in rows if row[:1] == [job.id])
            at = line.index(f"${quote.chosen.expected_cost_usd:,.2f}")
            assert line[at + 1] == "$0.00" and "0" in line[at + 2 :], text
        line = next(row for row in rows if row[:1] == [run.id])  # the run's line: its cost whole, last
        assert line[-1].startswith("$1.23") or line[-2] == "$1.23", text
        line = next(row for row in rows if row[:1] == [agent.id])  # its offer folds onto the next line
        assert jobs[1].id in line and line[-1] == "alive", text
        for option in [quote.chosen, *quote.alternatives, quote.on_demand_baseline]:
            for shown in (f"{option.offer.price_usd_per_h:,.4f}", f"${option.expected_cost_usd:,.2f}"):
                assert shown in text
            assert f"{option.p_meet_deadline:.3f}" in text
        assert all(job.id in text for job in jobs)  # whole, to copy into `broker status`
        shown = sum(row[:2] == [jobs[2].id, "queued"] and "(demo)" in row for row in rows)
        assert shown == (1 if width == 80 else 2), text  # the list, and the report where its state column fits


def test_a_backtests_figures_fit_80_columns_whole_and_say_what_the_short_headers_mean():
    from rich.console import Console

    from broker.app import render_figures as figures

    row = dict.fromkeys(figures.BACKTEST_COLUMNS, 1.234)
    rows = [
        row | {"policy": "hedge+bubbles", "cost_usd": 21924.64, "deadline_misses": 16, "migrations": 361},
        row | {"policy": "joint omniscient", "cost_usd": 3458.5, "median_abs_cost_error_pct": None, "brier": None},
    ]
    single = dict.fromkeys(figures.SINGLE_JOB_COLUMNS, 1.5) | {"setting": "1 zone", "policy": "cost-to-go"}
    single |= {"vs_uniform_zone_range_pct": [4.3, 27.6], "windows": 720}
    for width in (80, 100, 200):
        console = Console(width=width, record=True)
        backtest = (figures.BACKTEST_COLUMNS, "Backtest", figures.BACKTEST_NOTE, figures.BACKTEST_OPTIONAL)
        console.print(figures.figures_table(rows, *backtest))
        one = (figures.SINGLE_JOB_COLUMNS, "single job", figures.SINGLE_JOB_NOTE, figures.SINGLE_JOB_OPTIONAL)
        console.print(figures.figures_table([single], *one))
        text = console.export_text()
        assert "…" not in text and max(len(line) for line in text.splitlines()) <= width, text
        lines = [line.split() for line in text.splitlines()]
        assert ["hedge+bubbles", "21,924.64"] == next(r for r in lines if r[:1] == ["hedge+bubbles"])[:2], text
        assert any(r[:3] == ["joint", "omniscient", "3,458.50"] for r in lines), text  # money to the cent
        assert "x joint: over the joint bound" in " ".join(text.split())
        assert "4.3 to 27.6" in text or "per zone" not in text, text  # a range on one line, or left out
    Console(width=40, file=io.StringIO()).print(figures.figures_table(rows, *backtest))  # too narrow: no crash


def test_the_demos_summaries_keep_job_ids_whole_at_80_columns():
    """The demo's last line says to look its jobs up (`broker status JOB`): the ids must print whole."""
    from rich.console import Console

    from broker.app import render_demo

    job = {"state": "done", "cost_usd": 0.0818, "on_demand_cost_usd": 0.3, "migrations": 1, "work_lost_s": 0.0}
    summary = {"speedup": 60.0, "savings_pct": 73.0, "cost_usd": 0.1344, "on_demand_cost_usd": 0.49}
    summary["jobs"] = [
        job | {"id": "demo-train-mlp-95d23f", "tiers": ["spot", "spot"], "agents": ["spot-a", "spot-b"]},
        job | {"id": "demo-batch-infer-dd6780", "tiers": ["spot"], "agents": ["spot-b"], "migrations": 0},
    ]
    run = {"tier": "bubble", "end": "preempted", "checkpoint_step": 281, "seconds": 5.2}
    bubbles = {"main_job": "demo-llm", "stages": [{"stage": 0, "bubble_fraction": 0.18}]}
    bubbles["fill_job"] = {"id": "fill-mlp-0efa50", "state": "done", "cost_usd": 0.0008, "on_demand_cost_usd": 0.0016}
    bubbles["fill_job"]["runs"] = [
        run | {"agent": "demo-llm-stage-2", "resume_from": None},
        run | {"agent": "ondemand-t4", "tier": "on_demand", "resume_from": "/tmp/x/points/fill-mlp-0efa50/r2/4000"},
    ]
    console = Console(width=80, record=True)
    console.print(render_demo.run_summary(summary))
    console.print(render_demo.bubbles_summary(bubbles))
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    for shown in ("demo-train-mlp-95d23f", "demo-batch-infer-dd6780", "demo-llm-stage-2", "$0.0818", "$0.3000"):
        assert shown in text, text


def test_a_long_table_prints_line_for_line_as_rich_prints_it(catalog, monkeypatch):
    """A table of MANY_ROWS rows or more prints its rows as padded lines, rich folding only the cells that need it
    (rich's layout of every cell costs half a millisecond a row): the same text and styles as rich's own, in wide
    and narrow terminals, folded cells, markup and sections and all."""
    from rich.console import Console
    from rich.table import Table

    from broker.app import narrow, render, render_costs
    from broker.app.render_prices import prices_table
    from broker.domain.figures import figures
    from broker.domain.model import Job
    from broker.models import accounting
    from broker.planning import get

    spec = load_spec(EXAMPLES / "finetune-lora.yaml", NOW)
    quote = get("costslo").quote(spec, catalog.offers, NOW)
    jobs = [
        Job(id=f"lora-{i:06x}", spec=spec, submitted_at=NOW, updated_at=NOW, quote=quote, tags=["demo"] * (i % 2))
        for i in range(narrow.MANY_ROWS)
    ]
    report = accounting.cost_report([figures(job, NOW) for job in jobs])
    prices = catalog.table().head(narrow.MANY_ROWS)
    styled = Table(title="styled", title_justify="left")
    styled.add_column("what")
    styled.add_column("figure", justify="right")
    for i in range(narrow.MANY_ROWS):
        what = f"[bold green]row[/] {i} of a table whose rows say a lot" if i % 3 else f"row {i} [1]"
        styled.add_row(what, f"[yellow]{i * 1.5:,.2f}[/]")
        if i == 10:
            styled.add_section()

    def printed(table, width: int, colour: bool) -> str:
        console = Console(width=width, force_terminal=colour, color_system="standard" if colour else None)
        with console.capture() as capture:
            console.print(table)
        return capture.get()

    tables = {
        "jobs": lambda: render.jobs_table(jobs),
        "cost report": lambda: render_costs.cost_report_table(report),
        "prices": lambda: prices_table(prices, len(prices)),
        "styled": lambda: narrow.narrow_safe(styled, "what"),
    }
    for name, make in tables.items():
        fitted = make()
        head = next(iter(fitted.__rich_console__(Console(width=250), Console(width=250).options)))
        assert isinstance(head, Table) and head.rows == [], name  # printed as lines, rich printing only the head
        for width in (250, 120, 100, 80, 60):
            for colour in (False, True):
                fast = printed(make(), width, colour)
                monkeypatch.setattr(narrow, "MANY_ROWS", 10**9)
                assert fast == printed(make(), width, colour), (name, width, colour)
                monkeypatch.undo()


def test_what_a_job_spent_counts_its_run_under_way_up_to_now(catalog):
    """`broker list` and `broker status` said "spent $0.00" of a job hours into its first run (ended runs only)."""
    from datetime import timedelta

    from broker.app import render
    from broker.domain.model import IfOverBudget, Job, Run
    from broker.planning import get

    spec = load_spec(EXAMPLES / "finetune-lora.yaml", NOW)
    quote = get("costslo").quote(spec, catalog.offers, NOW)
    offer = quote.chosen.offer
    run = Run(fence=1, agent="a", offer=offer, dispatched_at=NOW, started_at=NOW)
    job = Job(id="j", spec=spec, submitted_at=NOW, updated_at=NOW, quote=quote, runs=[run])
    later = NOW + timedelta(hours=2)
    spent = f"${2 * offer.price_usd_per_h:,.2f}"
    text = render.job_times(job, later)
    assert (
        f"spent ${2 * offer.price_usd_per_h:,.4f}" in text
        and f"of ${spec.budget_usd:,.2f}" in text
        and "stops there" not in text
    )
    capped = job.model_copy(update={"spec": spec.model_copy(update={"if_over_budget": IfOverBudget.stop})})
    assert "(stops there: if_over_budget)" in render.job_times(capped, later)
    extends = job.model_copy(update={"spec": spec.model_copy(update={"if_late": "extend"})})
    second = spec.deadline + (spec.deadline - NOW)
    assert f", if lost on to {second:%Y-%m-%d %H:%M} UTC" in render.job_times(extends, later)
    assert "if lost" not in text
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render.jobs_table([job], now=later))
    row = next(line.split() for line in console.export_text().splitlines() if line.startswith("j "))
    assert spent in row
    assert "(late)" not in row
    console.print(render.jobs_table([job], now=spec.deadline + timedelta(minutes=1)))  # not ended by its deadline
    assert "(late)" in console.export_text().splitlines()[-1]
