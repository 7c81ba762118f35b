"""The plan file `planner solve --json` writes, as a pydantic model with its JSON Schema
(`planner schema --plan`). `check`, `export` and `view` load plans through it, so that a plan from
another version or a hand edit that breaks its structure is refused with the field and the fix
instead of failing deep inside a reader.

The fields every reader relies on are typed here; a deployment's figures (latencies, throughputs,
costs and their ranges, step terms, memory) are kept as written, since `check` recomputes them.
"""

import re
from dataclasses import replace
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
)

from planner.errors import InputIssue, PlannerInputError, issues_from_validation_error
from planner.limits import (
    MAX_BATCH_PER_REPLICA,
    MAX_DRAFT_TOKENS,
    MAX_INPUT_TOKENS,
    MAX_OUTPUT_TOKENS,
    MAX_PARALLEL_DEGREE,
    MAX_REPLICAS,
)
from planner.modes import Engine, ServingRole
from planner.precision import FlopsFormat, Precision

__all__ = ["PLAN_FORMAT", "PLAN_FORMAT_VERSION", "Plan", "parse_plan", "plan_json_schema"]

PLAN_FORMAT = "llm-deployment-plan"
PLAN_FORMAT_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


Degree = Annotated[int, Field(ge=1, le=MAX_PARALLEL_DEGREE, strict=True)]  # strict: `true` is not 1
RACK_INSTANCE = re.compile(r"^[^#/\s]+#[0-9]+$")
ACCELERATOR_NODE = re.compile(r"^[^#/\s]+#[0-9]+/[0-9]+$")


def _named(pattern: re.Pattern, form: str, example: str):
    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(f"{value!r} is not of the form {form}\n    fix: write it as {form}, e.g. {example!r} "
                             "(the instance and index count from 0), or re-solve the problem")
        return value
    return AfterValidator(check)


RackInstanceName = Annotated[str, _named(RACK_INSTANCE, "'<rack-id>#<instance>'", "hgx-h100#0")]
AcceleratorNode = Annotated[str, _named(ACCELERATOR_NODE, "'<rack-id>#<instance>/<index>'", "hgx-h100#0/5")]


class PlacedAccelerator(_Strict):
    """One accelerator of a deployment: where it is and which ranks it holds."""

    accelerator: AcceleratorNode = Field(description="graph node, '<rack-id>#<instance>/<index>'")
    rack: RackInstanceName = Field(description="rack instance, '<rack-id>#<instance>'")
    replica: NonNegativeInt
    stage: NonNegativeInt
    layers: tuple[NonNegativeInt, NonNegativeInt] = Field(description="[first, last + 1) layers of its pipeline stage")
    tp_rank: NonNegativeInt
    dp_rank: NonNegativeInt
    ep_rank: NonNegativeInt | None = Field(description="expert-parallel rank; null only without expert parallelism (ep 1)")
    expert_tp_rank: NonNegativeInt | None = None


class ExpertLayer(_Strict):
    layer: NonNegativeInt
    max_load: float
    mean_load: float
    lower_bound: float
    moves: NonNegativeInt | None = None  # None without a previous plan to move from


class ExpertMap(_Strict):
    """Which logical expert every physical slot of every layer holds."""

    n_ranks: PositiveInt
    slots_per_rank: PositiveInt
    n_logical_experts: PositiveInt
    method: str
    profile: str
    imbalance: float
    worst_gap_to_bound: float
    layers_proven_optimal: NonNegativeInt
    moves: NonNegativeInt | None = None
    layers: list[ExpertLayer]
    physical_to_logical_map: list[list[NonNegativeInt]]


class PlanPrecisions(_Strict):
    """The number formats a deployment runs: every one is needed by `check` and by each exporter."""

    weights: Precision
    expert_weights: Precision
    kv_cache: Precision
    activations: Precision
    compute: FlopsFormat


