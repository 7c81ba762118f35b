"""A problem resolved against the catalogs: models, racks, workloads and precisions as frozen SI values
(`resolve_problem` converts the file's friendly units once), expert loads and previous expert maps."""

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from planner.errors import (
    InputIssue,
    PlannerInputError,
    unknown_name_issue,
)
from planner.hardware.catalog import (
    Accelerator,
    HardwareCatalog,
    RackType,
    load_hardware_catalog,
)
from planner.hardware.user_catalog import with_user_catalog
from planner.model.architecture import ModelArch
from planner.model.catalog import arch_from_spec, load_model_catalog
from planner.modes import CacheTier, ServingMode, ServingRole
from planner.physics.deployment import Precisions
from planner.physics.inputs import ServingOptions
from planner.physics.speculation import Speculation
from planner.problem.precisions import resolve_precisions
from planner.problem.previous_plan import previous_expert_maps
from planner.problem.schema import (
    CatalogModelRef,
    ConfigJsonModelRef,
    ExpertLoadSpec,
    Objective,
    PlacementOptions,
    PrecisionSpec,
    Problem,
    SolverOptions,
    SpeculativeSpec,
)
from planner.units import MS, SECONDS_PER_MINUTE

__all__ = ["PrefixCacheRequest", "ResolvedModel", "ResolvedProblem", "ResolvedWorkload", "SpeculativeRequest", "resolve_precisions",
           "resolve_problem", "resolve_speculative"]

# ---------------------------------------------------------------------------------------------
# Resolution against the catalogs


@dataclass(frozen=True)
class ResolvedModel:
    key: str
    arch: ModelArch
    precisions: PrecisionSpec
    expert_loads: "np.ndarray | None" = None  # (moe layers, experts); None: uniform
    expert_load_label: str = "uniform (no profile given)"

    def precision_notes(self, accel: Accelerator, precisions: Precisions) -> tuple[str, ...]:
        """What the plan states about these formats on `accel` (a compute fall-back), when they are
        the ones this model's precisions resolve to there (else nothing)."""
        try:
            resolved, notes = resolve_precisions(self.precisions, self.arch, accel)
        except PlannerInputError:
            return ()
        return notes if resolved == precisions else ()


@dataclass(frozen=True)
class PrefixCacheRequest:
    hit_rate: float
    prefix_tokens: int
    retention_s: float
    tier: str  # a tier id, or CacheTier.AUTO

    @property
    def any_tier(self) -> bool:
        """The solver picks the tier (or none): the request names no tier."""
        return self.tier == CacheTier.AUTO

    def allows(self, tier_id: str) -> bool:
        return self.any_tier or self.tier == tier_id


@dataclass(frozen=True)
class SpeculativeRequest:
    """A workload's speculative decoding, resolved against its model: the draft tokens to use (None:
    the solver picks among `options`) and the acceptance of this workload's data."""

    draft_tokens: int | None
    max_draft_tokens: int
    acceptance_rates: tuple[float, ...]
    accepted_tokens: float | None
    source: str

    @property
    def options(self) -> tuple[int, ...]:
        """Draft tokens a candidate may use: the fixed number, or 0 up to the most the rates cover."""
        if self.draft_tokens is not None:
            return (self.draft_tokens,)
        return tuple(range(min(self.max_draft_tokens, len(self.acceptance_rates)) + 1))

    def for_role(self, role: ServingRole) -> list[Speculation | None]:
        """The speculative decoding of each candidate in `role`: one per option (a prefill replica: one)."""
        return [self.speculation(0, role)] if role is ServingRole.PREFILL else [self.speculation(k, role) for k in self.options]

    def speculation(self, draft_tokens: int, role: ServingRole) -> Speculation | None:
        """A replica's speculative decoding at `draft_tokens` (None: off). A prefill replica loads the
        draft module and runs it over the prompts whenever its decode side may speculate."""
        if role is ServingRole.PREFILL:
            return Speculation(0, source=self.source) if max(self.options) > 0 else None
        if draft_tokens == 0:
            return None
        return Speculation(draft_tokens, self.acceptance_rates, self.accepted_tokens, self.source)


