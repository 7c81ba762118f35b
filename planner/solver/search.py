"""The CP-SAT boundary: parameters, hints and the two-phase search of a built planning model.

Phase 1 minimises the primary objective. Phase 2 re-solves with the primary objective held at its
value and a canonical tie-break, on one worker, so that the same input, seed and worker count
always give the same plan. A fleet model of several workloads and many candidates is first
decomposed by workload (planner.solver.decompose): proven there, or handed to phase 1 with a plan
and cuts.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ortools.sat.python import cp_model, cp_model_helper

from planner.cpsat import cpsat_solver
from planner.modes import ServingRole, SolveStatus
from planner.problem.schema import Objective
from planner.solver.decompose import Decomposition, Incumbent, Outcome, split_by_block
from planner.solver.model_builder import (
    PlanningData,
    PlanVars,
    build_model,
    primary_objective,
    tie_break_objective,
)
from planner.solver.projection import prove

__all__ = ["STATUS_NAMES", "RawSolution", "decompose_model", "hint_plan", "solve_by_workload", "solve_data"]

SEARCH_SHARE = 0.85  # of the time limit for the two search phases; the canonical tie-break gets the rest
SINGLE_WORKER_SHARE = 0.4  # of the search time for the single-worker first phase
SINGLE_WORKER_MIN_S = 1.0
MIN_SEARCH_S = 0.1  # CP-SAT's share when the decomposition took the budget
DECOMPOSE_MIN_CANDIDATES = 150  # below this, CP-SAT alone proves the bundled fleets optimal in well under a second
TIE_BREAK_TIME_LIMIT_S = 5.0  # fixed, so that multi-worker runs do not depend on the worker count (docs/cpsat.md section 7)
STATUS_NAMES = {cp_model.OPTIMAL: SolveStatus.OPTIMAL, cp_model.FEASIBLE: SolveStatus.FEASIBLE, cp_model.INFEASIBLE: SolveStatus.INFEASIBLE,
                cp_model.UNKNOWN: SolveStatus.UNKNOWN, cp_model.MODEL_INVALID: SolveStatus.MODEL_INVALID}


@dataclass(frozen=True)
class RawSolution:
    status: SolveStatus
    chosen: dict[int, int]  # candidate index -> replicas
    objective_int: int | None  # the objective in the model's integer units
    objective: float | None
    best_bound: float | None
    gap: float | None
    wall_time_s: float
    unit: str
    n_variables: int
    n_constraints: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", SolveStatus(self.status))  # a status given by name


def _fix_families(model: cp_model.CpModel, v: PlanVars) -> None:
    for literal in v.families.values():
        model.add(literal == 1)


def _hint(model: cp_model.CpModel, v: PlanVars, solver: cp_model.CpSolver) -> None:
    """Hint every decision variable (an incomplete hint is ignored, docs/cpsat.md section 5)."""
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
    budget = time_limit_s if workers == 1 else min(time_limit_s, max(SINGLE_WORKER_MIN_S, SINGLE_WORKER_SHARE * time_limit_s))
    first = cpsat_solver(budget_s=budget, seed=seed, workers=1, relative_gap_limit=relative_gap_limit)
    on_bound = getattr(callback, "on_bound", None)  # a callback that also follows bound-only improvements
    if on_bound is not None:
        first.best_bound_callback = on_bound
    status = first.solve(model, callback) if callback else first.solve(model)
    if status in (cp_model.OPTIMAL, cp_model.INFEASIBLE, cp_model.MODEL_INVALID) or budget >= time_limit_s:
        return first, status, first.wall_time
    if status == cp_model.FEASIBLE:
        _hint(model, v, first)
    second = cpsat_solver(budget_s=time_limit_s - budget, seed=seed, workers=workers, relative_gap_limit=relative_gap_limit)
    if on_bound is not None:
        second.best_bound_callback = on_bound
    status_two = second.solve(model, callback) if callback else second.solve(model)
    wall = first.wall_time + second.wall_time
    if status_two in (cp_model.OPTIMAL, cp_model.INFEASIBLE) or (
            status_two == cp_model.FEASIBLE and (status != cp_model.FEASIBLE or second.objective_value <= first.objective_value)):
        return second, status_two, wall
    return first, status, wall


def decompose_model(model: cp_model.CpModel, v: PlanVars, *, seed: int, workers: int, wall_s: float) -> Decomposition | None:
    """A built model (families fixed, objective set) split by workload; None when a row or the
    objective does not split."""
    blocks = v.blocks()
    if any(index not in blocks for index in model.proto.objective.vars):
        return None
    constants = {literal.index: 1 for literal in v.families.values()}
    parts = split_by_block(model, blocks, constants)
    return None if parts is None else Decomposition(model, *parts, constants, seed=seed, workers=workers, wall_s=wall_s)


def _decompose(model: cp_model.CpModel, v: PlanVars, data: PlanningData, *, seed: int, workers: int, time_limit_s: float,
               canonical: bool, callback) -> Outcome | None:
    """The Lagrangian decomposition by workload (planner.solver.decompose) of a fleet model large
    enough to need it; None when it does not apply."""
    if len(data.workloads) < 2 or len(data.candidates) < DECOMPOSE_MIN_CANDIDATES:
        return None
    decomposition = decompose_model(model, v, seed=seed, workers=workers, wall_s=time_limit_s)
    if decomposition is None:
        return None
    tie_break = None
    if canonical:
        flat = cp_model_helper.FlatIntExpr(tie_break_objective(v, data))
        tie_break = {var.index: c for var, c in zip(flat.vars, flat.coeffs)}

    def progress(value: int | None, bound: int) -> None:
        for hook, number in ((getattr(callback, "on_bound", None), bound), (getattr(callback, "on_plan", None), value)):
            if hook is not None and number is not None:
                hook(number)

    return solve_by_workload(decomposition, tie_break, progress if callback is not None else None)


def solve_by_workload(decomposition: Decomposition, tie_break: dict[int, int] | None,
                      on_progress: Callable[[int | None, int], None] | None = None) -> Outcome | None:
    """The decomposition's steps 1-2 (its incumbent), then the proof (planner.solver.projection);
    None when a workload cannot be served at all."""
    start = decomposition.incumbent()
    if not isinstance(start, Incumbent):
        return start
    if on_progress:
        on_progress(start.value, start.bound)
    assignment, value, bound, exact = prove(decomposition, start.mu, start.lows, start.bound, start.assignment, start.value, tie_break)
    if on_progress:
        on_progress(value, bound)
    return Outcome(assignment, value, bound, exact and bound >= value, tuple(decomposition.cuts))


def _from_outcome(outcome: Outcome, model: cp_model.CpModel, v: PlanVars, resolution: float, unit: str, wall: float,
                  status: SolveStatus = SolveStatus.OPTIMAL) -> RawSolution:
    """The decomposition's plan: proven optimal, or the best plan found when CP-SAT found none."""
    chosen = {j: outcome.assignment[var.index] for j, var in enumerate(v.replicas) if outcome.assignment[var.index] > 0}
    objective, bound = outcome.objective * resolution, outcome.bound * resolution
    gap = abs(objective - bound) / abs(objective) if objective else 0.0
    return RawSolution(status, chosen, outcome.objective, objective, bound, gap, wall, unit,
                       len(model.proto.variables), len(model.proto.constraints))