class SpeculativeRecord(BaseModel):
    """A deployment's speculative decoding (its figures are kept as written; `check` recomputes them)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    method: Literal["mtp"]
    draft_tokens: Annotated[int, Field(ge=0, le=MAX_DRAFT_TOKENS, strict=True)]


class PlanDeployment(BaseModel):
    """One deployment: a layout of one model on one rack type, its replicas and where they run."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # the figures check recomputes (see the module docstring)

    workload: str = Field(min_length=1)
    model: str = Field(min_length=1)
    rack: str = Field(min_length=1)
    accelerator: str = Field(min_length=1)
    replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS, strict=True)]
    tp: Degree
    ep: Degree
    pp: Degree
    dp_attn: Degree
    expert_tp: Degree = 1
    micro_batches: Annotated[int, Field(ge=1, le=MAX_BATCH_PER_REPLICA)] = 1
    accelerators_per_replica: Annotated[int, Field(ge=1, le=MAX_PARALLEL_DEGREE, strict=True)]
    batch_per_replica: Annotated[int, Field(ge=1, le=MAX_BATCH_PER_REPLICA, strict=True)]
    input_tokens: Annotated[int, Field(ge=1, le=MAX_INPUT_TOKENS, strict=True)] = Field(description="prompt tokens per request")
    output_tokens: Annotated[int, Field(ge=1, le=MAX_OUTPUT_TOKENS, strict=True)] = Field(description="output tokens per request")
    role: ServingRole = ServingRole.AGGREGATED
    engine: Engine = Engine.TRTLLM
    precisions: PlanPrecisions
    placement: list[PlacedAccelerator] = []
    expert_map: ExpertMap | None = None
    speculative: SpeculativeRecord | None = None


class RackInstance(_Strict):
    """One rack (scale-up unit) instance of the fleet, as the plan saw it."""

    accelerators: Annotated[int, Field(ge=1, le=MAX_PARALLEL_DEGREE, strict=True)]
    accelerators_per_host: Annotated[int, Field(ge=1, le=MAX_PARALLEL_DEGREE, strict=True)]
    unavailable: list[NonNegativeInt] = []


class Plan(_Strict):
    """A solved plan as `planner solve --json` writes it."""

    format: Literal["llm-deployment-plan"]
    format_version: Literal[1]
    problem: str
    status: str
    objective_kind: str
    solver: dict
    fleet: dict
    deployments: list[PlanDeployment]
    explanation: dict | None = None
    infeasibility: dict | None = None
    racks: dict[RackInstanceName, RackInstance] = {}
    kv_handoff: list[dict] = []
    served: list[dict] = Field(default=[], description="per workload, the output tokens/s served: with prefill and decode pools the "
                                                       "smaller of what decode makes and prefill feeds")
    problem_spec: dict = Field(description="the problem the plan solves, embedded so that the plan stands alone")
    problem_dir: str | None = Field(default=None, description="where relative paths of the problem resolve")
    notes: list[str] = []


def _placement_issues(d: PlanDeployment, where: str, racks: dict[str, RackInstance]) -> list[InputIssue]:
    """Each placement entry's ranks within the layout, its accelerator inside its rack instance, that
    rack instance one of the deployment's rack type and of the plan's fleet."""
    out = []
    bounds = {"replica": (d.replicas, "replicas"), "stage": (d.pp, "pipeline stages (pp)"), "tp_rank": (d.tp, "tensor-parallel ranks (tp)"),
              "dp_rank": (d.dp_attn, "attention data-parallel ranks (dp_attn)"), "ep_rank": (d.ep, "expert-parallel ranks (ep)")}
    for k, entry in enumerate(d.placement):
        field = f"{where}.placement[{k}]"
        if d.ep > 1 and entry.ep_rank is None:
            out.append(InputIssue(f"{field}.ep_rank", f"null, but the deployment spreads its experts over ep={d.ep} ranks",
                                  f"give its expert-parallel rank (0..{d.ep - 1}), or re-solve the problem"))
        for name, (bound, what) in bounds.items():
            value = getattr(entry, name)
            if value is not None and value >= bound:
                out.append(InputIssue(f"{field}.{name}", f"{value}, but the deployment has {bound} {what}, counted from 0",
                                      f"use 0..{bound - 1}, or re-solve the problem"))
        if entry.layers[0] >= entry.layers[1]:
            out.append(InputIssue(f"{field}.layers", f"{list(entry.layers)} is empty", "write [first, last + 1) with first < last + 1"))
        if not entry.accelerator.startswith(f"{entry.rack}/"):
            out.append(InputIssue(f"{field}.accelerator", f"{entry.accelerator!r} is not in its rack {entry.rack!r}",
                                  f"name an accelerator of {entry.rack!r} ('{entry.rack}/<index>'), or correct `rack`"))
        if entry.rack.split("#")[0] != d.rack:
            out.append(InputIssue(f"{field}.rack", f"{entry.rack!r} is not a {d.rack} instance", f"use '{d.rack}#<instance>'"))
        elif racks and entry.rack not in racks:
            listed = sorted(racks)
            out.append(InputIssue(f"{field}.rack", f"{entry.rack!r} is not among the plan's racks ({', '.join(listed[:4])}"
                                                   f"{', ...' if len(listed) > 4 else ''})",
                                  "use one of the plan's rack instances, or re-solve the problem"))
    return out


