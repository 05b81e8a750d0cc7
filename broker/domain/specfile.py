"""Reading a job spec file: size and YAML checks, CLI overrides, and one-line errors per field."""

from __future__ import annotations

import difflib
import types
import typing
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from broker.domain.errors import SpecError
from broker.domain.model import JobSpec

MAX_SPEC_BYTES = 1_000_000


class _StrictLoader(yaml.SafeLoader):
    """YAML without aliases or repeated keys. A 1 KB spec of nested anchors expands to gigabytes (a billion
    laughs), and a job spec has no need for them; a key given twice silently keeps the last value."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed; write the value out", mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, typing.Hashable):
                continue  # a list or mapping as a key: the spec's validation names it
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"{key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


_WRITTEN = {f"tag:yaml.org,2002:{kind}" for kind in ("bool", "int", "float", "timestamp")}


def _as_written(node) -> None:
    """The words of `run` and the values of `env` as written: YAML reads `run: [python, train.py, --epochs, 3]` with
    3 a number and `[true]` a boolean (refused: argv is strings), and `env: {DEBUG: true, LR: 0.10}` as True and 0.1.
    A job gets the text of its YAML."""
    if not isinstance(node, yaml.MappingNode):
        return
    for key, value in node.value:
        if not (isinstance(key, yaml.ScalarNode) and key.value in ("run", "env")):
            continue
        if isinstance(value, yaml.SequenceNode):
            items = value.value
        elif isinstance(value, yaml.MappingNode):
            items = [v for _, v in value.value]
        else:
            items = []
        for item in items:
            if isinstance(item, yaml.ScalarNode) and item.tag in _WRITTEN:
                item.tag = "tag:yaml.org,2002:str"


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "spec"


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The spec model that holds the field at `loc` (to list what is allowed there)."""
    model: Any = JobSpec
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        model = model.model_fields[part].annotation
        while typing.get_origin(model) in (list, typing.Union, types.UnionType):
            model = next(a for a in typing.get_args(model) if a is not type(None))
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


# pydantic's bounds and number types, said as what to give instead
_BOUNDS = {
    "greater_than": ("gt", "above"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "below"),
    "less_than_equal": ("le", "at most"),
}
_NUMBERS = {
    "finite_number": "a finite number",
    "float_parsing": "a number",
    "float_type": "a number",
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
}


def _as_fraction(loc: tuple, value: Any) -> str:
    """A probability written as a percentage (95 for 0.95): the fraction it likely meant."""
    if loc[-1:] == ("deadline_probability",) and isinstance(value, int | float) and 1 < value < 100:
        return f" (did you mean {value / 100:g}?)"
    return ""


def _message(error: dict) -> str:
    loc = tuple(error["loc"])
    given = repr(error.get("input"))[:60]
    if error["type"] in _BOUNDS:
        bound, words = _BOUNDS[error["type"]]
        said = f"{_path(loc)}: {given} is out of range; give a number {words} {error['ctx'][bound]}"
        return said + _as_fraction(loc, error.get("input"))
    if error["type"] in _NUMBERS:
        return f"{_path(loc)}: {given} is not {_NUMBERS[error['type']]}; give {_NUMBERS[error['type']]}"
    if error["type"] == "extra_forbidden":
        model = _model_at(loc)
        allowed = list(model.model_fields) if model else []
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{_path(loc)}: unknown field; {hint}allowed: {', '.join(allowed)}"
    if error["type"] == "missing":
        return f"{_path(loc)}: required; add it"
    if error["type"] == "string_pattern_mismatch":
        return (
            f"{_path(loc)}: {error['input']!r} is not a name; use up to 63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    if error["type"] == "value_error":
        return f"{_path(loc)}: {error['ctx']['error']}"
    if error["type"] in ("too_short", "string_too_short"):  # pydantic's words named no fix ("run: List should ...")
        least, what = error["ctx"]["min_length"], "item" if error["type"] == "too_short" else "character"
        return f"{_path(loc)}: empty; give at least {least} {what}{'s' * (least != 1)}"
    return f"{_path(loc)}: {error['msg']}"


def validate_spec(data: Any, now: datetime, source: str = "spec", options: dict[str, str] | None = None) -> JobSpec:
    """A JobSpec from parsed YAML, or a SpecError with one line per problem. `options`: the fields a command-line
    option set (field -> option, e.g. deadline -> --deadline), whose problems name the option, not the file."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a job spec is a YAML mapping (name:, run:, resources:, work:, ...)")
    options = options or {}

    def said(error: dict) -> str:
        loc = tuple(error["loc"])
        if loc[:1] and loc[0] in options:
            return _message({**error, "loc": (options[loc[0]], *loc[1:])})
        return f"{source}: {_message(error)}"

    try:
        spec = JobSpec.model_validate(data, context={"now": now})
    except ValidationError as err:
        raise SpecError("\n".join(said(e) for e in err.errors())) from None
    if spec.deadline is not None and spec.deadline <= now:
        where = options["deadline"] if "deadline" in options else f"{source}: deadline"
        raise SpecError(f"{where}: {spec.deadline:%Y-%m-%d %H:%M} UTC is in the past; give a future time or +36h")
    return spec


def yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML parser's error in one line: where, and what (its own message spans several)."""
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"not valid YAML{where}: {getattr(err, 'problem', None) or 'invalid syntax'}"


OPTIONS = {"deadline": "--deadline", "budget_usd": "--budget"}  # the spec's fields that `submit` and `run` override


def load_spec(path: Path, now: datetime, deadline: str | None = None, budget_usd: float | None = None) -> JobSpec:
    """Read and validate a job spec file; `deadline` and `budget_usd` override the file's values. A relative
    `workdir` is taken from the file's folder, wherever the command runs."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        raise SpecError(f"{path}: no such file; give the path of a job YAML") from None
    if not path.is_file():
        raise SpecError(f"{path}: not a file (a directory?); give the path of a job YAML")
    if size > MAX_SPEC_BYTES:
        raise SpecError(f"{path}: {size:,} bytes is over the 1 MB limit for a job spec; move data out of it")
    try:
        loader = _StrictLoader(path.read_text(encoding="utf-8"))
        try:
            node = loader.get_single_node()
            _as_written(node)
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a text file; a job spec is YAML") from None
    except RecursionError:
        raise SpecError(f"{path}: nested too deep; a job spec is a few levels of mappings") from None
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: {yaml_problem(err)}; fix the syntax") from None
    given = {"deadline": deadline, "budget_usd": budget_usd}
    options = {field: OPTIONS[field] for field, value in given.items() if value is not None}
    if isinstance(data, dict):
        data.update({field: given[field] for field in options})
    spec = validate_spec(data, now, source=str(path), options=options)
    if spec.workdir is not None and not Path(spec.workdir).expanduser().is_absolute():
        folder = (path.parent / spec.workdir).resolve()  # as its file says; an absolute one is the agents' to have
        if not folder.is_dir():
            raise SpecError(
                f"{path}: workdir: {spec.workdir} is no folder ({folder}); fix the path (relative to the spec's "
                "folder), or give an absolute one the agents have"
            )
        spec = spec.model_copy(update={"workdir": str(folder)})
    return spec
