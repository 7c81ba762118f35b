"""The plan file `planner solve --json` writes, as a pydantic model with its JSON Schema
(`planner schema --plan`). `check`, `export` and `view` load plans through it, so that a plan from
another version or a hand edit that breaks its structure is refused with the field and the fix
instead of failing deep inside a reader.

The fields every reader relies on are typed here; a deployment's figures (latencies, throughputs,
costs and their ranges, step terms, memory) are kept as written, since `check` recomputes them.
"""

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
)

from planner.errors import InputIssue, PlannerInputError, issues_from_validation_error
from planner.limits import MAX_BATCH_PER_REPLICA, MAX_DRAFT_TOKENS, MAX_PARALLEL_DEGREE, MAX_REPLICAS
from planner.modes import Engine, ServingRole
from planner.precision import Precision

__all__ = ["PLAN_FORMAT", "PLAN_FORMAT_VERSION", "Plan", "parse_plan", "plan_json_schema"]

PLAN_FORMAT = "llm-deployment-plan"
PLAN_FORMAT_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


Degree = Annotated[int, Field(ge=1, le=MAX_PARALLEL_DEGREE, strict=True)]  # strict: `true` is not 1


class PlacedAccelerator(_Strict):
    """One accelerator of a deployment: where it is and which ranks it holds."""

    accelerator: str = Field(min_length=1, description="graph node, '<rack-id>#<instance>/<index>'")
    rack: str = Field(min_length=1, description="rack instance, '<rack-id>#<instance>'")
    replica: NonNegativeInt
    stage: NonNegativeInt
    layers: tuple[NonNegativeInt, NonNegativeInt] = Field(description="[first, last + 1) layers of its pipeline stage")
    tp_rank: NonNegativeInt
    dp_rank: NonNegativeInt
    ep_rank: NonNegativeInt | None = None  # None for a dense model
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
    role: ServingRole = ServingRole.AGGREGATED
    engine: Engine = Engine.TRTLLM
    precisions: dict[Literal["weights", "expert_weights", "kv_cache", "activations", "compute"], Precision]
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
    racks: dict[str, RackInstance] = {}
    kv_handoff: list[dict] = []
    served: list[dict] = Field(default=[], description="per workload, the output tokens/s served: with prefill and decode pools the "
                                                       "smaller of what decode makes and prefill feeds")
    problem_spec: dict = Field(description="the problem the plan solves, embedded so that the plan stands alone")
    problem_dir: str | None = Field(default=None, description="where relative paths of the problem resolve")
    notes: list[str] = []


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
        return Plan.model_validate(record)
    except ValidationError as exc:
        raise PlannerInputError(issues_from_validation_error(exc, source)) from None
