"""Solve a deployment problem: candidates from the roofline, choices by CP-SAT.

Step 1 enumerates and prunes candidates for every workload on every rack type of the fleet.
Step 2 builds the CP-SAT model and minimises the primary objective.
Step 3 re-solves with the primary objective held at its value and a canonical tie-break, on one
worker, so that the same input, seed and worker count always give the same plan.
Step 4 turns the chosen candidates into deployments with full estimates, and explains the plan,
or, when nothing is feasible, explains why.
"""

import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from planner.model.expert_loads import synthetic_profile
from planner.modes import ExpertMethod, SolveStatus
from planner.physics.estimate import estimate
from planner.placement.experts import (
    ExpertPlacement,
    node_grouping,
    place_experts,
    slots_per_rank_for,
)
from planner.placement.fleet import PlacementFailed, place_plan
from planner.placement.groups import expert_groups_local, ranks_per_domain
from planner.problem.resolve import ResolvedModel, ResolvedProblem
from planner.problem.schema import Objective
from planner.solver.candidates import (
    Candidate,
    CandidateSettings,
    RackAnalysis,
    analyse_rack,
)
from planner.solver.explain import explain_plan
from planner.solver.infeasibility import explain_infeasibility
from planner.solver.latency_batches import LatencyLadder, solve_refined
from planner.solver.model_builder import PlanningData, RackPool
from planner.solver.result import Deployment, SolveResult, SolverStats
from planner.solver.search import RawSolution, solve_data
from planner.solver.selection import problem_candidates, roomy_or_all

__all__ = ["Deployment", "SolveResult", "SolverStats", "expert_imbalance_functions", "prepare", "solve"]

# Enumeration runs in forked worker processes when the solve has several workers and at least this
# many (workload, rack type) analyses to share out (below it, starting processes costs more than it
# saves: a bundled problem enumerates in well under a second).
PARALLEL_MIN_ANALYSES = 16
# Workloads of one model and lengths on one rack type (they differ only in their limits) are analysed
# together, sharing their batch tables (shared_tables); False analyses each alone, to the same candidates.
SHARE_TABLES = True
_FORKED: tuple | None = None  # what forked enumeration workers read: (resolved, settings, imbalance, batches)


def _routing(model: ResolvedModel) -> str | None:
    """With an expert-load profile the placement measures the imbalance, so the expert kernels run at
    balanced routing; without one, at the model's routing skew."""
    return "balanced" if model.expert_loads is not None else None


def _together(jobs: list) -> list[list]:
    """The jobs ((key, workload, rack, max accelerators)) analysed together: those of one model, rack
    type and lengths."""
    if not SHARE_TABLES:
        return [[job] for job in jobs]
    groups: dict[tuple, list] = {}
    for job in jobs:
        w, rack, max_accelerators = job[1:]
        groups.setdefault((w.model_key, rack.id, max_accelerators, w.input_tokens, w.output_tokens), []).append(job)
    return list(groups.values())


def _analyse_together(resolved: ResolvedProblem, settings: CandidateSettings, imbalance, jobs: list) -> list[tuple[tuple, RackAnalysis]]:
    """The analyses of jobs of one model, rack type and lengths, keyed as the jobs are."""
    _, w, rack, max_accelerators = jobs[0]
    model = resolved.models[w.model_key]
    analyses = analyse_rack(model.arch, model.precisions, rack, [job[1] for job in jobs], resolved.hardware.overheads, settings,
                            max_accelerators, imbalance[w.model_key], _routing(model))
    return [(job[0], analysis) for job, analysis in zip(jobs, analyses, strict=True)]


def _analyse_forked(index: int) -> list[tuple[tuple, RackAnalysis]]:
    """One task of a forked worker: the jobs of one model, rack type and lengths."""
    resolved, settings, imbalance, batches = _FORKED
    return _analyse_together(resolved, settings, imbalance, batches[index])


def _expected_cost(resolved: ResolvedProblem, jobs: list) -> int:
    """A rough rank of the work in `jobs`: layouts grow with the scale-up domain, MoE models have more."""
    _, w, rack, _ = jobs[0]
    return len(jobs) * rack.n_accelerators * (2 if resolved.models[w.model_key].arch.is_moe else 1)


