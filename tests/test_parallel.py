"""Parallel configuration (Pipette, AutoPipe): the memory estimate, the layout search, node placement,
the switch rule, and how the planner prices a transformer job with them."""

import itertools
import math
from dataclasses import replace

import pytest

from broker.domain.errors import SpecError
from broker.domain.model import Tier, TransformerSpec
from broker.domain.offer import Offer
from broker.models import parallel
from broker.models.fit import fits
from broker.models.risk import evaluate, exclusive_hours
from broker.models.transformer import (
    MARGIN,
    Hardware,
    Layout,
    iteration_seconds,
    memory_bytes,
    stage_memory_bytes,
    state_bytes_per_param,
)
from conftest import NOW, make_spec

GPT = TransformerSpec(layers=24, hidden=2048, heads=16, seq_len=2048, vocab=50257, global_batch=64)
HW = Hardware(flops=100e12, intra_bytes_s=300e9, inter_bytes_s=12.5e9, devices_per_node=8)


def test_memory_grows_with_layers_micro_batch_and_without_recompute():
    layout = Layout(p=2, t=2, d=2, micro_batch=2)
    base = memory_bytes(GPT, layout)
    assert memory_bytes(GPT.model_copy(update={"layers": 48}), layout) > base
    assert memory_bytes(GPT, replace(layout, micro_batch=4)) > base
    assert memory_bytes(GPT.model_copy(update={"recompute": True}), layout) < base
    assert memory_bytes(GPT.model_copy(update={"schedule": "gpipe"}), layout) > base  # all m microbatches in flight
    assert memory_bytes(GPT.model_copy(update={"zero_stage": 1}), layout) < base  # optimizer state split d ways
    assert memory_bytes(GPT, Layout(p=2, t=4, d=1, micro_batch=2)) < memory_bytes(
        GPT, Layout(p=2, t=1, d=4, micro_batch=2)
    )


def test_the_last_stage_holds_the_output_layers_logits():
    layout = Layout(p=2, t=1, d=1, micro_batch=4)
    small, large = (stage_memory_bytes(GPT.model_copy(update={"vocab": v}), layout)[-1] for v in (1000, 51000))
    states = 50000 * GPT.hidden * sum(state_bytes_per_param(GPT))  # the extra rows of the output layer
    logits = layout.micro_batch * GPT.seq_len * 50000 * 4  # their fp32 log-softmax, one microbatch in flight
    assert (large - small) / MARGIN >= states + logits


def test_under_1f1b_the_first_stage_holds_the_most_activations():
    stages = stage_memory_bytes(GPT.model_copy(update={"vocab": 8}), Layout(p=4, t=1, d=1, micro_batch=1))
    assert stages == sorted(stages, reverse=True)


def test_the_search_never_picks_a_layout_over_memory_and_falls_back_to_one_that_fits():
    limit = 16e9
    found = parallel.search(GPT, HW, 8, limit)
    assert found and all(c.memory_bytes <= limit for c in found)
    unlimited = parallel.search(GPT, HW, 8, math.inf)
    assert memory_bytes(GPT, unlimited[0].layout) > limit  # the fastest layout does not fit in 16 GB
    assert found[0].iteration_s > unlimited[0].iteration_s


def test_deepspeeds_lock_step_matches_pipettes_form_with_free_links_and_pays_each_exchange_twice_with_latency():
    deepspeed = GPT.model_copy(update={"schedule": "deepspeed"})
    layout = Layout(p=4, t=1, d=1, micro_batch=1)
    free = replace(HW, intra_bytes_s=1e30)
    assert iteration_seconds(deepspeed, layout, free) < iteration_seconds(
        GPT, layout, free
    )  # the head's stage is slower, not all
    equal = {"vocab": 8}  # (almost) no head: equal stages
    assert iteration_seconds(deepspeed.model_copy(update=equal), layout, free) == pytest.approx(
        iteration_seconds(GPT.model_copy(update=equal), layout, free), rel=1e-4
    )
    slow = replace(free, latency_s=0.01)
    pipette_extra = iteration_seconds(GPT, layout, slow) - iteration_seconds(GPT, layout, free)
    lockstep_extra = iteration_seconds(deepspeed, layout, slow) - iteration_seconds(deepspeed, layout, free)
    assert pipette_extra == pytest.approx(math.ceil(64 / 4) * 3 * 2 * 0.01)  # ceil(m/p) rounds of 2 messages per hop
    assert lockstep_extra > pipette_extra  # blocking exchanges hold both neighbours, every step


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_the_chosen_layout_equals_exhaustive_search(gpus):
    small = TransformerSpec(layers=6, hidden=512, heads=8, seq_len=256, vocab=1000, global_batch=16)
    limit = 2.5e9
    every = []
    for p, t, d, b in itertools.product(range(1, 9), range(1, 9), range(1, 9), range(1, 17)):
        if p * t * d != gpus or small.heads % t or small.hidden % t or p > small.layers or small.global_batch % (d * b):
            continue
        layout = Layout(p, t, d, b)
        if memory_bytes(small, layout) <= limit:
            every.append((iteration_seconds(small, layout, replace(HW, devices_per_node=gpus)), layout))
    chosen = parallel.search(small, replace(HW, devices_per_node=gpus), gpus, limit)[0]
    assert chosen.iteration_s == pytest.approx(min(every, key=lambda e: e[0])[0])
    assert len(every) == len(parallel.search(small, replace(HW, devices_per_node=gpus), gpus, limit))


