"""`broker layout JOB.yaml`: how a `transformer:` training job would be laid out on each instance shape it
accepts, and what a step and the whole job would cost there."""

from __future__ import annotations

from pathlib import Path

import typer

from broker.app.cli.common import JsonOpt, make_broker, out, print_json, user_errors
from broker.app.render_figures import figures_table
from broker.domain.errors import BrokerError
from broker.domain.model import Tier
from broker.domain.specfile import load_spec

COLUMNS = {
    "shape": "shape",
    "layout": "layout",
    "iteration_s": "iteration s",
    "memory_gb": "GB/gpu",
    "hours": "hours",
    "spot_usd_per_step": "spot $/step",
    "spot_usd": "spot $",
    "on_demand_usd": "on-demand $",
}
NOTE = (
    "layout: p pipeline stages x t tensor-parallel x d data-parallel, b the micro-batch; the costs are the whole job's "
    "at the cheapest offer of each tier (--json names it)."
)


def rows(spec, offers) -> list[dict]:
    """Per accepted (accelerator, count): the fastest layout that fits, its memory, and the cheapest prices."""
    from broker.models import parallel

    out_rows = []
    for wanted in spec.resources.accelerators:
        shaped = [o for o in offers if o.accelerator == wanted.name and o.accelerator_count == wanted.count]
        choice = parallel.best(spec.transformer, wanted.name, wanted.count)
        row = {"shape": str(wanted), "layout": None, "iteration_s": None, "memory_gb": None, "hours": None}
        if choice is not None:
            hours = spec.work.steps * choice.iteration_s / 3600
            row.update(
                layout=str(choice.layout),
                iteration_s=round(choice.iteration_s, 4),
                memory_gb=round(choice.memory_bytes / 1e9, 2),
                hours=round(hours, 2),
            )
        for tier in (Tier.spot, Tier.on_demand):
            priced = [o for o in shaped if o.tier == tier]
            cheapest = min(priced, key=lambda o: o.price_usd_per_h) if priced else None
            row[f"{tier.value}_offer"] = cheapest.id if cheapest else None
            row[f"{tier.value}_usd_per_step"] = (
                round(parallel.usd_per_step(choice, cheapest.price_usd_per_h), 6) if cheapest and choice else None
            )
            row[f"{tier.value}_usd"] = (
                round(cheapest.price_usd_per_h * row["hours"], 2) if cheapest and choice else None
            )
        out_rows.append(row)
    return out_rows


def command(
    job_file: Path = typer.Argument(..., help="A job spec with a transformer: section."), as_json: bool = JsonOpt
) -> None:
    """The parallel layout (pipeline x tensor x data, micro-batch) per instance shape, memory, and cost per step."""
    broker = make_broker(with_store=False)
    spec = load_spec(job_file, broker.clock.now())
    if spec.transformer is None:
        raise BrokerError(
            f"{job_file}: no transformer: section; describe the model (layers, hidden, heads, "
            "seq_len, vocab, global_batch)"
        )
    found = rows(spec, broker.catalog.offers)
    if as_json:
        print_json(found)
        return
    shown = [row | ({"layout": "does not fit"} if row["layout"] is None else {}) for row in found]
    out.print(figures_table(shown, COLUMNS, f"{spec.name}: {spec.work.steps} steps", NOTE))


layout_command = user_errors(command)
