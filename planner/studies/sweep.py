"""Design-space sweeps: one problem file varied along named axes, every point solved, one tidy table.

A sweep file (`planner schema --sweep` gives its JSON Schema) names a base problem and the axes:

    name: generations
    base: llama-3.1-70b-hgx-h100          # a bundled problem or a path relative to the sweep file
    racks: [hgx-h100, hgx-b200, gb200-nvl72]            # shortcut for cluster.racks: [{type: ...}]
    models: [llama-3.1-70b, qwen3-32b]                  # shortcut for model
    axes:                                               # any problem field by its path
      - field: workloads[0].input_tokens
        values: [1024, 8192]
      - field: cluster.price_overrides_usd_per_hour.h100-sxm
        values: [2.0, 3.0]
    time_limit_s: 5

The points are the product of the axes (or `mode: zip` pairs them up). Each point is solved with
one CP-SAT worker and the sweep's seed, so a row does not depend on which process or machine solved
it (`planner/studies/sweep_run.py` runs them locally or on Ray). A point that is invalid,
infeasible or fails is a row with its status and reason, never the end of the sweep.
"""

import copy
import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from planner.errors import (
    InputIssue,
    PlannerInputError,
    issues_from_validation_error,
    load_yaml_file,
)
from planner.limits import (
    MAX_SEED,
    MAX_SWEEP_AXIS_VALUES,
    MAX_SWEEP_PROBLEMS,
    MAX_TIME_LIMIT_S,
)
from planner.schema import EdgeModel, Name

__all__ = ["Axis", "SweepPoint", "SweepSpec", "expand_sweep", "load_sweep", "parse_sweep", "set_field", "sweep_size"]

_PATH = re.compile(r"^[A-Za-z_][\w.-]*(\[\d+\])?(\.[\w.-]+(\[\d+\])?)*$")


class Axis(EdgeModel):
    field: str = Field(pattern=_PATH.pattern, description="problem field by its path, e.g. workloads[0].input_tokens or model")
    values: list = Field(min_length=1, max_length=MAX_SWEEP_AXIS_VALUES, description="values the field takes")
    labels: list[Name] | None = Field(default=None, description="names of the values in the table (default: the values)")
    name: Name | None = Field(default=None, description="column name (default: the field path)")

    @model_validator(mode="after")
    def _labels(self) -> "Axis":
        if self.labels is not None and len(self.labels) != len(self.values):
            raise ValueError(f"{len(self.labels)} labels for {len(self.values)} values\n    fix: give one label per value")
        return self

    def column(self) -> str:
        return self.name or self.field

    def label(self, i: int) -> str:
        return self.labels[i] if self.labels else _short(self.values[i])


class SweepSpec(EdgeModel):
    """A sweep: the base problem and the axes it is varied along."""

    name: Name = Field(default="sweep", description="short name, used in the output files")
    base: str = Field(min_length=1, description="bundled problem name, or a problem file path relative to the sweep file")
    racks: list[str] | None = Field(default=None, max_length=MAX_SWEEP_AXIS_VALUES, description="rack types, one at a time (as many as needed)")
    models: list[str] | None = Field(default=None, max_length=MAX_SWEEP_AXIS_VALUES, description="catalog models, one at a time")
    engines: list[Literal["trtllm", "sglang", "vllm"]] | None = Field(default=None, description="serving engines, one at a time")
    axes: list[Axis] = Field(default_factory=list, max_length=8, description="further axes: any problem field by its path")
    mode: Literal["product", "zip"] = Field(default="product", description="product: every combination; zip: the i-th values together")
    time_limit_s: float = Field(default=10.0, gt=0, le=MAX_TIME_LIMIT_S, description="CP-SAT time limit of each point, seconds")
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="CP-SAT seed of every point")

    def all_axes(self) -> list[Axis]:
        shortcuts = []
        if self.models:
            shortcuts.append(Axis(field="model", values=list(self.models), name="model"))
        if self.racks:
            shortcuts.append(Axis(field="cluster.racks", values=[[{"type": r}] for r in self.racks], labels=list(self.racks), name="racks"))
        if self.engines:
            shortcuts.append(Axis(field="engine", values=list(self.engines), name="engine"))
        return shortcuts + list(self.axes)


@dataclass(frozen=True)
class SweepPoint:
    index: int
    id: str  # "p0042"
    labels: dict[str, str]  # axis column -> label of its value
    problem: dict  # the base problem with the point's values set