@dataclass(frozen=True)
class ResolvedWorkload:
    name: str
    model_key: str
    input_tokens: int
    output_tokens: int
    output_tokens_per_s: float | None  # demand; None = minimise cost per token
    ttft_limit_s: float | None
    tpot_limit_s: float | None
    serving: ServingMode = ServingMode.AGGREGATED
    prefix_cache: "PrefixCacheRequest | None" = None
    speculative: SpeculativeRequest | None = None

    @property
    def roles(self) -> tuple[ServingRole, ...]:
        """The replica roles the solver may use for this workload."""
        aggregated, split = (ServingRole.AGGREGATED,), (ServingRole.PREFILL, ServingRole.DECODE)
        return {ServingMode.AGGREGATED: aggregated, ServingMode.DISAGGREGATED: split, ServingMode.AUTO: aggregated + split}[self.serving]


@dataclass(frozen=True)
class ResolvedProblem:
    problem: Problem
    hardware: HardwareCatalog
    models: dict[str, ResolvedModel]
    workloads: tuple[ResolvedWorkload, ...]
    rack_counts: tuple[tuple[RackType, int | None], ...]
    unavailable: dict[str, dict[int, tuple[int, ...]]] = field(default_factory=dict)  # rack id -> instance -> indices
    base_dir: str = "."  # the directory relative paths in the problem start from
    notes: tuple[str, ...] = field(default_factory=tuple)
    # expert maps of placement.previous_plan: (model id, ranks, slots per rank) -> physical-to-logical rows
    previous_expert_maps: dict[tuple[str, int, int], list[list[int]]] = field(default_factory=dict)

    def previous_expert_map(self, model_id: str, n_ranks: int, slots_per_rank: int) -> list[list[int]] | None:
        return self.previous_expert_maps.get((model_id, n_ranks, slots_per_rank))

    @property
    def name(self) -> str:
        return self.problem.name

    @property
    def serving(self) -> ServingOptions:
        """How the engine runs every replica (the solver block's overlap, token budget and step model, the engine)."""
        options = self.problem.solver
        return ServingOptions(options.overlap, options.prefill_chunk_tokens, self.problem.engine, options.step_model)

    @property
    def allow_spanning_domains(self) -> bool:
        return self.problem.cluster.allow_spanning_domains

    @property
    def objective(self) -> Objective:
        return self.problem.objective

    @property
    def cost_cap_usd_per_hour(self) -> float | None:
        return self.problem.cost_cap_usd_per_hour

    @property
    def placement(self) -> PlacementOptions:
        """The problem's placement block (expert load, redundant copies, move budget, method)."""
        return self.problem.placement

    @property
    def solver_options(self) -> SolverOptions:
        return self.problem.solver


def _expert_loads(arch: ModelArch, spec: "ExpertLoadSpec | None", base_dir: Path, field_name: str) -> tuple:
    from planner.model.expert_loads import load_profile, synthetic_profile

    if spec is None:
        return None, "uniform (no profile given)"
    if not arch.is_moe:
        raise PlannerInputError(InputIssue(f"{field_name}.expert_load", f"{arch.id} has no experts", "remove expert_load"))
    if spec.synthetic is not None:
        g = spec.synthetic
        label = f"synthetic {g.distribution}" + (f" sigma {g.sigma:g}" if g.distribution == "lognormal" else "") + f", seed {g.seed}"
        return synthetic_profile(arch, g.sigma, g.seed, g.distribution), label
    path = Path(spec.file)
    path = path if path.is_absolute() else base_dir / path
    try:
        return load_profile(path, arch), f"file {spec.file}"
    except FileNotFoundError:
        raise PlannerInputError(InputIssue(f"{field_name}.expert_load.file", f"{path} not found", "check the path (relative to the problem file)")) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise PlannerInputError(InputIssue(f"{field_name}.expert_load.file", str(exc),
                                           'write {"layers": [[load per expert, ...], ...]} with one row per MoE layer')) from None


