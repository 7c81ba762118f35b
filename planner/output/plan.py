"""The plan file `planner solve --json` writes, as a pydantic model with its JSON Schema
(`planner schema --plan`). The writer (`planner.output.plan_report.solve_plan`) builds a `Plan`;
`check`, `export`, `view` and the HTTP service load plan files through `parse_plan`, so that a plan
from another version or a hand edit that breaks its structure is refused with the field and the fix
instead of failing deep inside a reader, and every reader takes the typed `Plan`: no reader looks a
plan field up by its name in a dict.

Every field the writer writes is declared, in the order it writes them, so that a plan read back
and written again is the same bytes (`plan_document`); a deployment's figures (latencies,
throughputs, costs and their ranges, step terms, memory) are kept as written, since `check`
recomputes them.
"""

from dataclasses import replace
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.errors import InputIssue, PlannerInputError, issues_from_validation_error
from planner.limits import (
    MAX_BATCH_PER_REPLICA,
    MAX_INPUT_TOKENS,
    MAX_OUTPUT_TOKENS,
    MAX_PARALLEL_DEGREE,
    MAX_REPLICAS,
)
from planner.modes import Engine, ServingRole
from planner.output.plan_records import (
    Degree,
    ExpertMap,
    FleetRecord,
    HandoffRecord,
    MemoryRecord,
    Number,
    PlacedAccelerator,
    PlanPrecisions,
    RackInstance,
    RackInstanceName,
    ServedRecord,
    SolverRecord,
    SpeculativeRecord,
    finite,
)
from planner.physics.deployment import Layout

__all__ = ["PLAN_FORMAT", "PLAN_FORMAT_VERSION", "Plan", "PlanDeployment", "as_plan", "parse_plan", "plan_document", "plan_json_schema"]

PLAN_FORMAT = "llm-deployment-plan"
PLAN_FORMAT_VERSION = 1

Figure = Number | None  # a figure `check` recomputes, kept as written (null where no finite value exists)
Range = list[Figure] | None  # [p10, p90] of the figure beside it


