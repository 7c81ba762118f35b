"""The deployment-problem file format: pydantic models of the YAML a user writes (friendly units named in
each field, `tpot_limit_ms`), with messages that name the field and the fix, and its JSON Schema."""

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from planner.errors import (
    InputIssue,
    PlannerInputError,
    issues_from_validation_error,
    load_yaml_file,
)
from planner.hardware.specs import (
    AcceleratorSpec,
    RackSpec,
)
from planner.limits import (
    MAX_BATCH_PER_REPLICA,
    MAX_DEMAND_OUTPUT_TOKENS_PER_S,
    MAX_DEMAND_REQUESTS_PER_S,
    MAX_DRAFT_TOKENS,
    MAX_INPUT_TOKENS,
    MAX_LATENCY_LIMIT_MS,
    MAX_MODELS,
    MAX_OUTPUT_TOKENS,
    MAX_PREFILL_CHUNK_TOKENS,
    MAX_RACK_TYPES,
    MAX_RACKS_PER_TYPE,
    MAX_REPLICAS,
    MAX_SEED,
    MAX_TIME_LIMIT_S,
    MAX_USD_PER_HOUR,
    MAX_WORKLOADS,
)
from planner.model.catalog import ModelSpec
from planner.modes import Confidence, Engine, OverlapPolicy, ServingMode, StepModel
from planner.precision import Precision
from planner.schema import CatalogId, EdgeModel, Name

__all__ = ["CatalogModelRef", "ClusterSpec", "ConfigJsonModelRef", "Demand", "ExpertLoadSpec", "InlineModelRef", "ModelRef", "Objective", "PlacementOptions", "PrecisionSpec", "PrefixCacheSpec", "Problem", "RackCount", "SolverOptions", "SpeculativeSpec", "SyntheticLoad", "WorkloadSpec", "load_problem", "parse_problem", "problem_json_schema"]

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


class SyntheticLoad(EdgeModel):
    distribution: Literal["lognormal", "uniform"] = Field(default="lognormal", description="per-expert load distribution")
    sigma: float = Field(default=0.9, gt=0, le=5, description="lognormal sigma (0.9: the hottest of 256 experts near 8x the mean expert)")
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="random seed")


class ExpertLoadSpec(EdgeModel):
    """Per-layer, per-expert load profile: a file (JSON {"layers": [[...]]}, SGLang's
    {"logical_count": ...}, or CSV with one row per MoE layer) or a synthetic skewed profile."""

    file: str | None = Field(default=None, description="path to the profile, relative to the problem file")
    synthetic: SyntheticLoad | None = Field(default=None, description="a generated profile")

    @model_validator(mode="after")
    def _one(self) -> "ExpertLoadSpec":
        if (self.file is None) == (self.synthetic is None):
            raise ValueError("give exactly one of file and synthetic\n    fix: keep one source of expert loads")
        return self


class CatalogModelRef(EdgeModel):
    catalog: str = Field(description="model id from the built-in catalog (`planner catalog`)")
    precisions: PrecisionSpec | None = Field(default=None, description="formats for this model, over the problem's defaults")
    expert_load: ExpertLoadSpec | None = Field(default=None, description="expert load profile of this model (MoE only)")


class ConfigJsonModelRef(EdgeModel):
    config_json: str = Field(description="path to a Hugging Face config.json, relative to the problem file")
    id: CatalogId | None = Field(default=None, description="id to give the imported model")
    hf_repo: str | None = Field(default=None, description="Hugging Face repository (or local path) exports serve; default /models/<id>")
    serving_repo: str | None = Field(default=None, description="repository exports serve instead of hf_repo (the instruct or chat model)")
    quantized_repos: dict[Precision, str] = Field(
        default_factory=dict, description="pre-quantized checkpoints by weight format (fp8, nvfp4), so exports need no online quantization")
    trust_remote_code: bool | None = Field(default=None, description="whether the engines need --trust-remote-code; default: "
                                           "whether config.json names code of its own (auto_map)")
    gated: bool = Field(default=False, description="whether Hugging Face gates the repository (a licence to accept first)")
    precisions: PrecisionSpec | None = Field(default=None, description="formats for this model, over the problem's defaults")
    expert_load: ExpertLoadSpec | None = Field(default=None, description="expert load profile of this model (MoE only)")


class InlineModelRef(EdgeModel):
    inline: ModelSpec = Field(description="the architecture written out in the catalog's format")
    precisions: PrecisionSpec | None = Field(default=None, description="formats for this model, over the problem's defaults")
    expert_load: ExpertLoadSpec | None = Field(default=None, description="expert load profile of this model (MoE only)")


