"""The decomposition by workload: its bound on a hand-worked fleet, and its plans against the
exhaustive reference search on seeded random fleets of two and three workloads."""

import random

import pytest
from ortools.sat.python import cp_model
from test_model_builder import cand, data
from test_solver_vs_reference import MODELS, RACKS, SUBSETS, _small

from planner.problem.resolve import resolve_problem
from planner.problem.schema import parse_problem
from planner.solver import search
from planner.solver.model_builder import RackPool, build_model, primary_objective
from planner.solver.reference import SearchTooLarge, fits_racks, reference_optimum
from planner.solver.solve import prepare

MICRO_USD = 1_000_000


def two_workloads():
    """Workloads a and b each need 5,500 tok/s from 1,000 tok/s replicas: 6 replicas each, 12 in all.
    One 8-accelerator rack costs $1/h per replica for either; the unlimited pool costs $2/h (a) or
    $3/h (b). The optimum gives b six cheap replicas and a the other two: 6 + 2 + 4 x 2 = $16/h.
    The LP relaxation shares the rack fractionally (b 5.5, a 2.5 cheap, a 3 dear): $14/h. Pricing
    the rack at the LP dual, $1 per accelerator, each workload's whole-replica minimum is 6 x $2 =
    $12, so the Lagrangian bound is 12 + 12 - 8 x 1 = $16/h: the optimum, proven."""
    candidates = [cand("a", "cheap", rate=1000, usd=1), cand("a", "dear", rate=1000, usd=2),
                  cand("b", "cheap", rate=1000, usd=1), cand("b", "dear", rate=1000, usd=3)]
    pools = {"cheap": RackPool("cheap", 8, 1), "dear": RackPool("dear", 8, None)}
    return data(candidates, demand=5500, pools=pools, workloads=("a", "b"))


def decomposition(d):
    model, v = build_model(d)
    search._fix_families(model, v)
    objective, _, _ = primary_objective(model, v, d)
    model.minimize(objective)
    return search.decompose_model(model, v, seed=0, workers=2, wall_s=10), model, v


def test_lagrangian_bound_beats_the_lp_and_proves_the_hand_worked_optimum(monkeypatch):
    d = two_workloads()
    dec, _, _ = decomposition(d)
    lp, _, _ = dec._lp()
    assert lp.Solve() == 0 and lp.Objective().Value() == pytest.approx(14 * MICRO_USD)
    bound, mu, _ = dec.multipliers()
    assert bound == 16 * MICRO_USD
    assert max(mu) == 1 * MICRO_USD  # the rack's dual: one dollar per accelerator-hour
    monkeypatch.setattr(search, "DECOMPOSE_MIN_CANDIDATES", 0)
    raw = search.solve_data(d, time_limit_s=10, seed=0, workers=2)
    assert (raw.status, raw.objective_int, raw.gap) == ("OPTIMAL", 16 * MICRO_USD, 0.0)
    assert raw.chosen == {0: 2, 1: 4, 2: 6}


def fleet_problem(seed: int) -> dict:
    """Two or three workloads on one or two small rack pools, so the budgets couple them."""
    rng = random.Random(seed)
    n = rng.choice([2, 3])
    objective = rng.choice(["min_cost", "min_cost", "max_throughput_per_accelerator", "min_tpot"])
    workloads = [{"name": f"w{i}", "model": f"m{i}", "input_tokens": rng.choice([512, 2048, 8192]),
                  "output_tokens": rng.choice([128, 512]), "tpot_limit_ms": rng.choice([30, 60, 120]),
                  "serving": rng.choice(["aggregated", "aggregated", "auto"]),
                  "demand": {"output_tokens_per_s": rng.choice([1000, 3000, 10000])}} for i in range(n)]
    problem = {"name": f"fleet-{seed}", "models": {f"m{i}": rng.choice(MODELS) for i in range(n)},
               "cluster": {"racks": [{"type": r, "count": rng.choice([1, 2, 3])} for r in rng.sample(RACKS, rng.choice([1, 2]))]},
               "workloads": workloads, "objective": objective}
    if objective == "min_tpot":
        problem["cost_cap_usd_per_hour"] = rng.choice([100, 400, 2000])
    return problem


