"""The deployment-problem file format (YAML, validated by pydantic) and its resolution against the
catalogs into plain values the planner uses.

Friendly units appear only where a field's name says so (`tpot_limit_ms`); `resolve_problem`
converts them once into SI values.
"""

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator

from planner.architecture import ModelArch
from planner.errors import InputIssue, PlannerInputError, issues_from_validation_error, load_yaml_file, unknown_name_issue
from planner.deployment import Precisions
from planner.hardware import Accelerator, AcceleratorSpec, CatalogId, EdgeModel, HardwareCatalog, RackSpec, RackType, load_hardware_catalog
from planner.model_catalog import ModelSpec, arch_from_spec, load_model_catalog
from planner.precision import Precision, flops_format
from planner.roofline import OverlapPolicy
from planner.units import MS

__all__ = [
    "Objective",
    "Problem",
    "PrecisionSpec",
    "ResolvedModel",
    "ResolvedWorkload",
    "ResolvedProblem",
    "load_problem",
    "parse_problem",
    "resolve_problem",
    "problem_json_schema",
    "resolve_precisions",
]


class Objective(StrEnum):
    MIN_COST = "min_cost"  # cheapest fleet for the demand (or cheapest cost per token without demand)
    MAX_THROUGHPUT_PER_ACCELERATOR = "max_throughput_per_accelerator"
    MIN_TPOT = "min_tpot"  # fastest per-user decode under a cost cap


class PrecisionSpec(EdgeModel):
    """Numeric formats. Omitted fields default: weights = the model's native format, kv_cache and
    activations = bf16, compute = the weights' format (or the next wider one the accelerator has)."""

    weights: Precision | None = Field(default=None, description="weight storage format")
    expert_weights: Precision | None = Field(default=None, description="routed-expert weight format, if different")
    kv_cache: Precision | None = Field(default=None, description="KV-cache storage format")
    activations: Precision | None = Field(default=None, description="activation and communication format")
    compute: Precision | None = Field(default=None, description="tensor-core input format of the matmuls")


class CatalogModelRef(EdgeModel):
    catalog: str = Field(description="model id from the built-in catalog (`planner catalog`)")
    precisions: PrecisionSpec | None = None


class ConfigJsonModelRef(EdgeModel):
    config_json: str = Field(description="path to a Hugging Face config.json, relative to the problem file")
    id: CatalogId | None = Field(default=None, description="id to give the imported model")
    precisions: PrecisionSpec | None = None


class InlineModelRef(EdgeModel):
    inline: ModelSpec = Field(description="the architecture written out in the catalog's format")
    precisions: PrecisionSpec | None = None


ModelRef = Annotated[
    str | CatalogModelRef | ConfigJsonModelRef | InlineModelRef,
    Field(description="a catalog id, {catalog: id}, {config_json: path} or {inline: {...}}"),
]


class RackCount(EdgeModel):
    type: str = Field(description="rack / scale-up unit id (catalog or custom_racks)")
    count: int | None = Field(default=None, ge=0, description="how many the fleet has; omit for 'as many as needed'")


class ClusterSpec(EdgeModel):
    racks: list[RackCount] = Field(min_length=1, description="rack types the fleet can use")
    custom_accelerators: list[AcceleratorSpec] = Field(default_factory=list, description="accelerators not in the catalog")
    custom_racks: list[RackSpec] = Field(default_factory=list, description="scale-up units not in the catalog")
    price_overrides_usd_per_hour: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict, description="accelerator id -> your price per accelerator-hour"
    )
    achievable_overrides: dict[str, dict[Literal["compute_fraction", "hbm_bandwidth_fraction", "scale_up_bandwidth_fraction",
                                                 "scale_out_bandwidth_fraction"], Annotated[float, Field(gt=0, le=1)]]] = Field(
        default_factory=dict, description="accelerator id -> achievable fractions of peak to use instead of the defaults"
    )
    unavailable_accelerators: list[str] = Field(default_factory=list, description="accelerator node names to leave out, e.g. 'hgx-h100#0/3'")
    allow_spanning_domains: bool = Field(
        default=False, description="let tensor/expert groups span scale-up domains (their traffic then runs at scale-out bandwidth)"
    )


class Demand(EdgeModel):
    output_tokens_per_s: float | None = Field(default=None, gt=0, description="output tokens per second to serve")
    requests_per_s: float | None = Field(default=None, gt=0, description="requests per second to serve")

    @model_validator(mode="after")
    def _one(self) -> "Demand":
        if (self.output_tokens_per_s is None) == (self.requests_per_s is None):
            raise ValueError("give exactly one of output_tokens_per_s and requests_per_s\n    fix: keep one demand figure")
        return self