def _resolve_model(key: str, ref, base_dir: Path, problem: "Problem", field_name: str) -> ResolvedModel:
    from planner.model.hf_config import load_hf_config

    catalog = load_model_catalog()
    default_prec = problem.precisions
    precisions = default_prec
    if isinstance(ref, str):
        ref = CatalogModelRef(catalog=ref)
    if ref.precisions is not None:
        merged = default_prec.model_dump() | {k: v for k, v in ref.precisions.model_dump().items() if v is not None}
        precisions = PrecisionSpec(**merged)
    if isinstance(ref, CatalogModelRef):
        if ref.catalog not in catalog:
            raise PlannerInputError(unknown_name_issue(field_name, "model", ref.catalog, catalog))
        arch = catalog[ref.catalog]
    elif isinstance(ref, ConfigJsonModelRef):
        path = Path(ref.config_json)
        path = path if path.is_absolute() else base_dir / path
        arch = arch_from_spec(load_hf_config(path, ref.id))
    else:
        arch = arch_from_spec(ref.inline)
    spec = ref.expert_load or (problem.placement.expert_load if arch.is_moe else None)
    loads, label = _expert_loads(arch, spec, base_dir, field_name)
    return ResolvedModel(key, arch, precisions, loads, label)


def _hardware(cluster, base_dir: Path, source: str) -> HardwareCatalog:
    """The catalog with the problem's user catalog (cluster.kernel_catalog), custom parts, prices and fractions."""
    try:
        hardware = load_hardware_catalog()
        if cluster.kernel_catalog is not None:
            path = Path(cluster.kernel_catalog)
            hardware = with_user_catalog(hardware, path if path.is_absolute() else Path(base_dir) / path, "cluster.kernel_catalog")
        return hardware.with_overrides(
            accelerators=cluster.custom_accelerators,
            racks=cluster.custom_racks,
            price_usd_per_hour=cluster.price_overrides_usd_per_hour,
            achievable=cluster.achievable_overrides,
        )
    except PlannerInputError as exc:
        raise PlannerInputError(exc.issues, source) from None


def resolve_problem(problem: Problem, base_dir: Path = Path("."), source: str = "problem") -> ResolvedProblem:
    """Check every name against the catalogs and convert to SI values; all issues are reported together."""
    issues: list[InputIssue] = []
    cluster = problem.cluster
    hardware = _hardware(cluster, base_dir, source)
    rack_counts = []
    for i, rc in enumerate(cluster.racks):
        if rc.type not in hardware.racks:
            issues.append(unknown_name_issue(f"cluster.racks[{i}].type", "rack", rc.type, hardware.racks))
        else:
            rack_counts.append((hardware.racks[rc.type], rc.count))
    unavailable = _unavailable(cluster.unavailable_accelerators, rack_counts, issues)
    refs = {"model": problem.model} if problem.model is not None else dict(problem.models)
    models: dict[str, ResolvedModel] = {}
    for key, ref in refs.items():
        field_name = "model" if problem.model is not None else f"models.{key}"
        try:
            models[key] = _resolve_model(key, ref, base_dir, problem, field_name)
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
            w.serving,
            None if w.prefix_cache is None else PrefixCacheRequest(w.prefix_cache.hit_rate, w.prefix_cache.prefix_tokens or w.input_tokens,
                                                                    w.prefix_cache.retention_minutes * SECONDS_PER_MINUTE,
                                                                    CacheTier(w.prefix_cache.tier) if w.prefix_cache.tier == CacheTier.AUTO
                                                                    else w.prefix_cache.tier),
        ))
        arch = models.get(key)
        workloads[-1] = replace(workloads[-1], speculative=_workload_speculative(w.speculative, arch, f"workloads[{i}].speculative", issues))
        if arch is not None and w.input_tokens + w.output_tokens > arch.arch.max_context_tokens:
            issues.append(InputIssue(f"workloads[{i}]", f"{w.input_tokens} + {w.output_tokens} tokens exceed {arch.arch.id}'s "
                                     f"{arch.arch.max_context_tokens}-token context", "shorten the request or pick a longer-context model"))
    previous = _previous_expert_maps(problem.placement.previous_plan, base_dir, models, issues)
    if issues:
        raise PlannerInputError(issues, source)
    return ResolvedProblem(problem, hardware, models, tuple(workloads), tuple(rack_counts), unavailable, str(Path(base_dir).resolve()),
                           previous_expert_maps=previous)


