"""Solve-time benchmark: prints figures, asserts nothing (machines are noisy).

Part 1: every bundled problem, solved `--repeats` times in fresh caches; median wall time of the
CP-SAT solves and of the whole solve (candidates included), status and gap.
Part 2: a generated fleet of 230 racks of four generations serving 12 workloads whose demand fills
most of it (the rack budgets bind); problem size, the time CP-SAT takes to reach a 1% gap, and the
status and gap at the 30 s limit.
Part 3 (--scale): fleets of 100 to 1,000 racks of five generations serving 40 workloads of 10 models,
each size in a fresh process: enumeration time, time to a plan within 1% of the optimum (enumeration
included), time to proven optimality (the whole solve, when it ends OPTIMAL), and peak memory
(issue 14's target: 1,000 racks within 1% in under 10 s and proven in under 60 s on 2 cores).
Fleets of two or more workloads and 150 or more candidates are first decomposed by workload
(planner/solver/decompose.py); its plan and its Lagrangian bound count towards "within 1%".

    python benchmarks/bench_solve.py [--repeats 5] [--workers 2] [--quick] [--scale]
"""

import argparse
import math
import statistics
import time

from ortools.sat.python import cp_model

from planner.paths import data_dir
from planner.physics import links
from planner.problem.resolve import resolve_problem
from planner.problem.schema import load_problem, parse_problem
from planner.solver.search import solve_data
from planner.solver.solve import prepare, solve

BIG_MODELS = ["llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b", "qwen3-32b", "mixtral-8x7b", "gpt-oss-120b", "deepseek-v3",
              "llama-4-scout", "qwen3-235b-a22b", "gpt-oss-20b", "mixtral-8x22b", "llama-4-maverick"]


def big_fleet_problem(n_workloads: int = 12) -> dict:
    return {
        "name": "generated-fleet",
        "models": {m: m for m in BIG_MODELS[:n_workloads]},
        "precisions": {"weights": "fp8", "kv_cache": "fp8"},
        "cluster": {"racks": [{"type": "gb200-nvl72", "count": 30}, {"type": "hgx-h100", "count": 100},
                              {"type": "hgx-b200", "count": 60}, {"type": "mi300x-8", "count": 40}]},
        "workloads": [{"name": f"w{i}-{m}", "model": m, "input_tokens": [1024, 2048, 4096, 8192][i % 4],
                       "output_tokens": [256, 512][i % 2], "tpot_limit_ms": [40, 60, 80][i % 3], "ttft_limit_ms": 3000,
                       "demand": {"output_tokens_per_s": 60_000 + 45_000 * i}}
                      for i, m in enumerate(BIG_MODELS[:n_workloads])],
        "solver": {"time_limit_s": 30},
    }


def _clear_caches() -> None:
    links._CACHE.clear()
    links._CLUSTERS.clear()


def bench_bundled(repeats: int, workers: int, limit: int | None = None) -> None:
    print(f"{'problem':40s} {'status':10s} {'gap':>6s} {'cands':>6s} {'CP-SAT s (median)':>18s} {'total s (median)':>17s}")
    medians = []
    for path in sorted(data_dir("problems").glob("*.yaml"))[:limit]:
        walls, totals, result = [], [], None
        for _ in range(repeats):
            _clear_caches()
            resolved = resolve_problem(load_problem(path))
            start = time.perf_counter()
            result = solve(resolved, workers=workers, explain=False)
            totals.append(time.perf_counter() - start)
            walls.append(result.stats.wall_time_s)
        gap = "-" if result.stats.gap is None else f"{result.stats.gap:.1%}"
        medians.append(statistics.median(totals))
        print(f"{path.stem:40s} {result.status:10s} {gap:>6s} {result.stats.n_candidates:6d} "
              f"{statistics.median(walls):18.3f} {statistics.median(totals):17.3f}")
    print(f"median over problems of the median total time: {statistics.median(medians):.3f} s; slowest: {max(medians):.3f} s")


class _GapWatch(cp_model.CpSolverSolutionCallback):
    """Records when the best plan found so far is first within 1% of the best bound proven so far.
    Both are followed: plans through the solution callback and `on_plan` (the decomposition's),
    bound-only improvements through `on_bound` (CP-SAT's best_bound_callback and the Lagrangian
    bound); any proven bound stays valid across the search's phases. Only copies numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.start = time.perf_counter()
        self.first_under_1pct_s = None
        self.best_objective = math.inf
        self.best_bound = -math.inf

    def _check(self) -> None:
        gap = (self.best_objective - self.best_bound) / max(1.0, abs(self.best_objective))
        if gap < 0.01 and self.first_under_1pct_s is None:
            self.first_under_1pct_s = time.perf_counter() - self.start

    def on_solution_callback(self) -> None:
        self.best_objective = min(self.best_objective, self.objective_value)
        self.best_bound = max(self.best_bound, self.best_objective_bound)
        self._check()

    def on_bound(self, bound: float) -> None:
        self.best_bound = max(self.best_bound, bound)
        self._check()

    def on_plan(self, objective: float) -> None:
        """A plan found outside CP-SAT's search (the decomposition by workload)."""
        self.best_objective = min(self.best_objective, objective)
        self._check()