def offer(accelerator, count, price, tier=Tier.on_demand):
    return Offer(
        cloud="aws",
        region="us-east-1",
        zone=None,
        instance_type=f"{accelerator}x{count}",
        tier=tier,
        accelerator=accelerator,
        accelerator_count=count,
        gpu_memory_gb=80,
        vcpus=96,
        memory_gb=1000,
        price_usd_per_h=price,
    )


def transformer_job(**fields):
    return make_spec(
        resources={"accelerators": ["H100:8", "T4:1"]}, work={"steps": 1000}, transformer=GPT.model_dump(), **fields
    )


def test_the_planner_prices_a_transformer_job_with_its_best_layout_and_skips_gpus_it_cannot_fit():
    spec = transformer_job()
    h100, t4 = offer("H100", 8, 98.0), offer("T4", 1, 0.5)
    choice = parallel.best(GPT, "H100", 8)
    assert exclusive_hours(spec, h100) == pytest.approx(1000 * choice.iteration_s / 3600)
    assert evaluate(spec, h100, NOW).expected_cost_usd >= 98.0 * exclusive_hours(spec, h100)
    assert fits(spec, h100) and not fits(spec, t4)  # 1.3 B parameters with Adam do not fit in one T4's 16 GB
    assert parallel.best(GPT, "T4", 1) is None


def test_a_transformer_spec_is_checked_field_by_field():
    with pytest.raises(SpecError, match="hidden 1000 must be a multiple of heads 16"):
        make_spec(work={"steps": 10}, transformer={**GPT.model_dump(), "hidden": 1000})
    with pytest.raises(SpecError, match="work.steps"):
        make_spec(work={"gpu_hours": 10}, transformer=GPT.model_dump())


def test_a_measured_profile_replaces_a_forecast_even_when_close(store):
    from broker.bubbles.profiler import forecast
    from broker.domain.bubbles import FORECAST
    from broker.store.profiles import load_profiles, save_profile

    forecast = forecast("llm", "1f1b", 4, 8, [0.1] * 4, [0.2] * 4, [8 * 10**9] * 4, FORECAST, NOW)[0]
    assert save_profile(store, forecast)
    assert not save_profile(store, forecast)  # the same forecast again: nothing to do
    measured = forecast.model_copy(update={"device": "cuda:0 H100", "iteration_s": forecast.iteration_s * 1.05})
    assert save_profile(store, measured)
    assert load_profiles(store)[0].device == "cuda:0 H100"
    assert not save_profile(store, forecast)  # a forecast never overwrites a measurement within 10%


def test_broker_layout_shows_the_layout_per_shape_and_refuses_a_job_without_a_model(tmp_path):
    import json

    import yaml
    from typer.testing import CliRunner

    from broker.app.cli.main import app
    from conftest import EXAMPLES

    spec = yaml.safe_load((EXAMPLES / "pretrain-gpt-1b3.yaml").read_text())
    spec["resources"]["accelerators"] = ["H100:8", "T4:1"]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = CliRunner().invoke(app, ["layout", str(path), "--json"])
    assert result.exit_code == 0, result.output
    h100, t4 = json.loads(result.stdout)
    model = TransformerSpec(**spec["transformer"])
    choice = parallel.best(model, "H100", 8)
    assert h100["layout"] == str(choice.layout) and h100["memory_gb"] <= 80
    assert h100["hours"] == pytest.approx(spec["work"]["steps"] * choice.iteration_s / 3600, abs=0.01)
    assert h100["on_demand_usd"] > h100["spot_usd"] > 0
    assert t4["layout"] is None and t4["spot_usd"] is None  # 1.3 B parameters with Adam do not fit in 16 GB
    shown = [line.split() for line in CliRunner().invoke(app, ["layout", str(path)]).stdout.splitlines()]
    assert ["T4:1", "does", "not", "fit"] == next(r for r in shown if r[:1] == ["T4:1"])[:4]
    assert next(r for r in shown if r[:1] == ["H100:8"])[-2:] == [
        f"{h100['spot_usd']:,.2f}",
        f"{h100['on_demand_usd']:,.2f}",
    ]
    del spec["transformer"]
    spec["work"] = {"gpu_hours": 10}
    path.write_text(yaml.safe_dump(spec))
    refused = CliRunner().invoke(app, ["layout", str(path)])
    assert refused.exit_code == 2 and "no transformer: section" in refused.output
