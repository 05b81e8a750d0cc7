"""A job as users write it (close to a SkyPilot task): resources, work, checkpoint, deadline, budget, tiers,
and optionally the transformer model it trains. Validation gives one message per field.
"""

from __future__ import annotations

import math
import re
import shlex
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from broker.domain.accelerators import lookup
from broker.domain.errors import SpecError


def _accelerator_name(name: str) -> str:
    """The canonical accelerator name, as a validation error pydantic can report."""
    try:
        return lookup(name).name
    except SpecError as err:
        raise ValueError(str(err)) from None


class Tier(str, Enum):
    bubble = "bubble"
    spot = "spot"
    on_demand = "on_demand"


class IfLate(str, Enum):
    """What a job does once its deadline is lost (even on-demand from now would finish after it)."""

    cheapest = "cheapest"  # spot that no job still in time is waiting for, on-demand when there is none
    soonest = "soonest"  # on-demand to the end, as Can't Be Late's safety net
    # a second window as long as the first (to the deadline plus the time from submit to it), run to by the policy's
    # rule as the first was (waiting for spot when ahead), after the jobs still in time; lost too: cheapest
    extend = "extend"


class IfOverBudget(str, Enum):
    """What a job does once what it spent reaches its budget (`budget_usd`)."""

    run = "run"  # runs on to the end: the budget steers the plan and warns, it does not stop the job
    stop = "stop"  # checkpoints and ends failed, a guard pass's spend past the budget at most (core/budget.py)


MAX_GPU_HOURS = 1e6  # a million A100-hours: far past any job a broker of small jobs takes, far from float trouble
MAX_BUDGET_USD = 1e9
MAX_DEADLINE_DAYS = 366  # deadlines further out are typos (+99999999h), and overflow datetimes


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class AcceleratorOption(_Spec):
    """One acceptable accelerator shape, written `A100:1` (count defaults to 1)."""

    name: str
    count: int = Field(1, ge=1, le=64)

    @model_validator(mode="before")
    @classmethod
    def _parse_short_form(cls, value: Any) -> Any:
        if isinstance(value, str):
            name, _, count = value.partition(":")
            if count and not count.strip().isdigit():
                raise ValueError(f"count in {value!r} must be a whole number, as in A100:1")
            return {"name": name, "count": int(count) if count else 1}
        return value

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        return _accelerator_name(name)

    def __str__(self) -> str:
        return f"{self.name}:{self.count}"


Cloud = Literal["aws", "gcp", "azure"]
Names = list[Annotated[str, Field(min_length=1, max_length=64)]]
SCHEMES: dict[str, Cloud] = {"s3": "aws", "gs": "gcp", "gcs": "gcp", "az": "azure", "abfs": "azure", "abfss": "azure"}


def _one_or_many(value: Any) -> Any:
    """`cloud: aws` means `cloud: [aws]`: one name or a list of names."""
    return [value] if isinstance(value, str) else value