def bench_big(workers: int, time_limit_s: float) -> None:
    raw = big_fleet_problem()
    racks = sum(r["count"] for r in raw["cluster"]["racks"])
    sizes = {"gb200-nvl72": 72, "hgx-h100": 8, "hgx-b200": 8, "mi300x-8": 8}
    accelerators = sum(r["count"] * sizes[r["type"]] for r in raw["cluster"]["racks"])
    _clear_caches()
    start = time.perf_counter()
    data, _ = prepare(resolve_problem(parse_problem(raw)))
    enumeration = time.perf_counter() - start
    watch = _GapWatch()
    solution = solve_data(data, time_limit_s=time_limit_s, seed=0, workers=workers, callback=watch)
    used = {}
    for j, replicas in solution.chosen.items():
        c = data.candidates[j]
        used[c.rack_id] = used.get(c.rack_id, 0) + replicas * c.accelerators
    print(f"generated fleet: {racks} racks of {len(raw['cluster']['racks'])} types ({accelerators} accelerators), "
          f"{len(raw['workloads'])} workloads")
    print(f"  model: {len(data.candidates)} candidates, {solution.n_variables} variables, {solution.n_constraints} constraints; "
          f"candidates enumerated in {enumeration:.2f} s")
    print("  accelerators used per rack type: " + ", ".join(f"{k} {used.get(k, 0)}/{sizes[k] * p.count}" for k, p in data.pools.items()))
    first = "never" if watch.first_under_1pct_s is None else f"{watch.first_under_1pct_s:.2f} s"
    if solution.objective is None:
        print(f"  at the {time_limit_s:g} s limit: status {solution.status}, no plan, CP-SAT wall {solution.wall_time_s:.1f} s")
        return
    print(f"  gap under 1% after {first}; at the {time_limit_s:g} s limit: status {solution.status}, "
          f"objective {solution.objective:.6g} {solution.unit}, bound {solution.best_bound:.6g}, gap {solution.gap:.3%}, "
          f"CP-SAT wall {solution.wall_time_s:.1f} s")


SCALE_TYPES = {"gb200-nvl72": 0.10, "hgx-h100": 0.35, "hgx-b200": 0.25, "hgx-h200": 0.15, "mi300x-8": 0.15}


def scaled_fleet_problem(n_racks: int, n_workloads: int = 40, n_models: int = 10) -> dict:
    """n_racks over five generations; 40 workloads of 10 models whose demand grows with the fleet."""
    models = BIG_MODELS[:n_models]
    return {
        "name": f"fleet-{n_racks}",
        "models": {m: m for m in models},
        "precisions": {"weights": "fp8", "kv_cache": "fp8"},
        "cluster": {"racks": [{"type": t, "count": max(1, round(share * n_racks))} for t, share in SCALE_TYPES.items()]},
        "workloads": [{"name": f"w{i}", "model": models[i % n_models], "input_tokens": [1024, 2048, 4096, 8192][i % 4],
                       "output_tokens": [256, 512][i % 2], "tpot_limit_ms": [40, 60, 80][i % 3], "ttft_limit_ms": 3000,
                       "demand": {"output_tokens_per_s": (8_000 + 6_000 * (i % 12)) * n_racks / 250}}
                      for i in range(n_workloads)],
        "solver": {"time_limit_s": 60},
    }


def _scale_point(n_racks: int, workers: int, time_limit_s: float, queue) -> None:
    import resource

    start = time.perf_counter()
    data, _ = prepare(resolve_problem(parse_problem(scaled_fleet_problem(n_racks))), workers=workers)
    enumeration = time.perf_counter() - start
    watch = _GapWatch()
    solution = solve_data(data, time_limit_s=time_limit_s, seed=0, workers=workers, callback=watch)
    total = time.perf_counter() - start
    queue.put({"racks": n_racks, "candidates": len(data.candidates), "enumeration_s": enumeration,
               "to_1pct_s": None if watch.first_under_1pct_s is None else enumeration + watch.first_under_1pct_s,
               "status": solution.status, "gap": solution.gap, "total_s": total,
               "proven_s": total if solution.status == "OPTIMAL" else None,
               "peak_mb": max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024})


def bench_scale(workers: int, time_limit_s: float, sizes=(100, 250, 500, 1000)) -> None:
    import multiprocessing

    print(f"{'racks':>6s} {'cands':>6s} {'enumerate s':>12s} {'to 1% s':>9s} {'proven s':>9s} {'status':>9s} {'gap':>8s} "
          f"{'total s':>8s} {'peak MB':>8s}")
    context = multiprocessing.get_context("spawn")
    for n in sizes:
        queue = context.Queue()
        process = context.Process(target=_scale_point, args=(n, workers, time_limit_s, queue))
        process.start()
        row = queue.get()
        process.join()
        to_1pct = "never" if row["to_1pct_s"] is None else f"{row['to_1pct_s']:.2f}"
        gap = "-" if row["gap"] is None else f"{row['gap']:.3%}"
        proven = "-" if row["proven_s"] is None else f"{row['proven_s']:.2f}"
        print(f"{n:6d} {row['candidates']:6d} {row['enumeration_s']:12.2f} {to_1pct:>9s} {proven:>9s} {row['status']:>9s} {gap:>8s} "
              f"{row['total_s']:8.2f} {row['peak_mb']:8.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--time-limit", type=float, default=30.0, help="CP-SAT limit for the generated fleet")
    parser.add_argument("--quick", action="store_true", help="smoke run: three bundled problems once, the fleet at a 2 s limit")
    parser.add_argument("--scale", action="store_true", help="only part 3: fleets of 100 to 1,000 racks, 40 workloads of 10 models")
    parser.add_argument("--sizes", type=lambda text: tuple(int(x) for x in text.split(",")), default=(100, 250, 500, 1000),
                        help="fleet sizes in racks for --scale (default 100,250,500,1000)")
    args = parser.parse_args()
    if args.scale:
        bench_scale(args.workers, 60.0, args.sizes)
        return
    if args.quick:
        args.repeats, args.time_limit = 1, 2.0
    bench_bundled(args.repeats, args.workers, 3 if args.quick else None)
    print()
    bench_big(args.workers, args.time_limit)


if __name__ == "__main__":
    main()
