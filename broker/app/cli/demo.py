"""`broker demo [--bubbles]`: the product end to end on this machine, with a summary."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import Progress

from broker.app import render, render_demo
from broker.app.cli.common import (
    JsonOpt,
    above_zero,
    err,
    make_broker,
    out,
    print_json,
    redis_url,
    stop_signals_as_ctrl_c,
    store_for,
    user_errors,
)
from broker.app.settings import Settings
from broker.domain.errors import BrokerError
from broker.domain.model import Quote


@user_errors
@stop_signals_as_ctrl_c
def demo(
    examples: Path = typer.Option(
        None, help="Directory of example job specs (runnable ones in demo/); default: ./examples, else the project's."
    ),
    speedup: float = typer.Option(
        60.0,
        max=3600.0,  # 50,000: the demo jobs' quotes took days of its clock, and no offer met their deadlines
        callback=above_zero,
        help="Time compression: simulated seconds per wall-clock second (at most 3600: an hour a second).",
    ),
    timeout: float = typer.Option(150.0, callback=above_zero, help="Give up after this many wall-clock seconds."),
    bubbles: bool = typer.Option(
        False, "--bubbles", help="Instead: a fill job in a real DeepSpeed pipeline's bubbles (about 2 minutes)."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Quote the example jobs, then run the runnable ones end to end: dispatch, preemption, migration."""
    from broker.app.demo import quote_examples, run_demo

    examples = examples or default_examples()
    if bubbles:
        return demo_bubbles(examples, max(timeout, 300.0), as_json)

    files = sorted(examples.glob("*.yaml"))
    if not files or not (examples / "demo").is_dir():
        raise BrokerError(
            f"examples: no *.yaml and demo/ in {examples}; run from the project root or pass --examples DIR"
        )
    settings = Settings.from_env()
    broker = make_broker(with_store=False)
    quotes = quote_examples(broker, files)
    if not as_json:
        for q in quotes:
            if "quote" in q:
                out.print(render.quote_table(Quote.model_validate(q["quote"]), f"{q['file']}: quote"))
            else:
                out.print(f"[bold]{q['file']}[/]: [yellow]refused[/] {q['refused']}\n")
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("running the demo jobs", total=None)

        def show(jobs):
            bar.update(task, description="  ".join(f"{j.spec.name}: {j.state.value}" for j in jobs))

        summary = run_demo(
            redis_url(settings),
            settings.home,
            examples,
            broker.catalog,
            broker.policy,
            speedup,
            timeout,
            show,
            show_in=store_for(settings),
            market=broker.market,
        )
    if as_json:
        print_json({"quotes": quotes, **summary})
    else:
        out.print(render_demo.run_summary(summary))
        out.print("its jobs, tagged demo: `broker list`, `broker status JOB`, `broker logs JOB`, `broker dashboard`")
    if summary["unfinished"]:
        first = next(r for r in summary["jobs"] if r["state"] != "done")
        raise BrokerError(
            f"demo: {len(summary['unfinished'])} of {len(summary['jobs'])} jobs did not finish "
            f"({first['id']}: {first['state']}, {first['reason'] or 'no reason recorded'}); "
            f"`broker status {first['id']}` shows its runs and log"
        )


def default_examples() -> Path:
    """./examples when there is one, else the examples of the project this package was installed from."""
    here = Path("examples")
    if (here / "demo").is_dir():
        return here
    return Path(__file__).resolve().parents[3] / "examples"


def demo_bubbles(examples: Path, timeout: float, as_json: bool) -> None:
    from broker.app.demo_bubbles import run_bubbles_demo

    if not (examples / "bubbles" / "train_gpt.py").exists():
        raise BrokerError(
            f"examples: no bubbles/train_gpt.py in {examples}; run from the project root or pass --examples DIR"
        )
    settings = Settings.from_env()
    broker = make_broker(with_store=False)
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("starting the training job (DeepSpeed, 4 ranks)", total=None)

        def show(job, training):
            run = job.runs[-1] if job.runs else None
            where = f"{run.offer.tier.value}@{run.agent}" if run else "waiting"
            bar.update(
                task,
                description=(
                    f"training {'running' if training else 'ended'}; {job.spec.name}: {job.state.value} {where}"
                ),
            )

        summary = run_bubbles_demo(
            redis_url(settings),
            settings.home,
            examples,
            broker.catalog,
            broker.policy,
            timeout,
            progress=show,
            show_in=store_for(settings),
        )
    if as_json:
        print_json(summary)
    else:
        out.print(render_demo.bubbles_summary(summary))
    job = summary["fill_job"]
    if job["state"] != "done":
        raise BrokerError(f"demo: the fill job {job['id']} did not finish ({job['state']}); `broker status` shows why")
