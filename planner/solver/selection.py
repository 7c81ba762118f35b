"""The problem's candidates: every workload's (pair_batches.workload_candidates), in canonical
order; without any demand, first as if the racks were roomy."""

from collections.abc import Callable

from planner.problem.resolve import ResolvedProblem
from planner.solver.candidates import Candidate, RackAnalysis
from planner.solver.latency_batches import LatencyLadder
from planner.solver.model_builder import USD_RESOLUTION, RackPool, _scaled
from planner.solver.pair_batches import best_plan, workload_candidates
from planner.solver.plan_frontier import fits_rows

__all__ = ["problem_candidates", "roomy_or_all"]


def problem_candidates(resolved: ResolvedProblem, analyses: dict[tuple[str, str], RackAnalysis], pools: dict[str, RackPool],
                       ladder: LatencyLadder | None, every_batch: bool, roomy: bool = False) -> tuple[Candidate, ...]:
    """Every workload's candidates (with `ladder`, at the batches it keeps; with `every_batch`, all
    of them, unpruned), in canonical order."""
    out: list[Candidate] = []
    for w in resolved.workloads:
        mine = [analyses[(w.name, rack.id)] for rack, _ in resolved.rack_counts]
        out += [c for a in mine for c in a.candidates] if every_batch else \
            workload_candidates(w, mine, pools, resolved.solver_options.max_replicas, resolved.objective, resolved.cost_cap_usd_per_hour is not None,
                                ladder, roomy)
    return tuple(sorted(out, key=lambda c: (c.workload, c.sort_key())))


def roomy_or_all(resolved: ResolvedProblem, pools: dict[str, RackPool], select: Callable[..., tuple[Candidate, ...]]) -> tuple[Candidate, ...]:
    """Without any demand, the candidates chosen as if the racks were roomy (`select(roomy=True)`)
    when every workload's best plan over them fits beside every other's and under the cost cap:
    that combination is then optimal, and those candidates hold it. Otherwise `select()`."""
    if any(w.output_tokens_per_s is not None for w in resolved.workloads):
        return select()
    roomy = select(roomy=True)
    best = [best_plan([c for c in roomy if c.workload == w.name], pools, w.ttft_limit_s, resolved.objective) for w in resolved.workloads]
    if None in best or not fits_rows(sum(b[2] for b in best), pools):
        return select()
    cap = resolved.cost_cap_usd_per_hour
    return roomy if cap is None or sum(b[1] for b in best) <= _scaled(cap, USD_RESOLUTION, round_up=False) else select()
