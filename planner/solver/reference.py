"""Exhaustive search over the same candidates and the same integer-scaled objective as the CP-SAT
model, for small problems: the oracle the solver is tested against.

Rack packing is checked by placing the pipeline stages into racks with first-fit decreasing, not
with the model's volume inequalities, so the search also tests that encoding.
"""

import itertools
from collections.abc import Iterator

from planner.modes import ServingRole
from planner.placement.packing import PlacementFailed, RackSlots, StageItem, place
from planner.problem.schema import Objective
from planner.solver.model_builder import (
    THROUGHPUT_RESOLUTION,
    TIME_RESOLUTION_S,
    USD_RESOLUTION,
    PlanningData,
    RackPool,
    _scaled,
    replica_bound,
)

__all__ = ["SearchTooLarge", "fits_racks", "reference_optimum"]

MAX_COMBINATIONS = 2_000_000


class SearchTooLarge(Exception):
    pass


def fits_racks(data: PlanningData, chosen: dict[int, int]) -> bool:
    """Place every pipeline stage of every replica into the fleet's racks (packing.place: largest
    first into free aligned blocks, skipping broken accelerators)."""
    for rack_id, pool in data.pools.items():
        if pool.count is None:
            continue
        racks = _racks(pool)
        items = [StageItem((j, r, s), data.candidates[j].stage_size, (j, r))
                 for j, replicas in chosen.items() if data.candidates[j].rack_id == rack_id
                 for r in range(replicas) for s in range(data.candidates[j].stages)]
        try:
            place(racks, items)
        except PlacementFailed:
            return False
    return True


def _racks(pool: RackPool) -> list[RackSlots]:
    racks = []
    for i in range(pool.count):
        free = [True] * pool.domain_size
        if i < len(pool.broken):
            for index in pool.broken[i]:
                free[index] = False
        racks.append(RackSlots(f"{pool.rack_id}#{i}", pool.domain_size, free))
    return racks


def _pool_vectors(data: PlanningData, workload: str, role: ServingRole, limit: int) -> list[dict[int, int]]:
    """The minimal vectors of one pool, refusing (SearchTooLarge) to list more than `limit`."""
    vectors = list(itertools.islice(_minimal_vectors(data, workload, data.candidates_of(workload, role)), limit + 1))
    if len(vectors) > limit:
        raise SearchTooLarge(f"{workload} {role} pool")
    return vectors


