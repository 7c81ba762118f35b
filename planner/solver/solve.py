"""Solve a deployment problem: candidates from the roofline, choices by CP-SAT.

Step 1 enumerates and prunes candidates for every workload on every rack type of the fleet.
Step 2 builds the CP-SAT model and minimises the primary objective.
Step 3 re-solves with the primary objective held at its value and a canonical tie-break, on one
worker, so that the same input, seed and worker count always give the same plan.
Step 4 turns the chosen candidates into deployments with full estimates, and explains the plan,
or, when nothing is feasible, explains why.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from planner.solver.candidates import (
    Candidate,
    CandidateSettings,
    RackAnalysis,
    analyse_rack,
    pair_ttft_s,
    pareto_prune,
)
from planner.physics.deployment import ServingRole
from planner.physics.estimate import DeploymentInputs, Estimate, estimate
from planner.placement.experts import ExpertPlacement, place_experts, synthetic_profile
from planner.physics.kv_cache import cache_use
from planner.solver.model_builder import (
    PlanningData,
    PlanVars,
    RackPool,
    build_model,
    primary_objective,
    tie_break_objective,
)
from planner.problem.spec import Objective, ResolvedModel, ResolvedProblem

__all__ = ["Deployment", "SolveResult", "SolverStats", "expert_imbalance_functions", "hint_plan", "prepare", "set_parameters", "solve", "solve_data"]

SEARCH_SHARE = 0.85  # of the time limit for the two search phases; the canonical tie-break gets the rest
SINGLE_WORKER_SHARE = 0.4  # of the search time for the single-worker first phase
SINGLE_WORKER_MIN_S = 1.0
DETERMINISTIC_SHARE = 0.8  # deterministic-time budget per second of wall-clock budget (dtime runs ~1.2x wall here)
INTERLEAVE_BATCH_SIZE = 12
SINGLE_WORKER_LINEARIZATION = 2
TIE_BREAK_TIME_LIMIT_S = 5.0  # fixed, so that multi-worker runs do not depend on the worker count (cpsat.md section 7)
STATUS_NAMES = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE", cp_model.INFEASIBLE: "INFEASIBLE",
                cp_model.UNKNOWN: "UNKNOWN", cp_model.MODEL_INVALID: "MODEL_INVALID"}


@dataclass(frozen=True)
class SolverStats:
    status: str
    objective: float | None  # in objective_unit
    best_bound: float | None
    gap: float | None  # |objective - bound| / |objective|
    wall_time_s: float  # CP-SAT solves only
    total_time_s: float  # candidates + model + solves
    objective_unit: str
    time_limit_s: float
    seed: int
    workers: int
    n_candidates: int
    n_variables: int
    n_constraints: int


@dataclass(frozen=True)
class Deployment:
    candidate: Candidate
    replicas: int
    estimate: Estimate
    experts: ExpertPlacement | None = None

    @property
    def accelerators(self) -> int:
        return self.replicas * self.candidate.accelerators

    @property
    def usd_per_hour(self) -> float:
        return self.replicas * self.candidate.usd_per_hour

    @property
    def output_tokens_per_s(self) -> float:
        return self.replicas * self.candidate.output_tokens_per_s


@dataclass
class SolveResult:
    problem: ResolvedProblem
    status: str
    stats: SolverStats
    deployments: list[Deployment]
    data: PlanningData
    analyses: dict[tuple[str, str], RackAnalysis]
    explanation: object | None = None  # explain.PlanExplanation
    infeasibility: object | None = None  # infeasibility.InfeasibilityReport
    placement: object | None = None  # placement.FleetPlacement
    notes: list[str] = field(default_factory=list)

    @property
    def has_plan(self) -> bool:
        return self.status in ("OPTIMAL", "FEASIBLE") and bool(self.deployments)

    @property
    def usd_per_hour(self) -> float:
        return sum(d.usd_per_hour for d in self.deployments)

    @property
    def accelerators(self) -> int:
        return sum(d.accelerators for d in self.deployments)

    def of_workload(self, workload: str, role: ServingRole | None = None) -> list[Deployment]:
        return [d for d in self.deployments if d.candidate.workload == workload and (role is None or d.candidate.role is role)]

    def is_split(self, workload: str) -> bool:
        """Served by prefill and decode pools."""
        return any(d.candidate.role is not ServingRole.AGGREGATED for d in self.of_workload(workload))

    def workload_ttft_s(self, workload: str) -> float:
        """Worst TTFT a request of `workload` sees: over aggregated replicas, or over every
        prefill-decode pair the plan may route it through."""
        if self.is_split(workload):
            return max(pair_ttft_s(p.candidate, q.candidate) for p in self.of_workload(workload, ServingRole.PREFILL)
                       for q in self.of_workload(workload, ServingRole.DECODE))
        return max(d.estimate.ttft_s for d in self.of_workload(workload))

    def workload_tpot_s(self, workload: str) -> float:
        return max(d.estimate.tpot_s for d in self.of_workload(workload) if d.candidate.role is not ServingRole.PREFILL)

    def workload_usd_per_million_output_tokens(self, workload: str) -> float:
        """The plan's cost per output token for `workload`: its deployments' cost over the tokens they
        make (with a demand), or the per-token cost of its one replica or replica pair."""
        mine = self.of_workload(workload)
        if self.data.demand_tokens_per_s.get(workload) is None:
            return sum(d.candidate.usd_per_million_output_tokens for d in mine)
        return sum(d.usd_per_hour for d in mine) / 3600.0 / self.served_output_tokens_per_s(workload) * 1e6

    def served_output_tokens_per_s(self, workload: str) -> float:
        """Output tokens per second the plan makes for `workload` (aggregated and decode replicas)."""
        return sum(d.output_tokens_per_s for d in self.deployments
                   if d.candidate.workload == workload and d.candidate.role is not ServingRole.PREFILL)


def set_parameters(solver: cp_model.CpSolver, *, time_limit_s: float, seed: int, workers: int, relative_gap_limit: float = 0.0) -> None:
    """Every parameter set explicitly. The search stops on deterministic time (a count of work,
    reproducible), set below the wall-clock limit so that it normally stops first; multi-worker
    runs interleave subsolvers in fixed batches. A given seed and worker count then reproduce the
    same search, unless a much slower machine reaches the wall-clock limit first."""
    p = solver.parameters
    p.num_workers = workers
    p.random_seed = seed
    p.max_deterministic_time = DETERMINISTIC_SHARE * time_limit_s
    p.max_time_in_seconds = time_limit_s
    p.relative_gap_limit = relative_gap_limit
    p.presolve_inclusion_work_limit = 0  # or-tools#5293: wrong optimum with large enforced Boolean sums
    if workers == 1:
        # The single LP worker with the full linear relaxation and cuts closes the covering and
        # packing gap at the root: the bundled mixed fleet takes 11 conflicts instead of 77k.
        p.linearization_level = SINGLE_WORKER_LINEARIZATION
    else:
        p.interleave_search = True
        p.interleave_batch_size = INTERLEAVE_BATCH_SIZE


def prepare(resolved: ResolvedProblem, *, keep_batch_ladder: bool | None = None,
            progress: Callable[[str], None] | None = None,
            imbalance: dict[str, Callable[[int], float]] | None = None) -> tuple[PlanningData, dict[tuple[str, str], RackAnalysis]]:
    """Step 1: candidates for every workload on every rack type, pruned, in canonical order.
    `imbalance` (model key -> expert imbalance by EP width) reuses the expert placements of an
    earlier call on the same models (sweeps)."""
    problem = resolved.problem
    ladder = problem.objective is Objective.MIN_TPOT if keep_batch_ladder is None else keep_batch_ladder
    settings = CandidateSettings(problem.solver.overlap, problem.solver.prefill_chunk_tokens, problem.solver.max_batch_per_replica,
                                 problem.cluster.allow_spanning_domains, ladder, problem.placement.redundant_experts_per_rank)
    imbalance = imbalance if imbalance is not None else expert_imbalance_functions(resolved)
    analyses: dict[tuple[str, str], RackAnalysis] = {}
    shared: dict[tuple, RackAnalysis] = {}
    candidates: list[Candidate] = []
    for w in resolved.workloads:
        model = resolved.models[w.model_key]
        for rack, count in resolved.rack_counts:
            if progress:
                progress(f"{w.name} on {rack.id}")
            max_accelerators = None if count is None else count * rack.n_accelerators
            key = (w.model_key, rack.id, max_accelerators, w.input_tokens, w.output_tokens, w.tpot_limit_s, w.ttft_limit_s)
            if key not in shared:
                shared[key] = analyse_rack(model.arch, model.precisions, rack, w, resolved.hardware.overheads, settings, max_accelerators,
                                           imbalance[w.model_key])
            base = shared[key]
            analysis = RackAnalysis(**{**base.__dict__, "workload": w.name,
                                       "candidates": [_for_workload(c, w.name) for c in base.candidates]})
            analyses[(w.name, rack.id)] = analysis
            candidates.extend(pareto_prune(analysis.candidates, use_latency=ladder))
    candidates.sort(key=lambda c: (c.workload, c.sort_key()))
    pools = {rack.id: RackPool(rack.id, rack.n_accelerators, count, tuple(resolved.unavailable.get(rack.id, {}).values()))
             for rack, count in resolved.rack_counts}
    data = PlanningData(
        candidates=tuple(candidates),
        workloads=tuple(w.name for w in resolved.workloads),
        demand_tokens_per_s={w.name: w.output_tokens_per_s for w in resolved.workloads},
        pools=pools,
        objective=problem.objective,
        cost_cap_usd_per_hour=problem.cost_cap_usd_per_hour,
        max_replicas=problem.solver.max_replicas,
        ttft_limit_s={w.name: w.ttft_limit_s for w in resolved.workloads},
    )
    return data, analyses


def expert_imbalance_functions(resolved: ResolvedProblem) -> dict[str, Callable[[int], float]]:
    """Model key -> (EP width -> expert imbalance), each cached."""
    return {key: _imbalance_function(resolved, model) for key, model in resolved.models.items()}


def _imbalance_function(resolved: ResolvedProblem, model: ResolvedModel) -> Callable[[int], float]:
    """ep -> the expert imbalance a greedy + swap placement of the model's load profile reaches
    (within the move budget from the previous plan's map, when there is one for that width)."""
    options = resolved.problem.placement
    if model.expert_loads is None and options.max_expert_moves_per_layer is None:
        return lambda ep: 1.0
    loads = model.expert_loads if model.expert_loads is not None else synthetic_profile(model.arch, distribution="uniform")
    redundant = options.redundant_experts_per_rank
    cache: dict[int, float] = {}

    def imbalance(ep: int) -> float:
        if ep not in cache:
            previous = resolved.previous_expert_map(model.arch.id, ep, model.arch.moe.n_routed_experts // ep + redundant)
            budget = options.max_expert_moves_per_layer if previous is not None else None
            cache[ep] = place_experts(model.arch, loads, ep, redundant, method="greedy", previous=previous if budget is not None else None,
                                      max_moves_per_layer=budget).imbalance
        return cache[ep]

    return imbalance


def _for_workload(c: Candidate, workload: str) -> Candidate:
    from dataclasses import replace

    return c if c.workload == workload else replace(c, workload=workload)


@dataclass(frozen=True)
class RawSolution:
    status: str
    chosen: dict[int, int]  # candidate index -> replicas
    objective_int: int | None  # the objective in the model's integer units
    objective: float | None
    best_bound: float | None
    gap: float | None
    wall_time_s: float
    unit: str
    n_variables: int
    n_constraints: int


def _fix_families(model: cp_model.CpModel, v: PlanVars) -> None:
    for literal in v.families.values():
        model.add(literal == 1)


def _hint(model: cp_model.CpModel, v: PlanVars, solver: cp_model.CpSolver) -> None:
    """Hint every decision variable (an incomplete hint is ignored, cpsat.md section 5)."""
    model.clear_hints()
    modes = [m for m in v.split.values() if not isinstance(m, int)]
    for var in [*v.replicas, *v.used, *v.workload_tpot.values(), *modes]:
        model.add_hint(var, solver.value(var))


def hint_plan(model: cp_model.CpModel, v: PlanVars, chosen: dict[int, int]) -> None:
    """A complete hint from a plan (candidate index -> replicas): every replica count, used flag and
    family literal; TPOT variables, when the objective has them, at the plan's values."""
    model.clear_hints()
    for j, var in enumerate(v.replicas):
        model.add_hint(var, chosen.get(j, 0))
        model.add_hint(v.used[j], 1 if chosen.get(j, 0) > 0 else 0)
    for literal in v.families.values():
        model.add_hint(literal, 1)
    for var in v.workload_tpot.values():
        model.add_hint(var, 0)  # only MIN_TPOT models have these; sweeps use cost objectives
    for w, mode in v.split.items():
        if not isinstance(mode, int):
            split = any(data_role is not ServingRole.AGGREGATED for j, data_role in v.roles.items() if chosen.get(j) and v.workload_of[j] == w)
            model.add_hint(mode, int(split))


def _minimise(model: cp_model.CpModel, v: PlanVars, *, time_limit_s: float, seed: int, workers: int,
              relative_gap_limit: float, callback: cp_model.CpSolverSolutionCallback | None) -> tuple[cp_model.CpSolver, int, float]:
    """Deterministic search: one worker with the full linear relaxation first (it proves most of
    these models optimal in milliseconds and closes the gap fastest on large fleets); if it has not
    finished, the requested workers continue from its best plan (hinted)."""
    first = cp_model.CpSolver()
    budget = time_limit_s if workers == 1 else min(time_limit_s, max(SINGLE_WORKER_MIN_S, SINGLE_WORKER_SHARE * time_limit_s))
    set_parameters(first, time_limit_s=budget, seed=seed, workers=1, relative_gap_limit=relative_gap_limit)
    status = first.solve(model, callback) if callback else first.solve(model)
    if status in (cp_model.OPTIMAL, cp_model.INFEASIBLE, cp_model.MODEL_INVALID) or budget >= time_limit_s:
        return first, status, first.wall_time
    if status == cp_model.FEASIBLE:
        _hint(model, v, first)
    second = cp_model.CpSolver()
    set_parameters(second, time_limit_s=time_limit_s - budget, seed=seed, workers=workers, relative_gap_limit=relative_gap_limit)
    status_two = second.solve(model, callback) if callback else second.solve(model)
    wall = first.wall_time + second.wall_time
    if status_two in (cp_model.OPTIMAL, cp_model.INFEASIBLE) or (
            status_two == cp_model.FEASIBLE and (status != cp_model.FEASIBLE or second.objective_value <= first.objective_value)):
        return second, status_two, wall
    return first, status, wall


def solve_data(data: PlanningData, *, time_limit_s: float = 10.0, seed: int = 0, workers: int = 2, canonical: bool = True,
               relative_gap_limit: float = 0.0, callback: cp_model.CpSolverSolutionCallback | None = None,
               hint: dict[int, int] | None = None) -> RawSolution:
    """Steps 2 and 3 on prepared data: the best plan, its objective, bound and gap. `hint` (candidate
    index -> replicas) warm-starts the search, e.g. from the previous point of a sweep."""
    model, v = build_model(data)
    _fix_families(model, v)
    objective, resolution, unit = primary_objective(model, v, data)
    model.minimize(objective)
    if hint is not None and data.objective is not Objective.MIN_TPOT:
        hint_plan(model, v, hint)
    solver, status, wall = _minimise(model, v, time_limit_s=SEARCH_SHARE * time_limit_s, seed=seed, workers=workers,
                                     relative_gap_limit=relative_gap_limit, callback=callback)
    name = STATUS_NAMES.get(status, "UNKNOWN")
    n_vars, n_cons = len(model.proto.variables), len(model.proto.constraints)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return RawSolution(name, {}, None, None, None, None, wall, unit, n_vars, n_cons)
    value = round(solver.objective_value)
    bound = solver.best_objective_bound
    if name == "OPTIMAL" and value > math.ceil(bound - 1e-6):
        name = "FEASIBLE"  # CP-SAT says OPTIMAL when the gap limit stops it; only a closed gap is optimal
    chosen = v.extract(solver)
    if canonical:
        chosen, extra = _canonical(model, v, data, objective, value, seed, solver, time_limit_s)
        wall += extra
    objective_real, bound_real = value * resolution, bound * resolution
    gap = abs(objective_real - bound_real) / abs(objective_real) if objective_real else 0.0
    return RawSolution(name, chosen, value, objective_real, bound_real, gap, wall, unit, n_vars, n_cons)


def _canonical(model: cp_model.CpModel, v: PlanVars, data: PlanningData, objective, value: int, seed: int,
               incumbent: cp_model.CpSolver, time_limit_s: float) -> tuple[dict[int, int], float]:
    """Hold the objective at its value and pick the canonical plan among the equally good ones.
    The search starts from the plan found (a complete hint); if it cannot finish in its budget it
    returns the best canonical plan it reached, which is never worse than that plan."""
    _hint(model, v, incumbent)
    model.add(objective <= value)
    model.minimize(tie_break_objective(v, data))
    solver = cp_model.CpSolver()
    set_parameters(solver, time_limit_s=min((1 - SEARCH_SHARE) * time_limit_s, TIE_BREAK_TIME_LIMIT_S), seed=seed, workers=1)
    status = solver.solve(model)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return v.extract(solver), solver.wall_time
    return v.extract(incumbent), solver.wall_time


def _expert_placement(resolved: ResolvedProblem, model: ResolvedModel, c: Candidate, options) -> ExpertPlacement | None:
    """The final placement of a deployment's experts on its expert-parallel ranks."""
    if not model.arch.is_moe or c.layout.ep == 1:
        return None
    loads = model.expert_loads if model.expert_loads is not None else synthetic_profile(model.arch, distribution="uniform")
    slots = model.arch.moe.n_routed_experts // c.layout.ep + options.redundant_experts_per_rank
    previous = resolved.previous_expert_map(model.arch.id, c.layout.ep, slots)
    return place_experts(model.arch, loads, c.layout.ep, options.redundant_experts_per_rank, method=options.method,
                         time_limit_s=options.time_limit_s, profile=model.expert_load_label, previous=previous,
                         max_moves_per_layer=options.max_expert_moves_per_layer if previous is not None else None)


def _deployments(resolved: ResolvedProblem, data: PlanningData, chosen: dict[int, int]) -> list[Deployment]:
    problem = resolved.problem
    deployments = []
    for j, replicas in sorted(chosen.items(), key=lambda item: (data.candidates[item[0]].workload, data.candidates[item[0]].sort_key())):
        c = data.candidates[j]
        model = resolved.models[c.model_key]
        workload = next(w for w in resolved.workloads if w.name == c.workload)
        experts = _expert_placement(resolved, model, c, problem.placement)
        inputs = DeploymentInputs(model.arch, resolved.hardware.racks[c.rack_id], c.layout, c.batch, workload.input_tokens,
                                  workload.output_tokens, c.precisions, resolved.hardware.overheads, problem.solver.overlap,
                                  problem.solver.prefill_chunk_tokens, c.notes,
                                  experts.imbalance if experts else 1.0,
                                  problem.placement.redundant_experts_per_rank if experts else 0, c.role,
                                  cache_use(workload.prefix_cache, c.kv_tier, resolved.hardware.racks[c.rack_id].accelerator))
        deployments.append(Deployment(c, replicas, estimate(inputs), experts))
    return deployments


def solve(resolved: ResolvedProblem, *, time_limit_s: float | None = None, seed: int | None = None, workers: int | None = None,
          explain: bool = True, progress: Callable[[str], None] | None = None) -> SolveResult:
    """Solve `resolved`; options default to the problem's solver block."""
    options = resolved.problem.solver
    time_limit_s = options.time_limit_s if time_limit_s is None else time_limit_s
    seed = options.seed if seed is None else seed
    workers = options.workers if workers is None else workers
    start = time.perf_counter()
    data, analyses = prepare(resolved, progress=progress)
    raw = solve_data(data, time_limit_s=time_limit_s, seed=seed, workers=workers,
                     relative_gap_limit=options.relative_gap_limit) if data.candidates else \
        RawSolution("INFEASIBLE", {}, None, None, None, None, 0.0, "", 0, 0)
    deployments = _deployments(resolved, data, raw.chosen)
    stats = SolverStats(raw.status, raw.objective, raw.best_bound, raw.gap, raw.wall_time_s, time.perf_counter() - start,
                        raw.unit, time_limit_s, seed, workers, len(data.candidates), raw.n_variables, raw.n_constraints)
    result = SolveResult(resolved, raw.status, stats, deployments, data, analyses)
    if result.has_plan:
        from planner.placement.fleet import PlacementFailed, place_plan

        try:
            result.placement = place_plan(result)
        except PlacementFailed as exc:  # the model's packing constraints make this unreachable
            result.notes.append(f"placement failed: {exc}")
    if explain:
        if result.has_plan:
            from planner.solver.explain import explain_plan

            result.explanation = explain_plan(result, time_limit_s=time_limit_s, seed=seed, workers=workers)
        else:
            from planner.solver.infeasibility import explain_infeasibility

            result.infeasibility = explain_infeasibility(result)
    return result