class PlanDeployment(BaseModel):
    """One deployment: a layout of one model on one rack type, its replicas and where they run."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # the figures check recomputes (see the module docstring)

    workload: str = Field(min_length=1)
    model: str = Field(min_length=1)
    rack: str = Field(min_length=1)
    accelerator: str = Field(min_length=1)
    tp: Degree
    ep: Degree
    pp: Degree
    dp_attn: Degree
    expert_tp: Degree = 1
    micro_batches: Annotated[int, Field(ge=1, le=MAX_BATCH_PER_REPLICA)] = 1
    replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS, strict=True)]
    batch_per_replica: Annotated[int, Field(ge=1, le=MAX_BATCH_PER_REPLICA, strict=True)]
    groups_span_domains: bool | None = None
    accelerators: int | None = Field(default=None, description="replicas x accelerators_per_replica")
    accelerators_per_replica: Annotated[int, Field(ge=1, le=MAX_PARALLEL_DEGREE, strict=True)]
    output_tokens_per_s: Figure = None
    input_tokens_per_s: Figure = None
    usd_per_hour: Figure = None
    usd_per_million_output_tokens_all_in: Figure = None
    batch_limit: str | None = None
    kv_tier: str | None = Field(default=None, description="where the prompt cache waits (null: no prompt cache)")
    prompt_cache_storage_usd_per_hour: Figure = None
    kv_handoff_bytes_per_request: Figure = None
    kv_handoff_bytes_per_s_per_replica: Figure = None
    engine: Engine = Engine.TRTLLM
    step_model: str | None = None
    kernel_source: str | None = None
    input_tokens: Annotated[int, Field(ge=1, le=MAX_INPUT_TOKENS, strict=True)] = Field(description="prompt tokens per request")
    output_tokens: Annotated[int, Field(ge=1, le=MAX_OUTPUT_TOKENS, strict=True)] = Field(description="output tokens per request")
    precisions: PlanPrecisions
    role: ServingRole = ServingRole.AGGREGATED
    speculative: SpeculativeRecord | None = None
    tpot_s: Figure = None
    tpot_s_range: Range = None
    ttft_s: Figure = None
    ttft_s_range: Range = None
    ttft_p90_s: Figure = None
    prefill_latency_s: Figure = None
    queue_wait_s: Figure = None
    cache_hit_latency_s: Figure = None
    output_tokens_per_s_per_replica: Figure = None
    output_tokens_per_s_per_accelerator: Figure = None
    output_tokens_per_s_per_accelerator_range: Range = None
    input_tokens_per_s_per_replica: Figure = None
    input_tokens_per_s_per_replica_range: Range = None
    decode_only_tokens_per_s_per_replica: Figure = None
    decode_only_tokens_per_s_per_replica_range: Range = None
    prefill_only_tokens_per_s_per_replica: Figure = None
    prefill_only_tokens_per_s_per_replica_range: Range = None
    prefill_tokens_per_step: Figure = None
    prompt_cache: dict | None = None
    requests_per_s_per_replica: Figure = None
    usd_per_hour_per_replica: Figure = None
    usd_per_million_output_tokens: Figure = None
    usd_per_million_output_tokens_range: Range = None
    usd_per_million_output_tokens_decode_only: Figure = None
    usd_per_million_input_tokens: Figure = None
    usd_per_request: Figure = None
    step_time_s: dict | None = None
    decode_only_step_time_s: dict | None = None
    dominant_term: str | None = None
    bound: str | None = None
    prefill_chunk_step_time_s: dict | None = None
    roofline: dict | None = None
    memory_bytes_per_accelerator: MemoryRecord | None = None
    hbm_fill_fraction: Figure = None
    fits_hbm: bool | None = None
    expert_touch_fraction: Figure = None
    links: dict | None = None
    assumptions: list | None = None
    placement: list[PlacedAccelerator] = []
    expert_map: ExpertMap | None = None

    @property
    def layout(self) -> Layout:
        return Layout(tp=self.tp, ep=self.ep, pp=self.pp, dp_attn=self.dp_attn)

    @property
    def stage_size(self) -> int:
        """Accelerators of one pipeline stage (tp x dp_attn)."""
        return self.layout.stage_size

    @property
    def expected_placement(self) -> int:
        """Placement entries the layout needs: replicas x tp x dp_attn x pp."""
        return self.replicas * self.layout.n_accelerators

    @property
    def has_placement(self) -> bool:
        """Whether the plan places its accelerators (a plan solved without placement has no `placement`)."""
        return "placement" in self.model_fields_set

    @property
    def draft_tokens(self) -> int:
        """Draft tokens of its speculative decoding (0 without)."""
        return self.speculative.draft_tokens if self.speculative is not None else 0

    def stages(self) -> dict[tuple[int, int], list[PlacedAccelerator]]:
        """(replica, stage) -> its accelerators in placement order."""
        by_stage: dict[tuple[int, int], list[PlacedAccelerator]] = {}
        for entry in self.placement:
            by_stage.setdefault((entry.replica, entry.stage), []).append(entry)
        return by_stage


class Plan(BaseModel):
    """A solved plan as `planner solve --json` writes it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    format: Literal["llm-deployment-plan"]
    format_version: Literal[1]
    problem: str
    status: str
    objective_kind: str
    solver: SolverRecord
    fleet: FleetRecord
    served: list[ServedRecord] = Field(default=[], description="per workload, the output tokens/s served: with prefill and decode pools the "
                                                               "smaller of what decode makes and prefill feeds")
    deployments: list[PlanDeployment]
    explanation: dict | None = None
    infeasibility: dict | None = None
    racks: dict[RackInstanceName, RackInstance] = {}
    kv_handoff: list[HandoffRecord] = []
    problem_spec: dict = Field(description="the problem the plan solves, embedded so that the plan stands alone")
    problem_dir: str | None = Field(default=None, description="where relative paths of the problem resolve")
    notes: list[str] = []

    @property
    def placed_accelerators(self) -> int:
        return sum(len(d.placement) for d in self.deployments)

    @property
    def engine(self) -> Engine:
        """The engine of its first deployment: what `export` writes without --format."""
        return self.deployments[0].engine if self.deployments else Engine.TRTLLM

    def model_entry(self, d: PlanDeployment) -> object:
        """The embedded problem's model entry that deployment `d`'s workload serves, as written (a
        catalog id, or a mapping: inline, config_json, catalog); the deployment's model id without one."""
        problem = self.problem_spec
        if problem.get("model") is not None:
            return problem["model"]
        models = problem.get("models") or {}
        workload = next((w for w in problem.get("workloads", []) if isinstance(w, dict) and w.get("name") == d.workload), {})
        key = workload.get("model") or next(iter(models), None)
        return models.get(key, d.model)

    def workload_lengths(self) -> dict[str, tuple[object, object]]:
        """Prompt and output lengths of each workload of the embedded problem, as written (the problem
        itself is validated when a command resolves it)."""
        workloads = self.problem_spec.get("workloads")
        if not isinstance(workloads, list):
            return {}
        return {w["name"]: (w.get("input_tokens"), w.get("output_tokens")) for w in workloads if isinstance(w, dict) and "name" in w}


def plan_document(plan: Plan) -> dict:
    """The plan as its JSON file holds it: every field the writer or the file set, in the file's
    order, NaN and infinities as null."""
    return finite(plan.model_dump(mode="json", exclude_unset=True))


def as_plan(plan: "Plan | dict") -> Plan:
    """A plan, or a plan document (what `planner.solve_record` returns) validated as one: the library's
    entry points take either; a document whose structure is broken raises pydantic's ValidationError."""
    return plan if isinstance(plan, Plan) else Plan.model_validate(plan)


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


def plan_issues(plan: Plan) -> list[InputIssue]:
    """What a valid structure can still get wrong, found without the catalog or the step model:
    ranks outside the layout, accelerators outside their rack, ragged expert maps, prompt lengths
    that are not the embedded problem's, rack instances without their index."""
    out = [InputIssue(f"racks.{name}.unavailable", f"{bad} is not an accelerator index below {rack.accelerators}",
                      "list indices 0..accelerators - 1")
           for name, rack in plan.racks.items() for bad in rack.unavailable if bad >= rack.accelerators]
    lengths = plan.workload_lengths()
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