def _reference(d):
    for per_workload, per_pool in SUBSETS:
        small = _small(d, per_workload, per_pool)
        try:
            return small, reference_optimum(small, 50_000)
        except SearchTooLarge:
            continue
    pytest.skip("too large for the exhaustive search")


def _assignment(model: cp_model.CpModel, v, chosen: dict[int, int]) -> dict[int, int]:
    """Every variable's value in a feasible completion of the plan `chosen` (candidate -> replicas)."""
    fixed = model.clone()
    for j, var in enumerate(v.replicas):
        fixed.add(fixed.get_int_var_from_proto_index(var.index) == chosen.get(j, 0))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    assert solver.solve(fixed) in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    return {i: solver.value(fixed.get_int_var_from_proto_index(i)) for i in range(len(fixed.proto.variables))}


@pytest.mark.parametrize("seed", range(16))
def test_decomposed_fleets_match_exhaustive_search(seed, monkeypatch):
    full, _ = prepare(resolve_problem(parse_problem(fleet_problem(seed))))
    d, (expected, best) = _reference(full)
    monkeypatch.setattr(search, "DECOMPOSE_MIN_CANDIDATES", 0)
    raw = search.solve_data(d, time_limit_s=20, seed=0, workers=2)
    if expected is None:
        assert raw.status == "INFEASIBLE"
        return
    assert (raw.status, raw.objective_int) == ("OPTIMAL", expected)
    assert fits_racks(d, raw.chosen)
    assert search.solve_data(d, time_limit_s=20, seed=0, workers=2).chosen == raw.chosen  # deterministic
    dec, model, v = decomposition(d)
    found = dec.multipliers()
    assert found is not None and found[0] <= expected  # the Lagrangian bound never passes the optimum
    point = _assignment(model, v, best)
    for terms, low in dec.cuts:  # every cut holds at the reference's optimal plan
        assert sum(c * point[i] for i, c in terms) >= low


def test_an_lp_round_that_hits_its_iteration_cap_keeps_the_rounds_before_it(monkeypatch):
    """GLOP once cycled on a re-solve after cuts were added; each solve is capped in simplex
    iterations. The hand-worked fleet: with no iteration allowed the first LP has no answer, so there
    are no prices (None) and the search falls back to CP-SAT alone, which still proves $16/h; when only
    the second solve fails, the first round's bound ($16/h, proven by hand above) stands."""
    from planner.solver import decompose

    d = two_workloads()
    monkeypatch.setattr(decompose, "GLOP_ITERATIONS_PER_ENTRY", 0)
    dec, _, _ = decomposition(d)
    assert dec.multipliers() is None
    monkeypatch.setattr(search, "DECOMPOSE_MIN_CANDIDATES", 0)
    raw = search.solve_data(d, time_limit_s=10, seed=0, workers=2)
    assert (raw.status, raw.objective_int) == ("OPTIMAL", 16 * MICRO_USD)

    monkeypatch.setattr(decompose, "GLOP_ITERATIONS_PER_ENTRY", 2)
    dec, _, _ = decomposition(d)
    real, calls = dec._solve_lp, []

    def second_fails(lp):
        calls.append(1)
        return real(lp) if len(calls) == 1 else 4  # pywraplp's ABNORMAL, as a cycling GLOP ends
    monkeypatch.setattr(dec, "_solve_lp", second_fails)
    bound, mu, _ = dec.multipliers()
    assert len(calls) == 2  # the second round's solve was the one that failed
    assert bound == 16 * MICRO_USD and max(mu) == 1 * MICRO_USD
