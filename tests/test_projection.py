"""The decomposition's proof (planner.solver.projection) on small integer programs of two or three
blocks joined by packing rows, against brute force over every assignment."""

import itertools
import random

import pytest
from ortools.sat.python import cp_model

from planner.solver import projection
from planner.solver.decompose import Decomposition, split_by_block
from planner.solver.projection import _pareto
from planner.solver.search import solve_by_workload

VALUES = range(3)  # every variable takes 0, 1 or 2


def random_program(seed: int):
    """Blocks of three variables, each with a covering row of its own; coupling rows over random
    variables of several blocks; positive costs; a tie-break with distinct weights."""
    rng = random.Random(seed)
    n_blocks, n_vars = rng.choice([2, 3]), 3
    model = cp_model.CpModel()
    xs = [[model.new_int_var(0, max(VALUES), f"x{k}{i}") for i in range(n_vars)] for k in range(n_blocks)]
    for block in xs:
        model.add(cp_model.LinearExpr.weighted_sum(block, [rng.randint(1, 3) for _ in block]) >= rng.randint(2, 6))
    flat = [x for block in xs for x in block]
    for _ in range(rng.randint(1, 4)):
        chosen = rng.sample(flat, rng.randint(3, len(flat)))
        coeffs = [rng.randint(1, 3) for _ in chosen]
        model.add(cp_model.LinearExpr.weighted_sum(chosen, coeffs) <= rng.randint(3, 3 * len(chosen)))
    costs = {x.index: rng.randint(1, 9) for x in flat}
    model.minimize(cp_model.LinearExpr.weighted_sum(flat, [costs[x.index] for x in flat]))
    tie_break = {x.index: 10 + x.index for x in flat}
    return model, {x.index: f"b{k}" for k, block in enumerate(xs) for x in block}, costs, tie_break


def brute_force(model: cp_model.CpModel, costs: dict[int, int], tie_break: dict[int, int]):
    """The least (cost, tie-break) over every assignment that meets every row; None if none does."""
    rows = [(list(c.linear.vars), list(c.linear.coeffs), list(c.linear.domain)) for c in model.proto.constraints]
    best = None
    for values in itertools.product(VALUES, repeat=len(costs)):
        if all(lo <= sum(c * values[i] for i, c in zip(refs, coeffs)) <= hi for refs, coeffs, (lo, hi) in rows):
            key = (sum(costs[i] * v for i, v in enumerate(values)), sum(tie_break[i] * v for i, v in enumerate(values)))
            best = key if best is None else min(best, key)
    return best


def test_pareto_keeps_exactly_the_unbeaten_plans():
    # keys: (cost, tie-break, use of row 1, use of row 2)
    # c: a is cheaper and uses as much; f: the same as a; d: dearer than a in tie-break, but less of row 2
    found = [(("a",), (5, 0, 2, 2)), (("b",), (6, 0, 1, 2)), (("c",), (6, 0, 2, 2)),
             (("d",), (5, 1, 2, 1)), (("e",), (4, 9, 3, 3)), (("f",), (5, 0, 2, 2))]
    assert sorted(_pareto(found)) == [("a",), ("b",), ("d",), ("e",)]


@pytest.mark.parametrize("canonical", [False, True])
@pytest.mark.parametrize("wide", [False, True])
def test_proof_matches_brute_force_and_takes_every_path(canonical, wide, monkeypatch):
    """With `wide`, a front of more than two solves is too wide: its workload joins the master whole."""
    paths = {"proven": 0, "row added": 0, "window grown": 0, "whole": 0}
    violated, front, copy_block = projection._violated, projection.Front.__init__, Decomposition._copy_block
    limits: set[int] = set()  # block 0's window limits in one run: more than one when the window grew

    def spy_violated(*args):
        rows = violated(*args)
        paths["row added"] += bool(rows)
        return rows

    def spy_front(self, dec, k, coef, limit, *args):
        if k == 0:
            limits.add(limit)
        front(self, dec, k, coef, limit, *args)

    def spy_copy_block(self, master, k):
        paths["whole"] += 1
        return copy_block(self, master, k)

    monkeypatch.setattr(projection, "_violated", spy_violated)
    monkeypatch.setattr(projection.Front, "__init__", spy_front)
    monkeypatch.setattr(Decomposition, "_copy_block", spy_copy_block)
    if wide:
        monkeypatch.setattr(projection, "MAX_FRONT_SOLVES", 2)
    for seed in range(40):
        model, block_of, costs, tie_break = random_program(seed)
        limits.clear()
        expected = brute_force(model, costs, tie_break)
        parts = split_by_block(model, block_of, {})
        dec = Decomposition(model, *parts, {}, seed=0, workers=2, wall_s=30)
        outcome = solve_by_workload(dec, tie_break if canonical else None)
        if expected is None:
            assert outcome is None or not outcome.assignment, seed
            continue
        if outcome is None or not outcome.assignment:
            continue  # the restricted master found nothing: the caller hands the model to CP-SAT
        assert outcome.bound <= expected[0] <= outcome.objective, seed
        assert outcome.proven, seed  # these fronts are tiny: the proof always finishes
        assert outcome.objective == expected[0], seed
        plan = [outcome.assignment[i] for i in range(len(costs))]
        for constraint in model.proto.constraints:  # the plan meets every row, coupling or not
            lo, hi = list(constraint.linear.domain)
            assert lo <= sum(c * plan[i] for i, c in zip(constraint.linear.vars, constraint.linear.coeffs)) <= hi, seed
        if canonical:
            assert sum(tie_break[i] * v for i, v in enumerate(plan)) == expected[1], seed
        paths["proven"] += 1
        paths["window grown"] += len(limits) > 1
    assert paths["proven"] >= 20 and paths["row added"] >= 1 and paths["window grown"] >= 1, paths
    assert (paths["whole"] > 0) == wide, paths
