"""The model's rack-budget encoding (volume inequalities per power-of-two size) against exact bin
packing by brute force, on random instances (hypothesis)."""

from collections import Counter
from functools import cache

from expect import _model, _solve
from hypothesis import given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model
from test_model_builder import cand

from planner.problem.schema import Objective
from planner.solver.model_builder import PlanningData, RackPool
from planner.solver.reference import fits_racks


def exact_bin_packing(sizes: tuple[int, ...], capacity: int, bins: int) -> bool:
    """Depth-first search over assignments of items to bins (small instances only)."""

    @cache
    def place(i: int, free: tuple[int, ...]) -> bool:
        if i == len(sizes):
            return True
        tried = set()
        for b, room in enumerate(free):
            if room >= sizes[i] and room not in tried:
                tried.add(room)
                rest = list(free)
                rest[b] -= sizes[i]
                if place(i + 1, tuple(sorted(rest))):
                    return True
        return False

    return place(0, (capacity,) * bins)


@settings(max_examples=150, deadline=None)
@given(capacity=st.sampled_from([8, 16, 64, 72, 144]), bins=st.integers(1, 3),
       sizes=st.lists(st.sampled_from([1, 2, 4, 8, 16, 32, 64]), min_size=1, max_size=9))
def test_packing_encoding_matches_exact_bin_packing(capacity, bins, sizes):
    sizes = [s for s in sizes if s <= capacity]
    if not sizes:
        return
    counts = Counter(sizes)
    candidates = [cand(tp=s, rate=float(s)) for s in sorted(counts)]
    data = PlanningData(tuple(candidates), ("w",), {"w": float(sum(sizes))}, {"r72": RackPool("r72", capacity, bins)},
                        Objective.MIN_COST)
    model, v = _model(data)
    for j, s in enumerate(sorted(counts)):
        model.add(v.replicas[j] == counts[s])
    _, status = _solve(model)
    expected = exact_bin_packing(tuple(sorted(sizes, reverse=True)), capacity, bins)
    assert (status != cp_model.INFEASIBLE) == expected
    assert fits_racks(data, {j: counts[s] for j, s in enumerate(sorted(counts))}) == expected
