"""The parts of a plan file (`planner/output/plan.py` holds the plan and its deployments): where each
accelerator sits, expert maps, number formats, speculative decoding, the fleet's racks, the solver's
figures, and what each workload is served. Fields are declared in the order the plan file writes them.
"""

import math
import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
)

from planner.limits import MAX_DRAFT_TOKENS, MAX_PARALLEL_DEGREE
from planner.physics.deployment import Precisions
from planner.precision import FlopsFormat, Precision

__all__ = [
    "AcceleratorNode",
    "Degree",
    "ExpertLayer",
    "ExpertMap",
    "FleetRecord",
    "HandoffRecord",
    "MemoryRecord",
    "Number",
    "PlacedAccelerator",
    "PlanPrecisions",
    "RackInstance",
    "RackInstanceName",
    "ServedRecord",
    "SolverRecord",
    "SpeculativeRecord",
    "finite",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Open(BaseModel):
    """A record whose figures are kept as written (`check` recomputes them): unknown keys stay."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


Number = int | float  # a figure as written: an int stays an int, so that a plan reads back to the same bytes
Degree = Annotated[int, Field(ge=1, le=MAX_PARALLEL_DEGREE, strict=True)]  # strict: `true` is not 1
RACK_INSTANCE = re.compile(r"^[^#/\s]+#[0-9]+$")
ACCELERATOR_NODE = re.compile(r"^[^#/\s]+#[0-9]+/[0-9]+$")


def finite(value):
    """`value` with every NaN or infinite number replaced by None, so that the JSON is standard
    (JSON.parse rejects NaN and Infinity): null means "no finite value", e.g. the bandwidth of a
    link a layout never uses."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


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

    @property
    def rack_type(self) -> str:
        return self.rack.split("#")[0]

    @property
    def instance(self) -> int:
        """Which instance of its rack type ('hgx-h100#3/5' -> 3)."""
        return int(self.rack.split("#")[1])

    @property
    def index(self) -> int:
        """Its index inside the rack instance ('hgx-h100#3/5' -> 5)."""
        return int(self.accelerator.rsplit("/", 1)[1])


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

    @property
    def redundant_slots(self) -> int:
        """Physical slots beyond one per logical expert: the redundant copies of hot experts."""
        return self.n_ranks * self.slots_per_rank - self.n_logical_experts

    @property
    def moe_layers(self) -> list[int]:
        """The MoE layers the map balances (its `layers` entries), in order."""
        return [q.layer for q in self.layers]

    def rank_slots(self, layer: int) -> list[list[int]]:
        """The logical experts each expert-parallel rank holds in `layer`, one list per rank."""
        row, slots = self.physical_to_logical_map[layer], self.slots_per_rank
        return [row[r * slots:(r + 1) * slots] for r in range(self.n_ranks)]


class PlanPrecisions(_Strict):
    """The number formats a deployment runs: every one is needed by `check` and by each exporter."""

    weights: Precision
    expert_weights: Precision
    kv_cache: Precision
    activations: Precision
    compute: FlopsFormat

    def as_precisions(self) -> Precisions:
        return Precisions(self.weights, self.kv_cache, self.activations, self.compute, self.expert_weights)


class SpeculativeRecord(_Open):
    """A deployment's speculative decoding (its figures are kept as written; `check` recomputes them)."""

    method: Literal["mtp"]
    draft_tokens: Annotated[int, Field(ge=0, le=MAX_DRAFT_TOKENS, strict=True)]
    acceptance_rates: list[Number] | None = None
    accepted_tokens_per_step: Number | None = Field(default=None, description="tokens emitted per verification step, on average")
    acceptance_source: str | None = None
    step_time_s: Number | None = None


class MemoryRecord(_Open):
    """HBM per accelerator of a deployment's fullest accelerator, in bytes."""

    weights: Number | None = None
    kv: Number | None = None
    activations: Number | None = None
    capacity: Number | None = None
    free: Number | None = None


class RackInstance(_Strict):
    """One rack (scale-up unit) instance of the fleet, as the plan saw it."""

    accelerators: Annotated[int, Field(ge=1, le=MAX_PARALLEL_DEGREE, strict=True)]
    accelerators_per_host: Annotated[int, Field(ge=1, le=MAX_PARALLEL_DEGREE, strict=True)]
    unavailable: list[NonNegativeInt] = []


class SolverRecord(_Open):
    """How the plan was found: CP-SAT's figures."""

    wall_time_s: Number | None = None
    total_time_s: Number | None = None
    objective: Number | None = None
    best_bound: Number | None = None
    gap: Number | None = None
    objective_unit: str | None = None
    time_limit_s: Number | None = None
    seed: int | None = None
    workers: int | None = None
    candidates: int | None = None
    variables: int | None = None
    constraints: int | None = None


class FleetRecord(_Open):
    """What the plan uses of the fleet: cost, accelerators, and per rack type what is available and used."""

    usd_per_hour: Number | None = None
    accelerators: int | None = None
    racks: dict[str, dict] = {}


class ServedRecord(_Open):
    """Per workload, the output tokens/s served: with prefill and decode pools the smaller of what
    decode makes and prefill feeds."""

    workload: str
    served_output_tokens_per_s: Number | None = None
    made_output_tokens_per_s: Number | None = None
    fed_output_tokens_per_s: Number | None = None
    demand_output_tokens_per_s: Number | None = None


class HandoffRecord(_Open):
    """Per workload with prefill and decode pools, the KV cache hand-off between them."""

    workload: str
    replica_pairs: int | None = None
    pairs_in_one_domain: int | None = None
    nic_seconds: Number | None = None
    in_domain_seconds: Number | None = None
