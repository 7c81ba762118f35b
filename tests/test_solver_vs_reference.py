"""CP-SAT reaches the optimum of the exhaustive reference search on the same candidates and the same
integer objective: on every bundled problem small enough, and on 50 seeded random small problems."""

import random
from dataclasses import replace
from pathlib import Path

import pytest

from planner.modes import ServingRole
from planner.paths import data_dir
from planner.problem.resolve import resolve_problem
from planner.problem.schema import load_problem, parse_problem
from planner.solver.batch_search import batch_grid
from planner.solver.latency_batches import solve_refined
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


# Off the grid: the exhaustive reference searches a candidate at every feasible batch of every layout
# (every multiple of the batch granularity up to the HBM limit, solve.prepare(every_batch=True)),
# independently of the enumeration's batch grid and of which batches it keeps; CP-SAT, on the
# enumeration's candidates, must reach the same optimum.
REPRODUCER = Path(__file__).parent / "problems" / "disaggregated-70b-two-hgx.yaml"
SMALL_MODELS = ["llama-3.1-8b", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b", "qwen3-32b", "llama-3.1-70b"]
SMALL_RACKS = ["hgx-h100", "hgx-b200", "mi300x-8", "hgx-h200"]
EVERY_BATCH_SEEDS = 40
EVERY_BATCH_COMBINATIONS = 200_000


def _compare_every_batch(resolved) -> tuple:
    """CP-SAT's optimum on the enumeration's candidates against the exhaustive search over every batch;
    the every-batch data and the reference plan."""
    data, _ = prepare(resolved)
    every, _ = prepare(resolved, every_batch=True)
    expected, plan = reference_optimum(every, EVERY_BATCH_COMBINATIONS)
    run = lambda d, canonical=True: solve_data(d, time_limit_s=20, seed=0, workers=2, canonical=canonical)
    raw = solve_refined(data, run)[1] if data.ladder is not None else run(data)
    if expected is None:
        assert raw.status == "INFEASIBLE"
    else:
        assert raw.status == "OPTIMAL"
        assert raw.objective_int == expected
    return every, plan


def _with_serving(path: Path, serving: str):
    problem = load_problem(path)
    return resolve_problem(problem.model_copy(update={"workloads": [w.model_copy(update={"serving": serving}) for w in problem.workloads]}))


@pytest.mark.parametrize("serving", ["disaggregated", "auto"])
def test_the_reproducer_matches_the_search_over_every_batch(serving):
    # Issue 21: with two HGX H100 boxes, the cheapest pair decodes below its largest feasible batch
    # (fewer prefill replicas feed it, and only so many fit); that batch is off the batch grid.
    every, plan = _compare_every_batch(_with_serving(REPRODUCER, serving))
    decode = [every.candidates[j] for j in plan if every.candidates[j].role is ServingRole.DECODE]
    assert decode, "the reference plan is a prefill-decode pair"
    q = decode[0].layout.pp * decode[0].layout.dp_attn
    assert decode[0].batch not in batch_grid(q, 65536)


def small_problem(seed: int) -> dict:
    """A random problem small enough to search at every batch: one rack type, one or two boxes, a
    batch cap (off the grid too), one or two workloads, with or without a demand; mostly long
    prompts and split pools, where the pairing of prefill and decode decides the decode batch."""
    rng = random.Random(1000 + seed)
    n_workloads = rng.choice([1, 1, 2])
    with_demand = rng.random() < 0.4
    workloads = []
    for i in range(n_workloads):
        workload = {"name": f"w{i}", "model": f"m{i}", "input_tokens": rng.choice([512, 2048, 8000, 16000]),
                    "output_tokens": rng.choice([64, 200, 512]), "serving": rng.choice(["aggregated", "auto", "disaggregated", "disaggregated"])}
        if rng.random() < 0.7:
            workload["tpot_limit_ms"] = rng.choice([30, 60, 120])
        if rng.random() < 0.6:
            workload["ttft_limit_ms"] = rng.choice([1000, 2000, 4000])
        if with_demand:
            workload["demand"] = {"output_tokens_per_s": rng.choice([500, 2000, 8000])}
        workloads.append(workload)
    problem = {
        "name": f"small-{seed}",
        "models": {f"m{i}": rng.choice(SMALL_MODELS) for i in range(n_workloads)},
        "cluster": {"racks": [{"type": rng.choice(SMALL_RACKS), "count": rng.choice([1, 2])}]},
        "workloads": workloads,
        "objective": rng.choice(["min_cost", "min_cost", "max_throughput_per_accelerator", "min_tpot"]),
        "solver": {"max_batch_per_replica": rng.choice([24, 40, 96, 160, 400])},
    }
    if problem["objective"] == "min_tpot":
        problem["cost_cap_usd_per_hour"] = rng.choice([30, 100, 400])
    return problem


@pytest.mark.parametrize("seed", range(EVERY_BATCH_SEEDS))
def test_random_small_problems_match_the_search_over_every_batch(seed):
    _compare_every_batch(resolve_problem(parse_problem(small_problem(seed))))


def _ttft_problem(ttft_limit_ms: int) -> dict:
    return {"name": f"pair-ttft-{ttft_limit_ms}", "model": "llama-3.1-70b", "precisions": {"weights": "fp8", "kv_cache": "fp8"},
            "cluster": {"racks": [{"type": "hgx-h100", "count": 2}]},
            "workloads": [{"name": "chat", "input_tokens": 2048, "output_tokens": 256, "serving": "disaggregated", "tpot_limit_ms": 100,
                           "ttft_limit_ms": ttft_limit_ms, "demand": {"output_tokens_per_s": 3000}}]}


def test_ttft_limits_that_bind_a_pair_match_the_search_over_every_batch():
    # With a demand, a decode replica runs below its largest feasible batch only where a shorter
    # decode step (the step a request joins after its KV hand-off) brings the pair within the TTFT
    # limit. A sweep of limits across prefill TTFTs of about 0.5-1.5 s must meet such a case.
    below = 0
    for limit in range(600, 2100, 200):
        every, plan = _compare_every_batch(resolve_problem(parse_problem(_ttft_problem(limit))))
        for j in plan or {}:
            c = every.candidates[j]
            same = [o.batch for o in every.candidates if o.role is c.role and o.layout == c.layout and o.rack_id == c.rack_id]
            below += c.role is ServingRole.DECODE and c.batch < max(same)
    assert below > 0