def _workload_speculative(spec: SpeculativeSpec | None, model: ResolvedModel | None, field_name: str,
                          issues: list[InputIssue]) -> "SpeculativeRequest | None":
    if spec is None or model is None:
        return None
    try:
        return resolve_speculative(spec, model.arch, field_name)
    except PlannerInputError as exc:
        issues.extend(exc.issues)
        return None


def resolve_speculative(spec: SpeculativeSpec, arch: ModelArch, field_name: str) -> SpeculativeRequest | None:
    """A workload's speculative decoding against its model: the model must ship MTP modules, and the
    acceptance (the workload's, else the model's published rates) must cover the draft tokens."""
    if spec.draft_tokens == 0:
        return None
    if arch.mtp_layers == 0:
        with_mtp = ", ".join(m.id for m in load_model_catalog().values() if m.mtp_layers)
        raise PlannerInputError(InputIssue(field_name, f"{arch.id} has no multi-token-prediction layers (config num_nextn_predict_layers 0), "
                                           "so it has no draft", f"remove speculative, or serve a model that ships MTP modules ({with_mtp})"))
    if spec.acceptance_rates is not None or spec.acceptance_length is not None:
        rates, source = tuple(spec.acceptance_rates or ()), "the workload's acceptance"
    elif arch.mtp_acceptance is not None:
        rates, source = arch.mtp_acceptance.rates, arch.mtp_acceptance.source
    else:
        raise PlannerInputError(InputIssue(f"{field_name}.acceptance_rates", f"no published acceptance for {arch.id}'s MTP modules",
                                           "give the acceptance measured on your data (acceptance_rates per position)"))
    fixed = spec.draft_tokens if isinstance(spec.draft_tokens, int) else None
    if fixed is not None and spec.acceptance_length is None and fixed > len(rates):
        raise PlannerInputError(InputIssue(f"{field_name}.draft_tokens", f"{fixed} draft tokens, but the acceptance covers "
                                           f"{len(rates)} position(s) ({source})",
                                           f"lower draft_tokens to {len(rates)}, or give acceptance_rates for {fixed} positions"))
    return SpeculativeRequest(fixed, spec.max_draft_tokens, rates, spec.acceptance_length, source)


def _previous_expert_maps(path_text: str | None, base_dir: Path, models: dict[str, ResolvedModel],
                          issues: list[InputIssue]) -> dict[tuple[str, int, int], list[list[int]]]:
    """Expert maps of the plan in service (placement.previous_plan), keyed by (model id, ranks, slots per rank)."""
    if path_text is None:
        return {}
    path = Path(path_text)
    return previous_expert_maps(path if path.is_absolute() else base_dir / path, {m.arch.id: m.arch for m in models.values()}, issues)


def _unavailable(names: list[str], counts: list[tuple[RackType, int | None]], issues: list[InputIssue]) -> dict[str, dict[int, tuple[int, ...]]]:
    """Parse accelerator names `<rack-id>#<instance>/<index>` against the fleet."""
    racks = {rack.id: (rack, count) for rack, count in counts}
    out: dict[str, dict[int, set[int]]] = {}
    for i, name in enumerate(names):
        field_name = f"cluster.unavailable_accelerators[{i}]"
        rack_id, _, rest = name.partition("#")
        instance, _, index = rest.partition("/")
        if rack_id not in racks:
            issues.append(unknown_name_issue(field_name, "rack in the fleet", rack_id, racks))
            continue
        rack, count = racks[rack_id]
        if not (instance.isdigit() and index.isdigit()):
            issues.append(InputIssue(field_name, f"'{name}' is not an accelerator name", f"write <rack>#<instance>/<index>, e.g. {rack_id}#0/3"))
            continue
        if count is None or int(instance) >= count or int(index) >= rack.n_accelerators:
            issues.append(InputIssue(field_name, f"'{name}' is outside the fleet ({count or 'no'} x {rack_id}, "
                                                 f"{rack.n_accelerators} accelerators each)",
                                     f"use instances 0..{(count or 1) - 1} and indices 0..{rack.n_accelerators - 1}"))
            continue
        out.setdefault(rack_id, {}).setdefault(int(instance), set()).add(int(index))
    return {r: {k: tuple(sorted(v)) for k, v in sorted(inst.items())} for r, inst in out.items()}