class PlacementOptions(EdgeModel):
    redundant_experts_per_rank: int = Field(default=0, ge=0, le=64, description="extra expert copies per expert-parallel rank for hot experts")
    method: Literal["greedy", "cpsat"] = Field(default="greedy", description="greedy + swap search, or that followed by CP-SAT")
    time_limit_s: float = Field(default=10.0, gt=0, le=MAX_TIME_LIMIT_S, description="time for the expert placement of one deployment (cpsat)")
    expert_load: ExpertLoadSpec | None = Field(default=None, description="default load profile of MoE models (none: uniform)")
    previous_plan: str | None = Field(default=None, description="plan JSON (`planner solve --json`) of the deployment in service: "
                                                                 "expert maps stay close to its maps (path relative to the problem file)")
    max_expert_moves_per_layer: int | None = Field(default=None, ge=0, description="with previous_plan: expert copies each MoE layer "
                                                                                    "may load onto a rank that did not hold them")

    @model_validator(mode="after")
    def _budget_needs_previous(self) -> "PlacementOptions":
        if self.max_expert_moves_per_layer is not None and self.previous_plan is None:
            raise ValueError("max_expert_moves_per_layer counts moves from a previous placement\n"
                             "    fix: give placement.previous_plan, or drop the budget")
        return self


def _model_ref_kind(value: object) -> str:
    """Which form of model reference `value` is, so that errors name only that form's fields."""
    if isinstance(value, str):
        return "tag:id"
    if isinstance(value, dict):
        for key in ("config_json", "inline"):
            if key in value:
                return f"tag:{key}"
        return "tag:catalog"
    for cls, tag in ((ConfigJsonModelRef, "tag:config_json"), (InlineModelRef, "tag:inline"), (CatalogModelRef, "tag:catalog")):
        if isinstance(value, cls):
            return tag
    return "tag:id"


ModelRef = Annotated[
    Annotated[str, Tag("tag:id")] | Annotated[CatalogModelRef, Tag("tag:catalog")] | Annotated[ConfigJsonModelRef, Tag("tag:config_json")]
    | Annotated[InlineModelRef, Tag("tag:inline")],
    Discriminator(_model_ref_kind),
    Field(description="a catalog id, {catalog: id}, {config_json: path} or {inline: {...}}"),
]


class RackCount(EdgeModel):
    type: str = Field(description="rack / scale-up unit id (catalog or custom_racks)")
    count: int | None = Field(default=None, ge=0, le=MAX_RACKS_PER_TYPE, description="how many the fleet has; omit for 'as many as needed'")


class ClusterSpec(EdgeModel):
    racks: list[RackCount] = Field(min_length=1, max_length=MAX_RACK_TYPES, description="rack types the fleet can use, each once")
    custom_accelerators: list[AcceleratorSpec] = Field(default_factory=list, max_length=MAX_RACK_TYPES, description="accelerators not in the catalog")
    custom_racks: list[RackSpec] = Field(default_factory=list, max_length=MAX_RACK_TYPES, description="scale-up units not in the catalog")
    kernel_catalog: str | None = Field(default=None, description="a user catalog directory (`planner calibrate <probe dir> --out DIR`, "
                                       "relative to this file): its probed accelerators, racks and kernel curves are added")
    price_overrides_usd_per_hour: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict, description="accelerator id -> your price per accelerator-hour"
    )
    achievable_overrides: dict[str, dict[Literal["compute_fraction", "hbm_bandwidth_fraction", "scale_up_bandwidth_fraction",
                                                 "scale_out_bandwidth_fraction"], Annotated[float, Field(gt=0, le=1)]]] = Field(
        default_factory=dict, description="accelerator id -> achievable fractions of peak to use instead of the defaults"
    )
    unavailable_accelerators: list[str] = Field(default_factory=list, max_length=100_000,
                                                description="accelerator node names to leave out, e.g. 'hgx-h100#0/3'")
    allow_spanning_domains: bool = Field(
        default=False, description="let tensor/expert groups span scale-up domains (their traffic then runs at scale-out bandwidth)"
    )

    @model_validator(mode="after")
    def _each_type_once(self) -> "ClusterSpec":
        for kind, names in (("rack type", [r.type for r in self.racks]), ("custom rack id", [r.id for r in self.custom_racks]),
                            ("custom accelerator id", [a.id for a in self.custom_accelerators])):
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise ValueError(f"{kind} listed more than once: {', '.join(repeated)}\n    fix: list each once and add up the counts")
        return self


class Demand(EdgeModel):
    output_tokens_per_s: float | None = Field(default=None, gt=0, le=MAX_DEMAND_OUTPUT_TOKENS_PER_S, description="output tokens per second to serve")
    requests_per_s: float | None = Field(default=None, gt=0, le=MAX_DEMAND_REQUESTS_PER_S, description="requests per second to serve")

    @model_validator(mode="after")
    def _one(self) -> "Demand":
        if (self.output_tokens_per_s is None) == (self.requests_per_s is None):
            raise ValueError("give exactly one of output_tokens_per_s and requests_per_s\n    fix: keep one demand figure")
        return self