class Resources(_Spec):
    """What an instance must have, and where it may be (SkyPilot's `cloud`, `region`, `zone`: any of those
    listed; `exclude`: clouds, regions or zones never to use)."""

    accelerators: list[AcceleratorOption] = Field(min_length=1)
    gpu_memory_gb: float | None = Field(None, gt=0, description="minimum memory per GPU")
    cpus: float | None = Field(None, gt=0, description="minimum vCPUs per instance")
    memory_gb: float | None = Field(None, gt=0, description="minimum host memory per instance")
    cloud: list[Cloud] | None = Field(None, min_length=1)
    region: Names | None = Field(None, min_length=1)
    zone: Names | None = Field(None, min_length=1)
    exclude: Names = []
    num_nodes: int = 1

    @field_validator("accelerators", mode="before")
    @classmethod
    def _accelerators(cls, value: Any) -> Any:
        return [value] if isinstance(value, (str, dict)) else value

    @field_validator("cloud", "region", "zone", "exclude", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        return _one_or_many(value)

    @field_validator("num_nodes")
    @classmethod
    def _one_node(cls, value: int) -> int:
        if value != 1:
            raise ValueError(
                "broker places single-instance jobs; ask for the GPUs on one instance (e.g. A100:8), or run the "
                "multi-node job yourself and let broker fill its pipeline bubbles"
            )
        return value


class Data(_Spec):
    """Where the job's input lives: an offer elsewhere pays to move `size_gb` there (models/placement.py)."""

    url: str | None = None  # s3://, gs://, az:// ...: names the cloud
    cloud: Cloud | None = None
    region: str = Field(min_length=1, max_length=64)
    size_gb: float = Field(gt=0, le=1e6)

    @model_validator(mode="before")
    @classmethod
    def _cloud_from_url(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("url"), str) or "://" not in data["url"]:
            return data
        scheme = data["url"].partition("://")[0].lower()
        if scheme not in SCHEMES:
            raise ValueError(f"url scheme {scheme!r} is not one of {', '.join(sorted(SCHEMES))}")
        if data.get("cloud") not in (None, SCHEMES[scheme]):
            raise ValueError(f"cloud {data['cloud']!r} disagrees with the url ({scheme}:// is {SCHEMES[scheme]})")
        return {**data, "cloud": SCHEMES[scheme]}

    @model_validator(mode="after")
    def _cloud_known(self) -> Data:
        if self.cloud is None:
            raise ValueError("give the cloud the data is in (cloud: aws) or its url (s3://bucket/path)")
        return self


class Work(_Spec):
    """How much work the job is: reference GPU-hours, or steps at a measured rate."""

    gpu_hours: float | None = Field(None, gt=0, le=MAX_GPU_HOURS, description="GPU-hours on an A100-40GB")
    steps: int | None = Field(None, gt=0, le=10**15)
    steps_per_hour: dict[str, float] | None = None
    kind: Literal["training", "inference"] = "training"

    @field_validator("steps_per_hour")
    @classmethod
    def _rates(cls, rates: dict[str, float] | None) -> dict[str, float] | None:
        if rates is None:
            return None
        out = {}
        for name, rate in rates.items():
            if not 0 < rate < math.inf:
                raise ValueError(f"rate for {name} must be a number > 0 steps/hour")
            out[_accelerator_name(name)] = rate
        return out

    @model_validator(mode="after")
    def _one_measure(self) -> Work:
        if (self.gpu_hours is None) == (self.steps is None):
            raise ValueError("give either gpu_hours, or steps with steps_per_hour")
        return self


class CheckpointSpec(_Spec):
    size_gb: float = Field(1.0, ge=0, le=1e6)
    restore_minutes: float = Field(2.0, ge=0, le=10_000)


class TransformerSpec(_Spec):
    """A transformer training job by its shape: the broker chooses its parallel layout on each offer
    (policies/parallel.py) and prices `work.steps` iterations with it."""

    layers: int = Field(ge=1, le=10_000)
    hidden: int = Field(ge=8)
    heads: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    vocab: int = Field(ge=1)
    global_batch: int = Field(ge=1, description="sequences per iteration")
    precision: Literal["fp32", "bf16", "fp16"] = "bf16"
    optimizer: Literal["adam", "sgd"] = "adam"
    zero_stage: int = Field(0, ge=0, le=3)
    recompute: bool = False
    dropout: bool = True
    flash_attention: bool = True  # attention scores are recomputed, not kept (no a s^2 b activations)
    mlp_activation: Literal["gelu", "relu"] = "gelu"  # ReLU's backward needs only its output: 8 s b h fewer bytes
    schedule: Literal["1f1b", "gpipe", "deepspeed"] = "1f1b"  # deepspeed: 1F1B in DeepSpeed's lock-step (same memory)

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> TransformerSpec:
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} must be a multiple of heads {self.heads}")
        return self