def _matched_pairs(data: PlanningData, workload: str) -> Iterator[dict[int, int]]:
    """Without a demand: every prefill-decode pair within the TTFT limit, one decode replica fed by
    the fewest prefill replicas whose rate covers its rate (rates in the model's scaled integers)."""
    bad = set(data.split_pairs_over_ttft(workload))
    rate = lambda j: _scaled(data.candidates[j].output_tokens_per_s, THROUGHPUT_RESOLUTION, round_up=False)
    for p in data.candidates_of(workload, ServingRole.PREFILL):
        for q in data.candidates_of(workload, ServingRole.DECODE):
            if (p, q) not in bad and rate(p) > 0:
                yield {p: -(-rate(q) // rate(p)), q: 1}


def _workload_vectors(data: PlanningData, workload: str, limit: int) -> Iterator[dict[int, int]]:
    """Every minimal plan for one workload: aggregated replicas alone, or a prefill pool and a
    decode pool (each minimal) with no prefill-decode pair over the TTFT limit."""
    forced = data.forced_split.get(workload)
    if forced is not True:
        yield from _minimal_vectors(data, workload, data.candidates_of(workload, ServingRole.AGGREGATED))
    if forced is False:
        return
    if data.demand_tokens_per_s[workload] is None:  # one decode replica and the prefill replicas that feed it
        yield from _matched_pairs(data, workload)
        return
    prefill = _pool_vectors(data, workload, ServingRole.PREFILL, limit)
    decode = _pool_vectors(data, workload, ServingRole.DECODE, limit)
    bad = set(data.split_pairs_over_ttft(workload))
    for p in prefill:
        for q in decode:
            if not any((i, j) in bad for i in p for j in q):
                yield {**p, **q}


def _minimal_vectors(data: PlanningData, workload: str, js: list[int]) -> Iterator[dict[int, int]]:
    """Every vector of replica counts over candidates `js` that serves the workload's demand and
    from which no replica can be removed (an optimal plan never has a removable replica), by
    depth-first search: a branch stops as soon as the demand is met or can no longer be met."""
    if not js:
        return
    demand = data.demand_tokens_per_s[workload]
    if demand is None:
        for j in js:
            yield {j: 1}
        return
    need = _scaled(demand, THROUGHPUT_RESOLUTION, round_up=True)
    rate = [_scaled(data.candidates[j].output_tokens_per_s, THROUGHPUT_RESOLUTION, round_up=False) for j in js]
    bound = [replica_bound(data, j) for j in js]
    reachable = [sum(r * b for r, b in zip(rate[i:], bound[i:])) for i in range(len(js) + 1)]

    def search(i: int, served: int, counts: list[int]) -> Iterator[list[int]]:
        if served >= need:
            if all(c == 0 or served - rate[k] < need for k, c in enumerate(counts)):
                yield counts
            return
        if i == len(js) or served + reachable[i] < need:
            return
        for r in range(bound[i] + 1):
            yield from search(i + 1, served + r * rate[i], counts + [r])
            if served + r * rate[i] >= need:
                break  # more replicas of this candidate would be removable

    for counts in search(0, 0, []):
        yield {js[k]: c for k, c in enumerate(counts) if c}


def _objective(data: PlanningData, chosen: dict[int, int]) -> int:
    cands = data.candidates
    if data.objective is Objective.MIN_TPOT:
        return sum(max((_scaled(cands[j].tpot_s, TIME_RESOLUTION_S, round_up=True) for j in chosen if cands[j].workload == w), default=0)
                   for w in data.workloads)
    if data.objective is Objective.MAX_THROUGHPUT_PER_ACCELERATOR:
        if data.has_demand:
            return sum(cands[j].accelerators * r for j, r in chosen.items())
        # accelerator-seconds per output token, summed (a prefill-decode pair adds its two pools' times)
        return sum(_scaled(1.0 / cands[j].output_tokens_per_s_per_accelerator, TIME_RESOLUTION_S, round_up=True) for j in chosen)
    if data.has_demand:
        return sum(_scaled(cands[j].usd_per_hour, USD_RESOLUTION, round_up=True) * r for j, r in chosen.items())
    return sum(_scaled(cands[j].usd_per_million_output_tokens, USD_RESOLUTION, round_up=True) for j in chosen)


def _within_cost_cap(data: PlanningData, chosen: dict[int, int]) -> bool:
    if data.cost_cap_usd_per_hour is None:
        return True
    cost = sum(_scaled(data.candidates[j].usd_per_hour, USD_RESOLUTION, round_up=True) * r for j, r in chosen.items())
    return cost <= _scaled(data.cost_cap_usd_per_hour, USD_RESOLUTION, round_up=False)


def reference_optimum(data: PlanningData, max_combinations: int = MAX_COMBINATIONS) -> tuple[int | None, dict[int, int] | None]:
    """The minimum integer objective over every feasible plan (None if infeasible), and one plan
    attaining it. Every objective is a sum of per-workload terms, so workloads are searched in
    turn with their vectors sorted by their term, pruning branches that cannot beat the best plan;
    the fleet-wide checks (cost cap, rack packing) run on complete plans. Raises SearchTooLarge for
    problems too big to enumerate."""
    per_workload = []
    for w in data.workloads:
        vectors = []
        for vector in _workload_vectors(data, w, max_combinations):
            vectors.append((_objective(data, vector), vector))
            if len(vectors) > max_combinations:
                raise SearchTooLarge(w)
        per_workload.append(sorted(vectors, key=lambda item: item[0]))
    floor = [0] * (len(per_workload) + 1)
    for i in range(len(per_workload) - 1, -1, -1):
        floor[i] = floor[i + 1] + (per_workload[i][0][0] if per_workload[i] else 0)
    best: list = [None, None]
    leaves = [0]

    def search(i: int, value: int, chosen: dict[int, int]) -> None:
        if i == len(per_workload):
            leaves[0] += 1
            if leaves[0] > max_combinations:
                raise SearchTooLarge("leaves")
            if any(group <= set(chosen) for group in data.excluded):
                return
            if _within_cost_cap(data, chosen) and fits_racks(data, chosen):
                best[0], best[1] = value, dict(chosen)
            return
        for term, vector in per_workload[i]:
            if best[0] is not None and value + term + floor[i + 1] >= best[0]:
                break
            search(i + 1, value + term, {**chosen, **vector})

    search(0, 0, {})
    return best[0], best[1]