class PrefixCacheSpec(EdgeModel):
    """Prompt caching: a share of requests starts with a prefix whose KV cache is kept from an
    earlier request (a system prompt, a document, the conversation so far)."""

    hit_rate: float = Field(ge=0, le=1, description="share of requests whose prefix is found in the cache")
    prefix_tokens: int | None = Field(default=None, ge=1, description="cached prompt tokens per request (default: the whole prompt)")
    retention_minutes: float = Field(gt=0, le=100_000, description="how long an entry is kept after its last use, minutes")
    tier: Literal["auto", "hbm", "host-dram", "local-flash", "remote-storage"] = Field(
        default="auto", description="where cached KV waits; auto: the cheapest that fits, or none when recomputing is cheaper")

    @field_validator("hit_rate", mode="before")
    @classmethod
    def _share_not_percent(cls, value):
        if isinstance(value, int | float) and 1 < value <= 100:
            raise ValueError(f"hit_rate = {value:g} looks like a percentage\n    fix: write a share between 0 and 1, e.g. {value / 100:g}")
        return value


class SpeculativeSpec(EdgeModel):
    """Speculative decoding with the model's own multi-token-prediction (MTP) modules as the draft
    (docs/step-model.md, "Speculative decoding"). Each step verifies 1 + draft_tokens tokens per
    sequence and emits the accepted ones: faster per user at small batches, dearer per token where
    the step is compute-bound."""

    method: Literal["mtp"] = Field(default="mtp", description="mtp: the model's multi-token-prediction modules draft (DeepSeek-V3/R1)")
    draft_tokens: Annotated[int, Field(ge=0, le=MAX_DRAFT_TOKENS)] | Literal["auto"] = Field(
        default="auto", description="draft tokens each step verifies (0: off); auto: the solver picks 0..max_draft_tokens per candidate")
    max_draft_tokens: int = Field(default=3, ge=1, le=MAX_DRAFT_TOKENS, description="with auto: the most draft tokens tried")
    acceptance_rates: list[Annotated[float, Field(gt=0, le=1)]] | None = Field(
        default=None, min_length=1, max_length=MAX_DRAFT_TOKENS,
        description="chance draft token i is accepted given the ones before it were, per position, for this workload's data "
                    "(default: the model catalog's published rates)")
    acceptance_length: float | None = Field(
        default=None, ge=1, le=1 + MAX_DRAFT_TOKENS,
        description="or: the mean tokens a step emits per sequence, measured at this draft_tokens (engines log it as the "
                    "accept(ance) length)")

    @model_validator(mode="after")
    def _one_acceptance(self) -> "SpeculativeSpec":
        if self.acceptance_rates is not None and self.acceptance_length is not None:
            raise ValueError("give acceptance_rates or acceptance_length, not both\n    fix: keep one measure of acceptance")
        if self.acceptance_length is not None and not isinstance(self.draft_tokens, int):
            raise ValueError("acceptance_length is measured at one draft_tokens and cannot be extrapolated for auto\n"
                             "    fix: set draft_tokens to the number it was measured with, or give acceptance_rates")
        if self.acceptance_length is not None and self.acceptance_length > 1 + self.draft_tokens:
            raise ValueError(f"acceptance_length {self.acceptance_length:g} exceeds 1 + draft_tokens = {1 + self.draft_tokens}\n"
                             "    fix: a step emits at most its draft tokens plus one")
        if isinstance(self.draft_tokens, int) and self.acceptance_rates is not None and len(self.acceptance_rates) < self.draft_tokens:
            raise ValueError(f"{self.draft_tokens} draft tokens need {self.draft_tokens} acceptance_rates, {len(self.acceptance_rates)} given"
                             "\n    fix: give one rate per draft position")
        return self