def _short(value) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def set_field(document: dict, path: str, value) -> None:
    """Set `path` ("a.b[2].c") in a nested document, creating mappings on the way; list items must exist."""
    node = document
    parts = [p for p in re.split(r"\.(?![^\[]*\])", path)]
    for k, part in enumerate(parts):
        key, index = re.fullmatch(r"([^\[]+)(?:\[(\d+)\])?", part).groups()
        last = k == len(parts) - 1 and index is None
        if not isinstance(node, dict):
            raise KeyError(f"{path}: '{key}' is not inside a mapping")
        if last:
            node[key] = copy.deepcopy(value)
            return
        node = node.setdefault(key, {} if index is None else [])
        if index is not None:
            if not isinstance(node, list) or int(index) >= len(node):
                raise KeyError(f"{path}: {key} has no item {index}")
            if k == len(parts) - 1:
                node[int(index)] = copy.deepcopy(value)
                return
            node = node[int(index)]


def sweep_size(spec: SweepSpec) -> int:
    """How many points the sweep has (refused when mode zip pairs axes of different lengths)."""
    axes = spec.all_axes()
    if spec.mode == "zip":
        lengths = {len(a.values) for a in axes}
        if len(lengths) > 1:
            raise PlannerInputError(InputIssue("axes", f"mode zip needs axes of one length, got {sorted(lengths)}", "give every axis as many values"))
        return lengths.pop() if lengths else 1
    return math.prod(len(a.values) for a in axes)


def parse_sweep(raw: object, source: str) -> SweepSpec:
    """A sweep document (what a sweep file holds) validated, its problems named as `planner sweep` names them."""
    if not isinstance(raw, dict):
        raise PlannerInputError(InputIssue(source, "the sweep is not a mapping", "see `planner schema --sweep`"))
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError as exc:
        raise PlannerInputError(issues_from_validation_error(exc, model=SweepSpec), source=source) from None


def expand_sweep(spec: SweepSpec, base: dict) -> list[SweepPoint]:
    """Every point of the sweep, in a fixed order (the first axis varies slowest)."""
    axes = spec.all_axes()
    size = sweep_size(spec)  # counted before any combination is listed: 8 axes of 256 values would not fit in memory
    if size > MAX_SWEEP_PROBLEMS:
        raise PlannerInputError(InputIssue("axes", f"{size:,} problems, over the {MAX_SWEEP_PROBLEMS:,} a sweep may hold",
                                           "split the sweep into several files"))
    if spec.mode == "zip":
        combos = [tuple(i for _ in axes) for i in range(size)]
    else:
        combos = list(itertools.product(*(range(len(a.values)) for a in axes)))
    points = []
    for n, combo in enumerate(combos):
        problem = copy.deepcopy(base)
        if any(a.field == "model" for a in axes):
            problem.pop("models", None)
        for axis, i in zip(axes, combo, strict=True):
            try:
                set_field(problem, axis.field, axis.values[i])
            except KeyError as exc:
                raise PlannerInputError(InputIssue(f"axes[{axis.column()}]", str(exc).strip("'\""), "name a field of the base problem")) from None
        points.append(SweepPoint(n, f"p{n:04d}", {a.column(): a.label(i) for a, i in zip(axes, combo, strict=True)}, problem))
    return points


def load_sweep(path: Path) -> tuple[SweepSpec, dict, Path]:
    """The sweep file, its base problem as a document, and the directory the base's relative paths resolve from."""
    from planner.paths import data_dir

    raw = load_yaml_file(path)
    if not isinstance(raw, dict):
        raise PlannerInputError(InputIssue(str(path), "the file is not a YAML mapping", "see `planner schema --sweep`"))
    spec = parse_sweep(raw, str(path))
    base_path = path.parent / spec.base
    if not base_path.is_file():
        bundled = data_dir("problems") / f"{spec.base.removesuffix('.yaml')}.yaml"
        if not bundled.is_file():
            raise PlannerInputError(InputIssue(f"{path}: base", f"no problem file or bundled problem '{spec.base}'",
                                               "name a bundled problem (planner catalog --problems) or a path"))
        base_path = bundled
    base = load_yaml_file(base_path)
    if not isinstance(base, dict):
        raise PlannerInputError(InputIssue(str(base_path), "the base problem is not a YAML mapping", "point base at a problem file"))
    return spec, base, base_path.parent