def _warm_start(model: cp_model.CpModel, v: PlanVars, data: PlanningData, outcome: Outcome | None, hint: dict[int, int] | None) -> None:
    """The decomposition's cuts as rows and its plan as a complete hint; else the caller's hint."""
    if outcome is not None:
        for terms, low in outcome.cuts:
            model.add(cp_model.LinearExpr.weighted_sum([model.get_int_var_from_proto_index(i) for i, _ in terms],
                                                       [c for _, c in terms]) >= low)
    if outcome is not None and outcome.assignment:
        model.clear_hints()
        for index, value in sorted(outcome.assignment.items()):
            model.add_hint(model.get_int_var_from_proto_index(index), value)
    elif hint is not None and data.objective is not Objective.MIN_TPOT:
        hint_plan(model, v, hint)


def solve_data(data: PlanningData, *, time_limit_s: float = 10.0, seed: int = 0, workers: int = 2, canonical: bool = True,
               relative_gap_limit: float = 0.0, callback: cp_model.CpSolverSolutionCallback | None = None,
               hint: dict[int, int] | None = None) -> RawSolution:
    """Steps 2 and 3 on prepared data: the best plan, its objective, bound and gap. `hint` (candidate
    index -> replicas) warm-starts the search, e.g. from the previous point of a sweep. A large
    fleet model is first decomposed by workload: that proves many optimal outright, and otherwise
    hands CP-SAT a near-optimal plan as a hint and its cuts as rows."""
    model, v = build_model(data)
    _fix_families(model, v)
    objective, resolution, unit = primary_objective(model, v, data)
    model.minimize(objective)
    start = time.perf_counter()
    outcome = _decompose(model, v, data, seed=seed, workers=workers, time_limit_s=SEARCH_SHARE * time_limit_s,
                         canonical=canonical, callback=callback)
    spent = time.perf_counter() - start
    if outcome is not None and outcome.proven:
        return _from_outcome(outcome, model, v, resolution, unit, spent)
    _warm_start(model, v, data, outcome, hint)
    solver, status, wall = _minimise(model, v, time_limit_s=max(MIN_SEARCH_S, SEARCH_SHARE * time_limit_s - spent), seed=seed,
                                     workers=workers, relative_gap_limit=relative_gap_limit, callback=callback)
    wall += spent
    name = STATUS_NAMES.get(status, SolveStatus.UNKNOWN)
    n_vars, n_cons = len(model.proto.variables), len(model.proto.constraints)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if outcome is not None and outcome.assignment and status != cp_model.INFEASIBLE:
            return _from_outcome(outcome, model, v, resolution, unit, wall, status=SolveStatus.FEASIBLE)
        return RawSolution(name, {}, None, None, None, None, wall, unit, n_vars, n_cons)
    value = round(solver.objective_value)
    bound = max(solver.best_objective_bound, outcome.bound if outcome is not None else -math.inf)
    if name is SolveStatus.OPTIMAL and value > math.ceil(bound - 1e-6):
        name = SolveStatus.FEASIBLE  # CP-SAT says OPTIMAL when the gap limit stops it; only a closed gap is optimal
    elif name is SolveStatus.FEASIBLE and value <= math.ceil(bound - 1e-6):
        name = SolveStatus.OPTIMAL  # the decomposition's bound closed the gap that CP-SAT's did not
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
    solver = cpsat_solver(budget_s=min((1 - SEARCH_SHARE) * time_limit_s, TIE_BREAK_TIME_LIMIT_S), seed=seed, workers=1)
    status = solver.solve(model)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return v.extract(solver), solver.wall_time
    return v.extract(incumbent), solver.wall_time