def _analyses_in_parallel(resolved: ResolvedProblem, settings: CandidateSettings, imbalance, batches: list[list], workers: int) -> dict:
    """The distinct analyses of `batches` (jobs analysed together) over forked processes, each batch
    one task, the largest expected first so that the last tasks are short; the same dict a serial
    run fills."""
    global _FORKED
    ordered = sorted(batches, key=lambda jobs: _expected_cost(resolved, jobs), reverse=True)
    _FORKED = (resolved, settings, imbalance, ordered)
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork")) as pool:
            return dict(pair for part in pool.map(_analyse_forked, range(len(ordered))) for pair in part)
    finally:
        _FORKED = None


def _analysis_key(w, rack, max_accelerators: int | None) -> tuple:
    """What a workload's analysis on a rack type depends on: workloads equal in all of it share one."""
    return (w.model_key, rack.id, max_accelerators, w.input_tokens, w.output_tokens, w.tpot_limit_s, w.ttft_limit_s, w.serving,
            w.prefix_cache, w.speculative)


def _distinct_analyses(resolved: ResolvedProblem, settings: CandidateSettings, imbalance, workers: int,
                       progress: Callable[[str], None] | None) -> dict[tuple, RackAnalysis]:
    """Every distinct (model, rack, fleet size, lengths, limits) analysis, serially or over processes."""
    jobs, seen = [], set()
    for w in resolved.workloads:
        for rack, count in resolved.rack_counts:
            max_accelerators = None if count is None else count * rack.n_accelerators
            key = _analysis_key(w, rack, max_accelerators)
            if key not in seen:
                seen.add(key)
                jobs.append((key, w, rack, max_accelerators))
    batches = _together(jobs)
    if workers > 1 and len(jobs) >= PARALLEL_MIN_ANALYSES and "fork" in multiprocessing.get_all_start_methods():
        if progress:
            progress(f"{len(jobs)} analyses over {workers} processes")
        return _analyses_in_parallel(resolved, settings, imbalance, batches, workers)
    shared = {}
    for together in batches:
        if progress:
            progress(f"{', '.join(job[1].name for job in together)} on {together[0][2].id}")
        shared.update(_analyse_together(resolved, settings, imbalance, together))
    return shared


def prepare(resolved: ResolvedProblem, *, keep_batch_ladder: bool | None = None,
            progress: Callable[[str], None] | None = None,
            imbalance: dict[str, Callable[..., tuple[float, bool]]] | None = None, workers: int = 1,
            every_batch: bool = False) -> tuple[PlanningData, dict[tuple[str, str], RackAnalysis]]:
    """Step 1: candidates for every workload on every rack type, pruned, in canonical order.
    `imbalance` (model key -> expert imbalance and group locality by EP width) reuses the expert
    placements of an earlier call on the same models (sweeps). `workers` > 1 spreads a large enumeration over forked
    processes; the candidates are the same as a serial run's. `every_batch`: instead, a candidate at
    every feasible batch of every layout, unpruned (what the exhaustive reference searches)."""
    options = resolved.solver_options
    latency = resolved.objective is Objective.MIN_TPOT if keep_batch_ladder is None else keep_batch_ladder
    settings = CandidateSettings(resolved.serving, options.max_batch_per_replica, resolved.allow_spanning_domains, latency,
                                 resolved.placement.redundant_experts_per_rank, options.confidence, every_batch)
    imbalance = imbalance if imbalance is not None else expert_imbalance_functions(resolved)
    shared = _distinct_analyses(resolved, settings, imbalance, workers, progress)
    analyses: dict[tuple[str, str], RackAnalysis] = {}
    pools = {rack.id: RackPool(rack.id, rack.n_accelerators, count, tuple(resolved.unavailable.get(rack.id, {}).values()))
             for rack, count in resolved.rack_counts}
    for w in resolved.workloads:
        for rack, count in resolved.rack_counts:
            max_accelerators = None if count is None else count * rack.n_accelerators
            base = shared[_analysis_key(w, rack, max_accelerators)]
            analyses[(w.name, rack.id)] = RackAnalysis(**{**base.__dict__, "workload": w.name,
                                                          "candidates": [_for_workload(c, w.name) for c in base.candidates]})
    ladder = LatencyLadder() if latency and not every_batch else None
    select = lambda roomy=False: problem_candidates(resolved, analyses, pools, ladder, every_batch, roomy)
    data = PlanningData(
        candidates=select() if every_batch else roomy_or_all(resolved, pools, select),
        workloads=tuple(w.name for w in resolved.workloads),
        demand_tokens_per_s={w.name: w.output_tokens_per_s for w in resolved.workloads},
        pools=pools,
        objective=resolved.objective,
        cost_cap_usd_per_hour=resolved.cost_cap_usd_per_hour,
        max_replicas=options.max_replicas,
        ttft_limit_s={w.name: w.ttft_limit_s for w in resolved.workloads},
    )
    if ladder is not None and data.has_demand:  # the batches a latency objective needs are found while solving
        ladder.rebuild = select  # (with a demand: never roomy)
        data = replace(data, ladder=ladder)
    return data, analyses


