"""Exhaustive search over the same candidates and the same integer-scaled objective as the CP-SAT
model, for small problems: the oracle the solver is tested against.

Rack packing is checked by placing the pipeline stages into racks with first-fit decreasing, not
with the model's volume inequalities, so the search also tests that encoding.
"""

import itertools
import math
from collections.abc import Iterator

from planner.model_builder import (
    THROUGHPUT_RESOLUTION,
    TIME_RESOLUTION_S,
    USD_RESOLUTION,
    PlanningData,
    _scaled,
    rack_items,
    replica_bound,
)
from planner.problem import Objective

__all__ = ["reference_optimum", "fits_racks", "SearchTooLarge"]

MAX_COMBINATIONS = 2_000_000


class SearchTooLarge(Exception):
    pass


def fits_racks(data: PlanningData, chosen: dict[int, int]) -> bool:
    """Place every pipeline stage of every replica into the fleet's racks, first-fit decreasing."""
    for rack_id, pool in data.pools.items():
        if pool.count is None:
            continue
        whole_racks = 0
        slots: list[int] = []
        for j, replicas in chosen.items():
            c = data.candidates[j]
            if c.rack_id != rack_id:
                continue
            kind, size = rack_items(c, pool)
            if kind == "racks":
                whole_racks += replicas * c.stages * size
            else:
                slots += [size] * (replicas * c.stages)
        free = [pool.domain_size] * (pool.count - whole_racks) if whole_racks <= pool.count else None
        if free is None:
            return False
        for size in sorted(slots, reverse=True):
            target = next((i for i, room in enumerate(free) if room >= size), None)
            if target is None:
                return False
            free[target] -= size
    return True


def _minimal_vectors(data: PlanningData, workload: str) -> Iterator[dict[int, int]]:
    """Replica counts for one workload's candidates that serve its demand, none removable."""
    js = data.candidates_of(workload)
    demand = data.demand_tokens_per_s[workload]
    if demand is None:
        for j in js:
            yield {j: 1}
        return
    need = _scaled(demand, THROUGHPUT_RESOLUTION, round_up=True)
    rate = {j: _scaled(data.candidates[j].output_tokens_per_s, THROUGHPUT_RESOLUTION, round_up=False) for j in js}
    ranges = [range(replica_bound(data, j) + 1) for j in js]
    if math.prod(len(r) for r in ranges) > MAX_COMBINATIONS:
        raise SearchTooLarge(workload)
    for counts in itertools.product(*ranges):
        served = sum(rate[j] * r for j, r in zip(js, counts))
        if served < need:
            continue
        if any(r and served - rate[j] >= need for j, r in zip(js, counts)):
            continue  # a replica could be removed: not minimal, never better
        yield {j: r for j, r in zip(js, counts) if r}


def _objective(data: PlanningData, chosen: dict[int, int]) -> int:
    cands = data.candidates
    if data.objective is Objective.MIN_TPOT:
        return sum(max((_scaled(cands[j].tpot_s, TIME_RESOLUTION_S, round_up=True) for j in chosen if cands[j].workload == w), default=0)
                   for w in data.workloads)
    if data.objective is Objective.MAX_THROUGHPUT_PER_ACCELERATOR:
        if data.has_demand:
            return sum(cands[j].accelerators * r for j, r in chosen.items())
        return -sum(_scaled(cands[j].output_tokens_per_s_per_accelerator, THROUGHPUT_RESOLUTION, round_up=False) for j in chosen)
    if data.has_demand:
        return sum(_scaled(cands[j].usd_per_hour, USD_RESOLUTION, round_up=True) * r for j, r in chosen.items())
    return sum(_scaled(cands[j].usd_per_million_output_tokens, USD_RESOLUTION, round_up=True) for j in chosen)


def _within_cost_cap(data: PlanningData, chosen: dict[int, int]) -> bool:
    if data.cost_cap_usd_per_hour is None:
        return True
    cost = sum(_scaled(data.candidates[j].usd_per_hour, USD_RESOLUTION, round_up=True) * r for j, r in chosen.items())
    return cost <= _scaled(data.cost_cap_usd_per_hour, USD_RESOLUTION, round_up=False)


def reference_optimum(data: PlanningData) -> tuple[int | None, dict[int, int] | None]:
    """The minimum integer objective over every feasible plan (None if infeasible), and one plan
    attaining it. Raises SearchTooLarge for problems too big to enumerate."""
    per_workload = [list(_minimal_vectors(data, w)) for w in data.workloads]
    if math.prod(len(v) for v in per_workload) > MAX_COMBINATIONS:
        raise SearchTooLarge("combinations")
    best_value, best_plan = None, None
    for parts in itertools.product(*per_workload):
        chosen = {j: r for part in parts for j, r in part.items()}
        if any(group <= set(chosen) for group in data.excluded):
            continue
        if not _within_cost_cap(data, chosen) or not fits_racks(data, chosen):
            continue
        value = _objective(data, chosen)
        if best_value is None or value < best_value:
            best_value, best_plan = value, chosen
    return best_value, best_plan
