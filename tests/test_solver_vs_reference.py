"""CP-SAT reaches the optimum of the exhaustive reference search on the same candidates and the same
integer objective: on every bundled problem small enough, and on 50 seeded random small problems."""

import random
from dataclasses import replace

import pytest

from planner.modes import ServingRole
from planner.paths import data_dir
from planner.problem.resolve import resolve_problem
from planner.problem.schema import load_problem, parse_problem
from planner.solver.model_builder import replica_bound
from planner.solver.reference import SearchTooLarge, fits_racks, reference_optimum
from planner.solver.search import solve_data
from planner.solver.solve import prepare

MODELS = ["llama-3.1-8b", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b", "qwen3-32b"]
RACKS = ["hgx-h100", "hgx-b200", "mi300x-8", "gb200-nvl72", "tpu-v6e-256", "hgx-h200"]
MAX_BOUND = 5  # keep the exhaustive search small: candidates needing more replicas are left out of both
SUBSETS = ((8, 4), (6, 3), (4, 2))  # aggregated and per-pool candidates kept per workload, tried in turn
WHOLE_PROBLEM_COMBINATIONS = 100_000  # the whole problem is searched when it has at most this many plans
SUBSET_COMBINATIONS = 50_000  # a subset is searched when it has at most this many


def _compare(data, max_combinations: int = 2_000_000) -> None:
    expected, _ = reference_optimum(data, max_combinations)
    raw = solve_data(data, time_limit_s=20, seed=0, workers=2)
    if expected is None:
        assert raw.status == "INFEASIBLE"
        return
    assert raw.status == "OPTIMAL"
    assert raw.objective_int == expected
    assert fits_racks(data, raw.chosen)


def _small(data, per_workload: int, per_pool: int):
    """The same problem on a subset of its candidates (both searches see the same subset): per
    workload and serving role, candidates spread over their TPOT (prefill: TTFT) range."""
    keep = []
    for w in data.workloads:
        for role, limit in ((ServingRole.AGGREGATED, per_workload), (ServingRole.PREFILL, per_pool), (ServingRole.DECODE, per_pool)):
            js = sorted((j for j in data.candidates_of(w, role) if replica_bound(data, j) <= MAX_BOUND),
                        key=lambda j: (data.candidates[j].tpot_s, data.candidates[j].ttft_s))
            step = max(1, len(js) / limit)
            keep += [data.candidates[js[int(k * step)]] for k in range(min(len(js), limit))]
    return replace(data, candidates=tuple(keep))


@pytest.mark.parametrize("path", sorted(data_dir("problems").glob("*.yaml")), ids=lambda p: p.stem)
def test_bundled_problems_match_exhaustive_search(path):
    data, _ = prepare(resolve_problem(load_problem(path)))
    try:
        _compare(data, max_combinations=WHOLE_PROBLEM_COMBINATIONS)
        return
    except SearchTooLarge:
        pass
    for per_workload, per_pool in SUBSETS:
        try:
            _compare(_small(data, per_workload, per_pool), max_combinations=SUBSET_COMBINATIONS)
            return
        except SearchTooLarge:
            continue
    pytest.fail(f"{path.stem}: even the smallest candidate subset is too large for the exhaustive search")


def random_problem(seed: int) -> dict:
    rng = random.Random(seed)
    n_workloads = rng.choice([1, 1, 2])
    racks = rng.sample(RACKS, rng.choice([1, 2]))
    objective = rng.choice(["min_cost", "min_cost", "max_throughput_per_accelerator", "min_tpot"])
    with_demand = objective == "min_tpot" or rng.random() < 0.7
    workloads = []
    for i in range(n_workloads):
        workload = {"name": f"w{i}", "model": f"m{i}", "input_tokens": rng.choice([512, 2048, 8192]),
                    "output_tokens": rng.choice([128, 512]), "tpot_limit_ms": rng.choice([30, 60, 120])}
        if rng.random() < 0.5:
            workload["ttft_limit_ms"] = rng.choice([500, 2000])
        workload["serving"] = rng.choice(["aggregated", "auto", "auto", "disaggregated"])
        if with_demand:
            workload["demand"] = {"output_tokens_per_s": rng.choice([500, 2000, 8000, 30000])}
        workloads.append(workload)
    problem = {
        "name": f"random-{seed}",
        "models": {f"m{i}": rng.choice(MODELS) for i in range(n_workloads)},
        "cluster": {"racks": [{"type": r, "count": rng.choice([1, 2, 3])} for r in racks]},
        "workloads": workloads,
        "objective": objective,
    }
    if objective == "min_tpot":
        problem["cost_cap_usd_per_hour"] = rng.choice([50, 200, 1000])
    return problem


@pytest.mark.parametrize("seed", range(50))
def test_random_small_problems_match_exhaustive_search(seed):
    data, _ = prepare(resolve_problem(parse_problem(random_problem(seed))))
    _compare(_small(data, *SUBSETS[0]))