class WorkloadSpec(EdgeModel):
    name: Name = Field(description="workload name")
    model: str | None = Field(default=None, description="key of `models` (optional when there is one model)")
    input_tokens: int = Field(ge=1, le=MAX_INPUT_TOKENS, description="prompt length per request")
    output_tokens: int = Field(ge=1, le=MAX_OUTPUT_TOKENS, description="generated tokens per request")
    demand: Demand | None = Field(default=None, description="traffic to serve; omit to minimise cost per token")
    ttft_limit_ms: float | None = Field(default=None, gt=0, le=MAX_LATENCY_LIMIT_MS, description="time-to-first-token limit, milliseconds, held at the 90th percentile of TTFT for Poisson arrivals at the plan's load (docs/step-model.md)")
    tpot_limit_ms: float | None = Field(default=None, gt=0, le=MAX_LATENCY_LIMIT_MS, description="time-per-output-token limit, milliseconds")
    prefix_cache: PrefixCacheSpec | None = Field(default=None, description="prompt caching (claim 9); omit for none")
    speculative: SpeculativeSpec | None = Field(default=None, description="speculative decoding with the model's MTP modules; "
                                                                      "omit for none")
    serving: ServingMode = Field(
        default=ServingMode.AGGREGATED, description="aggregated replicas (prefill rides in the decode steps), separate prefill and decode "
                                          "pools, or auto: the solver picks the cheaper and says by how much")

    @model_validator(mode="after")
    def _prefix_within_prompt(self) -> "WorkloadSpec":
        if self.prefix_cache and self.prefix_cache.prefix_tokens and self.prefix_cache.prefix_tokens > self.input_tokens:
            raise ValueError(f"prefix_cache.prefix_tokens {self.prefix_cache.prefix_tokens} exceeds input_tokens {self.input_tokens}"
                             "\n    fix: the cached prefix is part of the prompt")
        return self

    @field_validator("ttft_limit_ms", "tpot_limit_ms")
    @classmethod
    def _milliseconds(cls, value: float | None, info) -> float | None:
        if value is not None and value < 1.0:
            raise ValueError(f"{info.field_name} = {value:g} ms looks like seconds\n    fix: write milliseconds, e.g. {value * 1000:g}")
        return value


class SolverOptions(EdgeModel):
    time_limit_s: float = Field(default=10.0, gt=0, le=MAX_TIME_LIMIT_S, description="CP-SAT search limit, seconds (deterministic time, close to wall time)")
    relative_gap_limit: float = Field(default=0.0, ge=0, lt=1, description="stop once (objective - bound) / objective is below this; 0 = prove optimality")
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="CP-SAT random seed")
    workers: int = Field(default=2, ge=1, le=64, description="CP-SAT worker threads")
    overlap: OverlapPolicy = Field(default=OverlapPolicy.SERIAL, description="serial: comm adds to the step; overlapped: hidden")
    max_batch_per_replica: int = Field(default=65536, ge=1, le=MAX_BATCH_PER_REPLICA, description="largest decode batch (sequences) to consider")
    prefill_chunk_tokens: int = Field(default=8192, ge=64, le=MAX_PREFILL_CHUNK_TOKENS, description="tokens per forward pass (the engine's token budget): short prompts are packed into one prefill pass, long ones chunked")
    confidence: Confidence = Field(default=Confidence.MEDIAN, description="median: latency limits hold for the calibrated prediction; high: they hold at the slow end (p90) of its range")
    step_model: StepModel = Field(default=StepModel.CALIBRATED, description="calibrated: kernel rates measured for the engine (what it reaches); roofline: the ideal bound")
    max_replicas: int = Field(default=4096, ge=1, le=MAX_REPLICAS, description="largest replica count per deployment")


class Problem(EdgeModel):
    """A deployment problem: models, precisions, cluster, workloads, objective and solver options."""

    name: Name = Field(default="problem", description="short name")
    description: str | None = Field(default=None, description="free text shown nowhere but kept with the plan")
    model: ModelRef | None = Field(default=None, description="the model, when there is only one")
    models: dict[Name, ModelRef] | None = Field(default=None, max_length=MAX_MODELS, description="several models by key")
    precisions: PrecisionSpec = Field(default_factory=PrecisionSpec, description="default formats for every model")
    cluster: ClusterSpec = Field(description="the fleet: rack types and counts, custom hardware, prices, unavailable accelerators")
    workloads: list[WorkloadSpec] = Field(min_length=1, max_length=MAX_WORKLOADS, description="the traffic to serve: prompt and output lengths, demand, latency limits")
    objective: Objective = Field(default=Objective.MIN_COST, description="min_cost (fleet USD/h for the demand, or USD per token without one), "
                                                                         "max_throughput_per_accelerator, or min_tpot under cost_cap_usd_per_hour")
    cost_cap_usd_per_hour: float | None = Field(default=None, gt=0, le=MAX_USD_PER_HOUR, description="fleet cost cap for objective min_tpot")
    engine: Engine = Field(default=Engine.TRTLLM, description="serving engine (trtllm, sglang, vllm): its kernel rates calibrate the step model, and exports default to it")
    solver: SolverOptions = Field(default_factory=SolverOptions, description="CP-SAT and candidate-enumeration options")
    placement: PlacementOptions = Field(default_factory=PlacementOptions, description="how experts are placed on their ranks")

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
        raise PlannerInputError(issues_from_validation_error(exc, model=Problem), source=source) from None


def load_problem(path: Path) -> Problem:
    return parse_problem(load_yaml_file(path), source=str(path))