UNIT_S = {"m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}  # a relative deadline's units, in seconds


def parse_deadline(value: Any, now: datetime) -> datetime:
    """An ISO-8601 time, or a time relative to `now` such as `+36h`, `+90m`, `+2d`, `+1w` or `+1h30m`."""
    if isinstance(value, datetime):
        when = value
    else:
        text = str(value).strip()
        relative = re.fullmatch(r"(\+?)(\s*\d+(?:\.\d+)?\s*[wdhm])+", text)
        if relative and not relative.group(1):
            raise ValueError(f"{text!r} is not a time; did you mean +{text} (from now)?")
        if relative:
            parts = re.findall(r"(\d+(?:\.\d+)?)\s*([wdhm])", text)
            seconds = sum(float(amount) * UNIT_S[unit] for amount, unit in parts)
            if seconds > MAX_DEADLINE_DAYS * 86400:
                raise ValueError(
                    f"{text!r} is more than {MAX_DEADLINE_DAYS} days ahead; give a nearer deadline or none"
                )
            return now + timedelta(seconds=seconds)
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{text!r} is not a time; use ISO 8601 (2026-12-01T18:00Z), +36h or +1d12h") from None
    when = when if when.tzinfo else when.replace(tzinfo=UTC)
    if when - now > timedelta(days=MAX_DEADLINE_DAYS):
        raise ValueError(f"{when:%Y-%m-%d} is more than {MAX_DEADLINE_DAYS} days ahead; give a nearer deadline or none")
    return when


class JobSpec(_Spec):
    """A job as the user describes it in YAML (close to a SkyPilot task)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    run: list[str] = Field(min_length=1)
    shell: bool = False
    setup: str | None = None
    workdir: str | None = None
    env: dict[str, str] = {}
    resources: Resources
    work: Work
    checkpoint: CheckpointSpec = CheckpointSpec()
    deadline: datetime | None = None
    deadline_probability: float = Field(0.95, gt=0, lt=1)
    if_late: IfLate = IfLate.cheapest
    budget_usd: float | None = Field(None, gt=0, le=MAX_BUDGET_USD, description="leave it out for no budget")
    if_over_budget: IfOverBudget = IfOverBudget.run
    tiers: list[Tier] = Field(default_factory=lambda: list(Tier), min_length=1)
    fill: bool = False
    fill_task: str | None = None  # module:Class of its FillTask: it can run inside pipeline bubbles
    transformer: TransformerSpec | None = None  # a training job described by its model's shape
    data: Data | None = None  # where its input lives: offers elsewhere pay to move it

    @field_validator("fill_task")
    @classmethod
    def _module_class(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
            raise ValueError(f"{value!r} is not module:Class, e.g. fill_mlp:MlpFill")
        return value

    priority: int = 0
    max_restarts: int = Field(3, ge=0, le=100)

    @model_validator(mode="before")
    @classmethod
    def _run_as_argv(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("run"), str):
            text = data["run"]
            data = {**data, "run": [text] if data.get("shell") else shlex.split(text)}
        return data

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, env: Any) -> Any:
        if not isinstance(env, dict):
            return env
        reserved = sorted(k for k in env if str(k).startswith("BROKER_"))
        if reserved:
            raise ValueError(f"{reserved[0]}: BROKER_* variables are set by the agent; rename it")
        nested = sorted(str(k) for k, v in env.items() if isinstance(v, (dict, list)) or v is None)
        if nested:
            raise ValueError(f"{nested[0]}: give a string, number or true/false (quote a list or mapping as a string)")
        return {str(k): str(v) for k, v in env.items()}

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        now = (info.context or {}).get("now") or datetime.now(UTC)
        return parse_deadline(value, now)

    def urgency(self, submitted_at: datetime) -> float:
        """Dispatch order, smallest first: higher priority, then earlier deadline (or submission)."""
        return -self.priority * 1e11 + (self.deadline or submitted_at).timestamp()

    @model_validator(mode="after")
    def _fill_task_counts_steps(self) -> JobSpec:
        if self.fill_task and not (self.fill and self.work.steps):
            raise ValueError("fill_task needs fill: true and work.steps (the executor counts steps), e.g. steps: 600")
        return self

    @model_validator(mode="after")
    def _a_cap_has_a_budget(self) -> JobSpec:
        if self.if_over_budget == IfOverBudget.stop and self.budget_usd is None:
            raise ValueError("if_over_budget: stop needs budget_usd (or --budget), e.g. budget_usd: 40")
        return self

    @model_validator(mode="after")
    def _steps_have_a_rate(self) -> JobSpec:
        if self.transformer is not None and self.work.steps is None:
            raise ValueError("a transformer job gives work.steps (training iterations); the broker times them")
        if self.work.steps is not None and not self.work.steps_per_hour and self.transformer is None:
            raise ValueError("work.steps needs work.steps_per_hour, e.g. {A100: 1200} (or a transformer: description)")
        return self

    @model_validator(mode="after")
    def _rates_cover_accelerators(self) -> JobSpec:
        rates = self.work.steps_per_hour
        if rates:
            missing = [a.name for a in self.resources.accelerators if a.name not in rates]
            if missing:
                raise ValueError(
                    f"work.steps_per_hour has no rate for {', '.join(missing)}; "
                    "add one or drop it from resources.accelerators"
                )
        return self