def expert_imbalance_functions(resolved: ResolvedProblem) -> dict[str, Callable[..., tuple[float, bool]]]:
    """Model key -> ((EP width, ranks per domain) -> (expert imbalance, expert groups local)), each cached."""
    return {key: _imbalance_function(resolved, model) for key, model in resolved.models.items()}


def _imbalance_function(resolved: ResolvedProblem, model: ResolvedModel) -> Callable[..., tuple[float, bool]]:
    """(ep, ranks per domain) -> the expert imbalance a greedy + swap placement of the model's load
    profile reaches (within the move budget from the previous plan's map, when there is one for that
    width), and whether that placement keeps the expert groups inside their domains (the step
    model's group-limited exchange). Without a profile or a budget: balanced, and the engines' contiguous,
    group-aligned default."""
    options = resolved.placement
    if model.expert_loads is None and options.max_expert_moves_per_layer is None:
        return lambda ep, ranks_per_node=None: (1.0, True)
    loads = model.expert_loads if model.expert_loads is not None else synthetic_profile(model.arch, distribution="uniform")
    redundant = options.redundant_experts_per_rank
    cache: dict[tuple[int, int | None], tuple[float, bool]] = {}
    placements: dict[tuple[int, int | None], ExpertPlacement] = {}  # by width and grouping: most domain sizes place alike

    def expert_load(ep: int, ranks_per_node: int | None = None) -> tuple[float, bool]:
        if (ep, ranks_per_node) not in cache:
            previous = resolved.previous_expert_map(model.arch.id, ep, model.arch.moe.n_routed_experts // ep + redundant)
            budget = options.max_expert_moves_per_layer if previous is not None else None
            previous = previous if budget is not None else None
            key = (ep, node_grouping(model.arch, loads, ep, ranks_per_node, previous))
            if key not in placements:
                placements[key] = place_experts(model.arch, loads, ep, redundant, method=ExpertMethod.GREEDY, previous=previous,
                                                max_moves_per_layer=budget, ranks_per_node=ranks_per_node)
            layers = [[list(r) for r in L.slots] for L in placements[key].layers]
            cache[(ep, ranks_per_node)] = (placements[key].imbalance, expert_groups_local(model.arch, ep, ranks_per_node or ep, layers))
        return cache[(ep, ranks_per_node)]

    expert_load.placements = placements  # the deployments' final greedy placements reuse these (_expert_placement)
    return expert_load


def _for_workload(c: Candidate, workload: str) -> Candidate:
    from dataclasses import replace

    return c if c.workload == workload else replace(c, workload=workload)


def _expert_placement(resolved: ResolvedProblem, model: ResolvedModel, c: Candidate, options,
                      known: dict | None = None, *, seed: int = 0, workers: int = 1) -> ExpertPlacement | None:
    """The final placement of a deployment's experts on its expert-parallel ranks. `known`: the greedy
    placements the enumeration made from scratch (`_imbalance_function`), by width and grouping: the
    same search on the same loads, taken as they are when this one is greedy from scratch too."""
    if not model.arch.is_moe or c.layout.ep == 1:
        return None
    loads = model.expert_loads if model.expert_loads is not None else synthetic_profile(model.arch, distribution="uniform")
    slots = slots_per_rank_for(model.arch.moe.n_routed_experts, c.layout.ep, options.redundant_experts_per_rank)
    previous = resolved.previous_expert_map(model.arch.id, c.layout.ep, slots)
    key = (c.layout.ep, node_grouping(model.arch, loads, c.layout.ep, _ranks_per_domain(c), None))
    if known and ExpertMethod(options.method) is ExpertMethod.GREEDY and previous is None and key in known:
        return replace(known[key], profile=model.expert_load_label)
    return place_experts(model.arch, loads, c.layout.ep, options.redundant_experts_per_rank, method=options.method,
                         time_limit_s=options.time_limit_s, profile=model.expert_load_label, previous=previous,
                         max_moves_per_layer=options.max_expert_moves_per_layer if previous is not None else None,
                         ranks_per_node=_ranks_per_domain(c), seed=seed, workers=workers)


def _ranks_per_domain(c: Candidate) -> int:
    return ranks_per_domain(c.inputs.rack.n_accelerators, c.layout.ep, c.layout.stage_size)


def _deployments(resolved: ResolvedProblem, data: PlanningData, chosen: dict[int, int], imbalance: dict | None = None, *,
                 seed: int = 0, workers: int = 1) -> list[Deployment]:
    deployments = []
    for j, replicas in sorted(chosen.items(), key=lambda item: (data.candidates[item[0]].workload, data.candidates[item[0]].sort_key())):
        c = data.candidates[j]
        model = resolved.models[c.model_key]
        experts = _expert_placement(resolved, model, c, resolved.placement, getattr((imbalance or {}).get(c.model_key), "placements", None),
                                    seed=seed, workers=workers)
        # the deployment the enumeration evaluated, with the expert load its placement measured
        inputs = replace(c.inputs, expert_imbalance=experts.imbalance if experts else 1.0,
                         expert_groups_local=expert_groups_local(model.arch, c.layout.ep, _ranks_per_domain(c),
                                                                 [[list(r) for r in L.slots] for L in experts.layers]) if experts else True,
                         redundant_experts_per_rank=experts.slots_per_rank - model.arch.moe.n_routed_experts // c.layout.ep if experts else 0)
        deployments.append(Deployment(c, replicas, estimate(inputs), experts))
    return deployments


def solve(resolved: ResolvedProblem, *, time_limit_s: float | None = None, seed: int | None = None, workers: int | None = None,
          explain: bool = True, progress: Callable[[str], None] | None = None) -> SolveResult:
    """Solve `resolved`; options default to the problem's solver block."""
    options = resolved.solver_options
    time_limit_s = options.time_limit_s if time_limit_s is None else time_limit_s
    seed = options.seed if seed is None else seed
    workers = options.workers if workers is None else workers
    start = time.perf_counter()
    imbalance = expert_imbalance_functions(resolved)
    data, analyses = prepare(resolved, progress=progress, imbalance=imbalance, workers=workers)
    run = lambda d, canonical=True: solve_data(d, time_limit_s=time_limit_s, seed=seed, workers=workers,
                                               relative_gap_limit=options.relative_gap_limit, canonical=canonical)
    if not data.candidates:
        raw = RawSolution(SolveStatus.INFEASIBLE, {}, None, None, None, None, 0.0, "", 0, 0)
    elif data.ladder is not None:
        data, raw = solve_refined(data, run)
    else:
        raw = run(data)
    deployments = _deployments(resolved, data, raw.chosen, imbalance, seed=seed, workers=workers)
    stats = SolverStats(raw.status, raw.objective, raw.best_bound, raw.gap, raw.wall_time_s, time.perf_counter() - start,
                        raw.unit, time_limit_s, seed, workers, len(data.candidates), raw.n_variables, raw.n_constraints)
    result = SolveResult(resolved, raw.status, stats, tuple(deployments), data, analyses)
    if result.has_plan:
        try:
            result = replace(result, placement=place_plan(resolved.rack_counts, resolved.unavailable, [d.placed() for d in deployments]))
        except PlacementFailed as exc:  # the model's packing constraints make this unreachable
            result = replace(result, notes=(*result.notes, f"placement failed: {exc}"))
    if explain and result.has_plan:
        result = replace(result, explanation=explain_plan(result, time_limit_s=time_limit_s, seed=seed, workers=workers))
    elif explain:
        result = replace(result, infeasibility=explain_infeasibility(result))
    return result
