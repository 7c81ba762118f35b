"""Exhaustive search over the same candidates and the same integer-scaled objective as the CP-SAT
model, for small problems: the oracle the solver is tested against.

Rack packing is checked by placing the pipeline stages into racks with first-fit decreasing, not
with the model's volume inequalities, so the search also tests that encoding. Given the candidates
of every feasible batch (solve.prepare(every_batch=True)), it checks the enumeration's choice of
batches too. Before searching, it drops each candidate another one can replace in every plan
(`_replaceable`, an exchange argument on the model's integer figures), and a latency objective is
searched one TPOT threshold at a time (`_min_tpot_optimum`).
"""

import itertools
from collections.abc import Iterator
from dataclasses import replace

import numpy as np

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
COMPARISONS_PER_VECTOR = 25  # dominance checks allowed per vector the search may list


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


def _pool_vectors(data: PlanningData, workload: str, role: ServingRole, limit: int, partners: dict[int, set[int]]) -> list[dict[int, int]]:
    """The minimal vectors of one pool, refusing (SearchTooLarge) to list more than `limit`, less
    those another vector of the pool beats (`_unbeaten`) with at least its partners."""
    vectors = list(itertools.islice(_minimal_vectors(data, workload, data.candidates_of(workload, role)), limit + 1))
    if len(vectors) > limit:
        raise SearchTooLarge(f"{workload} {role} pool")
    return _unbeaten(data, vectors, limit, lambda v: frozenset.intersection(*(frozenset(partners[j]) for j in v)))


def _stages(data: PlanningData, vector: dict[int, int]) -> dict[str, list[int]]:
    """Per rack type, the stage sizes (accelerators) of the vector's replicas, largest first."""
    out: dict[str, list[int]] = {}
    for j, replicas in vector.items():
        c = data.candidates[j]
        out.setdefault(c.rack_id, []).extend([c.stage_size] * (replicas * c.stages))
    return {rack: sorted(sizes, reverse=True) for rack, sizes in out.items()}


def _within(a: dict[str, list[int]], b: dict[str, list[int]]) -> bool:
    """Every stage of `a` fits in the place of a distinct stage of `b` (power-of-two sizes: the i-th
    largest of a no larger than the i-th largest of b), so a packs wherever b packs."""
    return all(len(sizes) <= len(b.get(rack, ())) and all(x <= y for x, y in zip(sizes, b[rack])) for rack, sizes in a.items())


def _unbeaten(data: PlanningData, vectors: list[dict[int, int]], limit: int, partners=lambda v: frozenset()) -> list[dict[int, int]]:
    """The vectors (one workload's or one pool's plans) no other one beats: no worse an objective
    term and cost per hour, packing wherever the other packs, pairing with every partner the other
    pairs with (`partners`); of equals, the first. None dropped when the data excludes candidate sets;
    SearchTooLarge past COMPARISONS_PER_VECTOR x `limit` comparisons."""
    if data.excluded:
        return vectors
    usd = lambda v: sum(_scaled(data.candidates[j].usd_per_hour, USD_RESOLUTION, round_up=True) * r for j, r in v.items())
    kept: list[tuple[int, int, dict, frozenset]] = []
    out = []
    work = 0
    for value, cost, k in sorted((_objective(data, v), usd(v), k) for k, v in enumerate(vectors)):
        stages, pairs = _stages(data, vectors[k]), partners(vectors[k])
        work += len(kept)
        if work > COMPARISONS_PER_VECTOR * limit:
            raise SearchTooLarge("vectors to compare")
        if not any(kv <= value and kc <= cost and _within(ks, stages) and kp >= pairs for kv, kc, ks, kp in kept):
            kept.append((value, cost, stages, pairs))
            out.append(vectors[k])
    return out


