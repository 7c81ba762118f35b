"""The one place CP-SAT's parameters are chosen. Every solver the planner creates (the fleet search
and its canonical tie-break, the decomposition's subproblems and proofs, the infeasibility
explanation, expert placement) gets its `SatParameters` from `cpsat_parameters`.

Reproducible by construction (docs/cpsat.md section 7, and the comments of
google/or-tools:ortools/sat/sat_parameters.proto):
- the search stops on `max_deterministic_time`, a count of work in units "as close as possible to a
  second", set from the caller's budget and never from a clock reading; `max_time_in_seconds`, the
  wall clock, stays as a guard set above it, so that it fires only on a much slower machine;
- several workers run with `interleave_search` ("The search is deterministic (independently of
  num_workers!)") and a fixed `interleave_batch_size` (its default, 3 x num_workers, would tie the
  search to the worker count); one worker is deterministic alone and runs the full linear
  relaxation instead (`linearization_level` 2), which closes the covering and packing gaps of the
  planning models at the root;
- `random_seed` is always set;
- `presolve_inclusion_work_limit` 0 works around google/or-tools#5293 (a wrong optimum with large
  enforced Boolean sums).
The same model, seed and worker count then give the same answer on every run.
"""

from ortools.sat.python import cp_model
from ortools.sat.python.cp_model_helper import SatParameters

__all__ = ["DETERMINISTIC_SHARE", "cpsat_parameters", "cpsat_solver"]

DETERMINISTIC_SHARE = 0.8  # deterministic-time units per second of budget (measured: dtime runs ~1.2x wall time on 2 cores)
INTERLEAVE_BATCH_SIZE = 12  # fixed: 2 and 4 workers then reach the same answer (docs/cpsat.md section 7)
FULL_LINEARIZATION = 2
MIN_WALL_GUARD_S = 0.01


def cpsat_parameters(*, budget_s: float, seed: int, workers: int = 1, deterministic_time: float | None = None,
                     wall_guard_s: float | None = None, relative_gap_limit: float = 0.0, presolve: bool = True) -> SatParameters:
    """CP-SAT's parameters for a search of `budget_s` seconds: it stops after `deterministic_time`
    (default: DETERMINISTIC_SHARE x `budget_s`) units of work, or at the wall-clock guard
    (default: `budget_s`; a caller with a hard deadline passes the time left to it)."""
    p = SatParameters()
    p.num_workers = workers
    p.random_seed = seed
    p.max_deterministic_time = DETERMINISTIC_SHARE * budget_s if deterministic_time is None else deterministic_time
    p.max_time_in_seconds = max(MIN_WALL_GUARD_S, budget_s if wall_guard_s is None else wall_guard_s)
    p.relative_gap_limit = relative_gap_limit
    p.cp_model_presolve = presolve
    p.presolve_inclusion_work_limit = 0
    if workers == 1:
        p.linearization_level = FULL_LINEARIZATION
    else:
        p.interleave_search = True
        p.interleave_batch_size = INTERLEAVE_BATCH_SIZE
    return p


def cpsat_solver(**parameters) -> cp_model.CpSolver:
    """A CP-SAT solver with `cpsat_parameters(**parameters)`."""
    solver = cp_model.CpSolver()
    solver.parameters = cpsat_parameters(**parameters)
    return solver