class WorkloadSpec(EdgeModel):
    name: str = Field(description="workload name")
    model: str | None = Field(default=None, description="key of `models` (optional when there is one model)")
    input_tokens: int = Field(ge=1, le=100_000_000, description="prompt length per request")
    output_tokens: int = Field(ge=1, le=10_000_000, description="generated tokens per request")
    demand: Demand | None = Field(default=None, description="traffic to serve; omit to minimise cost per token")
    ttft_limit_ms: float | None = Field(default=None, gt=0, description="time-to-first-token limit, milliseconds")
    tpot_limit_ms: float | None = Field(default=None, gt=0, description="time-per-output-token limit, milliseconds")

    @model_validator(mode="after")
    def _units(self) -> "WorkloadSpec":
        for name in ("ttft_limit_ms", "tpot_limit_ms"):
            value = getattr(self, name)
            if value is not None and value < 1.0:
                raise ValueError(f"{name} = {value:g} ms looks like seconds\n    fix: write milliseconds, e.g. {value * 1000:g}")
        return self


class SolverOptions(EdgeModel):
    time_limit_s: float = Field(default=10.0, gt=0, description="CP-SAT search limit, seconds (deterministic time, close to wall time)")
    relative_gap_limit: float = Field(default=0.0, ge=0, lt=1, description="stop once (objective - bound) / objective is below this; 0 = prove optimality")
    seed: int = Field(default=0, ge=0, description="CP-SAT random seed")
    workers: int = Field(default=2, ge=1, le=64, description="CP-SAT worker threads")
    overlap: OverlapPolicy = Field(default=OverlapPolicy.SERIAL, description="serial: comm adds to the step; overlapped: hidden")
    max_batch_per_replica: int = Field(default=65536, ge=1, description="largest decode batch (sequences) to consider")
    prefill_chunk_tokens: int = Field(default=8192, ge=64, description="tokens per prefill forward pass")
    max_replicas: int = Field(default=4096, ge=1, description="largest replica count per deployment")


class Problem(EdgeModel):
    """A deployment problem: models, precisions, cluster, workloads, objective and solver options."""

    name: str = Field(default="problem", description="short name")
    description: str | None = None
    model: ModelRef | None = Field(default=None, description="the model, when there is only one")
    models: dict[str, ModelRef] | None = Field(default=None, description="several models by key")
    precisions: PrecisionSpec = Field(default_factory=PrecisionSpec, description="default formats for every model")
    cluster: ClusterSpec
    workloads: list[WorkloadSpec] = Field(min_length=1)
    objective: Objective = Objective.MIN_COST
    cost_cap_usd_per_hour: float | None = Field(default=None, gt=0, description="fleet cost cap for objective min_tpot")
    solver: SolverOptions = Field(default_factory=SolverOptions)

    @model_validator(mode="after")
    def _models(self) -> "Problem":
        if (self.model is None) == (self.models is None):
            raise ValueError("give either `model` (one model) or `models` (several by key)\n    fix: keep exactly one of them")
        names = [w.name for w in self.workloads]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"workload names repeat: {', '.join(duplicates)}\n    fix: give every workload its own name")
        if self.objective is Objective.MIN_TPOT and self.cost_cap_usd_per_hour is None:
            raise ValueError("objective min_tpot needs cost_cap_usd_per_hour\n    fix: add the fleet cost cap in USD per hour")
        return self


def problem_json_schema() -> dict:
    return Problem.model_json_schema()


def parse_problem(raw: object, source: str = "problem") -> Problem:
    if not isinstance(raw, dict):
        raise PlannerInputError(InputIssue(source, "the file is not a YAML mapping", "start from a bundled problem in problems/"), source)
    try:
        return Problem.model_validate(raw)
    except ValidationError as exc:
        raise PlannerInputError(issues_from_validation_error(exc), source=source) from None


def load_problem(path: Path) -> Problem:
    return parse_problem(load_yaml_file(path), source=str(path))


# ---------------------------------------------------------------------------------------------
# Resolution against the catalogs


@dataclass(frozen=True)
class ResolvedModel:
    key: str
    arch: ModelArch
    precisions: PrecisionSpec


@dataclass(frozen=True)
class ResolvedWorkload:
    name: str
    model_key: str
    input_tokens: int
    output_tokens: int
    output_tokens_per_s: float | None  # demand; None = minimise cost per token
    ttft_limit_s: float | None
    tpot_limit_s: float | None


@dataclass(frozen=True)
class ResolvedProblem:
    problem: Problem
    hardware: HardwareCatalog
    models: dict[str, ResolvedModel]
    workloads: tuple[ResolvedWorkload, ...]
    rack_counts: tuple[tuple[RackType, int | None], ...]
    notes: tuple[str, ...] = field(default_factory=tuple)