def _matched_pairs(data: PlanningData, workload: str) -> Iterator[dict[int, int]]:
    """Without a demand: every prefill-decode pair within the TTFT limit, one decode replica fed by
    the fewest prefill replicas whose rate covers its rate (rates in the model's scaled integers)."""
    bad = set(data.split_pairs_over_ttft(workload))
    rate = lambda j: _scaled(data.candidates[j].output_tokens_per_s, THROUGHPUT_RESOLUTION, round_up=False)
    for p in data.candidates_of(workload, ServingRole.PREFILL):
        for q in data.candidates_of(workload, ServingRole.DECODE):
            if (p, q) not in bad and rate(p) > 0 and -(-rate(q) // rate(p)) <= data.max_replicas:
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
    bad = set(data.split_pairs_over_ttft(workload))
    prefills, decodes = data.candidates_of(workload, ServingRole.PREFILL), data.candidates_of(workload, ServingRole.DECODE)
    partners = {p: {q for q in decodes if (p, q) not in bad} for p in prefills} | {q: {p for p in prefills if (p, q) not in bad} for q in decodes}
    prefill = _pool_vectors(data, workload, ServingRole.PREFILL, limit, partners)
    decode = _pool_vectors(data, workload, ServingRole.DECODE, limit, partners)
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
    attaining it (candidate indices of `data`). Raises SearchTooLarge for problems too big to enumerate."""
    keep = _kept(data)
    small = replace(data, candidates=tuple(data.candidates[j] for j in keep))
    if data.objective is Objective.MIN_TPOT:
        value, plan = _min_tpot_optimum(small, max_combinations)
    else:
        value, plan = _exhaustive(small, max_combinations)
    return value, None if plan is None else {keep[j]: r for j, r in plan.items()}


def _tpot(c) -> int:
    return _scaled(c.tpot_s, TIME_RESOLUTION_S, round_up=True)


def _min_tpot_optimum(data: PlanningData, max_combinations: int) -> tuple[int | None, dict[int, int] | None]:
    """The latency objective (the sum over workloads of each one's slowest TPOT): a plan whose
    workloads' TPOTs stay within thresholds T exists for every larger T too, so for each threshold of
    the first workloads, the smallest feasible threshold of the last is found by bisection, each
    test an exhaustive search over the candidates within the thresholds (fewer once those that
    another replaces are dropped). The smallest objective found is the optimum: the optimal plan's
    own TPOTs are thresholds tried."""
    workloads = list(data.workloads)
    levels = {w: sorted({_tpot(data.candidates[j]) for j in data.candidates_of(w) if data.candidates[j].role is not ServingRole.PREFILL})
              for w in workloads}
    if any(not levels[w] for w in workloads):
        return _exhaustive(data, max_combinations)
    best: list = [None, None]

    def within(limits: dict[str, int]) -> tuple[int | None, dict[int, int] | None]:
        keep = [j for j, c in enumerate(data.candidates) if c.role is ServingRole.PREFILL or _tpot(c) <= limits[c.workload]]
        sub = replace(data, candidates=tuple(data.candidates[j] for j in keep))
        kept = _kept(sub, ignore_tpot=True)
        value, plan = _exhaustive(replace(sub, candidates=tuple(sub.candidates[j] for j in kept)), max_combinations)
        return value, None if plan is None else {keep[kept[j]]: r for j, r in plan.items()}

    def last(limits: dict[str, int]) -> None:
        w = workloads[len(limits)]
        values = levels[w]
        if within({**limits, w: values[-1]})[0] is None:
            return
        lo, hi = 0, len(values) - 1  # values[hi] feasible
        while lo < hi:
            mid = (lo + hi) // 2
            if within({**limits, w: values[mid]})[0] is None:
                lo = mid + 1
            else:
                hi = mid
        value, plan = within({**limits, w: values[hi]})
        if best[0] is None or value < best[0]:
            best[0], best[1] = value, plan

    def first(limits: dict[str, int]) -> None:
        if len(limits) == len(workloads) - 1:
            last(limits)
            return
        w = workloads[len(limits)]
        floor = sum(levels[v][0] for v in workloads[len(limits) + 1:])
        for t in levels[w]:
            if best[0] is not None and sum(limits.values()) + t + floor >= best[0]:
                break
            if within({**limits, w: t, **{v: levels[v][-1] for v in workloads[len(limits) + 1:]}})[0] is not None:
                first({**limits, w: t})

    first({})
    return best[0], best[1]


def _kept(data: PlanningData, ignore_tpot: bool = False) -> list[int]:
    """Indices of the candidates no other candidate replaces in every plan: same workload, role and
    rack type; a stage no larger and no more accelerators (it packs wherever the other packs); no
    worse a coefficient in the objective (TPOT unless `ignore_tpot`) or the cost cap; as fast (with a
    demand, and for a prefill candidate, which then needs no more replicas), or, for a decode
    candidate without a demand, no faster (no more prefill replicas to feed it); and pairing within
    the TTFT limit with every partner the other pairs with. Of equals, the first.
    Candidates of one footprint and partners are compared first, then the survivors of each role."""
    if data.excluded:
        return list(range(len(data.candidates)))
    bad = {w: set(data.split_pairs_over_ttft(w)) for w in data.workloads}
    pools = {(w, role): data.candidates_of(w, role) for w in data.workloads for role in (ServingRole.PREFILL, ServingRole.DECODE)}
    rows = {}
    for j, c in enumerate(data.candidates):
        partners = () if c.role is ServingRole.AGGREGATED else \
            tuple((p, j) not in bad[c.workload] for p in pools[(c.workload, ServingRole.PREFILL)]) if c.role is ServingRole.DECODE else \
            tuple((j, q) not in bad[c.workload] for q in pools[(c.workload, ServingRole.DECODE)])
        rows[j] = (_figures(data, j, ignore_tpot), partners)
    survivors = list(range(len(data.candidates)))
    for coarse in (False, True):
        groups: dict[tuple, list[int]] = {}
        for j in survivors:
            c = data.candidates[j]
            key = (c.workload, c.role, c.rack_id) + (() if coarse else (c.stage_size, c.accelerators, rows[j][1]))
            groups.setdefault(key, []).append(j)
        survivors = sorted(j for js in groups.values() for j in _undominated(js, rows))
    return survivors


def _undominated(js: list[int], rows: dict) -> list[int]:
    """Those of `js` (in order) that no other of them dominates, of equals the first."""
    figures = np.array([rows[j][0] for j in js], dtype=float)
    width = len(rows[js[0]][1]) if js else 0
    pairs = np.array([rows[j][1] for j in js], dtype=bool).reshape(len(js), width)
    order = np.arange(len(js))
    out = []
    for i in range(len(js)):
        covers = np.all(figures <= figures[i], axis=1) & np.all(pairs >= pairs[i], axis=1)
        better = np.any(figures < figures[i], axis=1) | np.any(pairs > pairs[i], axis=1) | (order < i)
        if not np.any(covers & better):
            out.append(js[i])
    return out


def _figures(data: PlanningData, j: int, ignore_tpot: bool) -> list[int]:
    """What the model asks of candidate j, each as 'lower is better'."""
    c = data.candidates[j]
    demand = data.demand_tokens_per_s[c.workload] is not None
    rate = _scaled(c.output_tokens_per_s, THROUGHPUT_RESOLUTION, round_up=False)
    usd = _scaled(c.usd_per_hour, USD_RESOLUTION, round_up=True)
    out = [c.stage_size, c.accelerators, usd if demand or data.cost_cap_usd_per_hour is not None else 0]
    if data.objective is Objective.MIN_TPOT:
        out.append(0 if ignore_tpot else _tpot(c))
    elif data.objective is Objective.MAX_THROUGHPUT_PER_ACCELERATOR and not demand:
        out.append(_scaled(1.0 / c.output_tokens_per_s_per_accelerator, TIME_RESOLUTION_S, round_up=True))
    elif not demand:
        out.append(_scaled(c.usd_per_million_output_tokens, USD_RESOLUTION, round_up=True))
    if demand or c.role is ServingRole.PREFILL:  # more tokens, or fewer prefill replicas to feed a decode replica
        out.append(-rate)
    elif c.role is ServingRole.DECODE:
        out.append(rate)
    return out


def _exhaustive(data: PlanningData, max_combinations: int) -> tuple[int | None, dict[int, int] | None]:
    """Every objective is a sum of per-workload terms, so workloads are searched in turn with their
    vectors sorted by their term, pruning branches that cannot beat the best plan; the fleet-wide
    checks (cost cap, rack packing) run on complete plans."""
    per_workload = []
    for w in data.workloads:
        vectors = list(itertools.islice(_workload_vectors(data, w, max_combinations), max_combinations + 1))
        if len(vectors) > max_combinations:
            raise SearchTooLarge(w)
        per_workload.append(sorted(((_objective(data, v), v) for v in _unbeaten(data, vectors, max_combinations)), key=lambda item: item[0]))
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