def _expert_map_issues(d: PlanDeployment, where: str) -> list[InputIssue]:
    """An expert map is a rectangle: every layer's row holds one logical expert per physical slot."""
    emap, field = d.expert_map, f"{where}.expert_map"
    if emap is None:
        return []
    slots = emap.n_ranks * emap.slots_per_rank
    if emap.n_ranks != d.ep:
        return [InputIssue(f"{field}.n_ranks", f"{emap.n_ranks}, but the deployment has ep={d.ep}", "re-solve the problem")]
    if slots < emap.n_logical_experts:
        return [InputIssue(f"{field}.slots_per_rank", f"{emap.n_ranks} ranks x {emap.slots_per_rank} slots cannot hold "
                                                      f"{emap.n_logical_experts} experts", "re-solve the problem")]
    out = []
    for i, row in enumerate(emap.physical_to_logical_map):
        if len(row) != slots or max(row, default=0) >= emap.n_logical_experts:
            out.append(InputIssue(f"{field}.physical_to_logical_map[{i}]",
                                  f"{len(row)} slots holding experts up to {max(row, default=0)}; every row needs {slots} "
                                  f"(n_ranks {emap.n_ranks} x slots_per_rank {emap.slots_per_rank}) in 0..{emap.n_logical_experts - 1}",
                                  "restore the row (one logical expert per physical slot), or re-solve the problem"))
    rows = len(emap.physical_to_logical_map)
    out += [InputIssue(f"{field}.layers[{k}].layer", f"{layer.layer}, but the map has {rows} rows", "re-solve the problem")
            for k, layer in enumerate(emap.layers) if layer.layer >= rows]
    return out


def _workload_lengths(problem_spec: dict) -> dict[str, tuple[object, object]]:
    """Prompt and output lengths of each workload of the embedded problem, as written (the problem
    itself is validated when a command resolves it)."""
    workloads = problem_spec.get("workloads")
    if not isinstance(workloads, list):
        return {}
    return {w["name"]: (w.get("input_tokens"), w.get("output_tokens")) for w in workloads if isinstance(w, dict) and "name" in w}


def plan_issues(plan: Plan) -> list[InputIssue]:
    """What a valid structure can still get wrong, found without the catalog or the step model:
    ranks outside the layout, accelerators outside their rack, ragged expert maps, prompt lengths
    that are not the embedded problem's, rack instances without their index."""
    out = [InputIssue(f"racks.{name}.unavailable", f"{bad} is not an accelerator index below {rack.accelerators}",
                      "list indices 0..accelerators - 1")
           for name, rack in plan.racks.items() for bad in rack.unavailable if bad >= rack.accelerators]
    lengths = _workload_lengths(plan.problem_spec)
    for i, d in enumerate(plan.deployments):
        where = f"deployments[{i}]"
        written = lengths.get(d.workload)
        for name, value, expected, limit in zip(("input_tokens", "output_tokens"), (d.input_tokens, d.output_tokens), written or (),
                                                (MAX_INPUT_TOKENS, MAX_OUTPUT_TOKENS), strict=False):
            if value != expected and type(expected) is int and 1 <= expected <= limit:  # else the problem's own check refuses it
                out.append(InputIssue(f"{where}.{name}", f"{value}, but workload {d.workload!r} of the embedded problem has {expected}",
                                      f"restore {name}: {expected}, or change the workload in problem_spec and re-solve"))
        out += _placement_issues(d, where, plan.racks) + _expert_map_issues(d, where)
    return out


def plan_json_schema() -> dict:
    return Plan.model_json_schema()


def parse_plan(record: object, source: str) -> Plan:
    """`record` validated as a plan; PlannerInputError naming the field and the fix otherwise."""
    if not isinstance(record, dict) or record.get("format") != PLAN_FORMAT:
        raise PlannerInputError(InputIssue(source, "not a plan written by `planner solve --json`", "solve a problem with --json PATH first"))
    if record.get("format_version") != PLAN_FORMAT_VERSION:
        raise PlannerInputError(InputIssue(f"{source}: format_version", f"version {record.get('format_version')} is not supported "
                                           f"(this planner reads version {PLAN_FORMAT_VERSION})",
                                           "re-solve the problem with this planner version"))
    try:
        plan = Plan.model_validate(record)
    except ValidationError as exc:
        raise PlannerInputError([replace(i, fix=i.fix.replace("`planner schema`", "`planner schema --plan`"))  # the plan's schema, not the problem's
                                 for i in issues_from_validation_error(exc)], source=source) from None
    issues = plan_issues(plan)
    if issues:
        raise PlannerInputError(issues, source=source)
    return plan