def _resolve_model(key: str, ref, base_dir: Path, default_prec: PrecisionSpec, field_name: str) -> ResolvedModel:
    from planner.hf_config import load_hf_config

    catalog = load_model_catalog()
    precisions = default_prec
    if isinstance(ref, str):
        ref = CatalogModelRef(catalog=ref)
    if ref.precisions is not None:
        merged = default_prec.model_dump() | {k: v for k, v in ref.precisions.model_dump().items() if v is not None}
        precisions = PrecisionSpec(**merged)
    if isinstance(ref, CatalogModelRef):
        if ref.catalog not in catalog:
            raise PlannerInputError(unknown_name_issue(field_name, "model", ref.catalog, catalog))
        return ResolvedModel(key, catalog[ref.catalog], precisions)
    if isinstance(ref, ConfigJsonModelRef):
        path = Path(ref.config_json)
        path = path if path.is_absolute() else base_dir / path
        return ResolvedModel(key, arch_from_spec(load_hf_config(path, ref.id)), precisions)
    return ResolvedModel(key, arch_from_spec(ref.inline), precisions)


def resolve_problem(problem: Problem, base_dir: Path = Path("."), source: str = "problem") -> ResolvedProblem:
    """Check every name against the catalogs and convert to SI values; all issues are reported together."""
    issues: list[InputIssue] = []
    cluster = problem.cluster
    try:
        hardware = load_hardware_catalog().with_overrides(
            accelerators=cluster.custom_accelerators,
            racks=cluster.custom_racks,
            price_usd_per_hour=cluster.price_overrides_usd_per_hour,
            achievable=cluster.achievable_overrides,
        )
    except PlannerInputError as exc:
        raise PlannerInputError(exc.issues, source) from None
    rack_counts = []
    for i, rc in enumerate(cluster.racks):
        if rc.type not in hardware.racks:
            issues.append(unknown_name_issue(f"cluster.racks[{i}].type", "rack", rc.type, hardware.racks))
        else:
            rack_counts.append((hardware.racks[rc.type], rc.count))
    refs = {"model": problem.model} if problem.model is not None else dict(problem.models)
    models: dict[str, ResolvedModel] = {}
    for key, ref in refs.items():
        field_name = "model" if problem.model is not None else f"models.{key}"
        try:
            models[key] = _resolve_model(key, ref, base_dir, problem.precisions, field_name)
        except PlannerInputError as exc:
            issues.extend(exc.issues)
    workloads = []
    for i, w in enumerate(problem.workloads):
        key = w.model or (next(iter(refs)) if len(refs) == 1 else None)
        if key is None or key not in refs:
            issues.append(unknown_name_issue(f"workloads[{i}].model", "model key", str(w.model), refs) if w.model
                          else InputIssue(f"workloads[{i}].model", "several models are defined", f"name one of: {', '.join(refs)}"))
            continue
        demand = None
        if w.demand is not None:
            demand = w.demand.output_tokens_per_s or w.demand.requests_per_s * w.output_tokens
        workloads.append(ResolvedWorkload(
            w.name, key, w.input_tokens, w.output_tokens, demand,
            None if w.ttft_limit_ms is None else w.ttft_limit_ms * MS,
            None if w.tpot_limit_ms is None else w.tpot_limit_ms * MS,
        ))
        arch = models.get(key)
        if arch is not None and w.input_tokens + w.output_tokens > arch.arch.max_context_tokens:
            issues.append(InputIssue(f"workloads[{i}]", f"{w.input_tokens} + {w.output_tokens} tokens exceed {arch.arch.id}'s "
                                     f"{arch.arch.max_context_tokens}-token context", "shorten the request or pick a longer-context model"))
    if issues:
        raise PlannerInputError(issues, source)
    return ResolvedProblem(problem, hardware, models, tuple(workloads), tuple(rack_counts))


def resolve_precisions(spec: PrecisionSpec, arch: ModelArch, accel: Accelerator, field_name: str = "precisions") -> tuple[Precisions, tuple[str, ...]]:
    """Fill the defaults of `spec` for this model and accelerator. Returns the formats and notes
    for the plan's assumptions (for instance a compute format the accelerator lacks)."""
    weights = spec.weights or arch.native_weights_precision
    expert_weights = spec.expert_weights or (arch.native_expert_weights_precision if spec.weights is None else None)
    wanted = flops_format(spec.compute or weights)
    compute = accel.supported_flops_format(wanted)
    if compute is None:
        raise PlannerInputError(InputIssue(f"{field_name}.compute", f"{accel.id} has no {wanted} or wider tensor-core rate in the catalog",
                                           f"use one of: {', '.join(accel.dense_flops_per_s)}"))
    notes = []
    if compute != wanted:
        notes.append(f"{accel.id} has no {wanted} tensor cores: matmuls run at its {compute} rate")
    precisions = Precisions(
        weights=weights,
        kv_cache=spec.kv_cache or Precision.BF16,
        activations=spec.activations or Precision.BF16,
        compute=compute,
        expert_weights=expert_weights,
    )
    return precisions, tuple(notes)
