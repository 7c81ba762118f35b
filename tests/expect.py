"""Context managers for CP-SAT unit tests: build the plan model from data, let the test add or force
constraints, then check feasibility or the optimum (cpsat-primer's TDD helpers, written once here)."""

from contextlib import contextmanager

from ortools.sat.python import cp_model

from planner.solver.model_builder import build_model, primary_objective


def _solve(model):
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 10
    return solver, solver.solve(model)


def _model(data):
    model, v = build_model(data)
    for literal in v.families.values():
        model.add(literal == 1)
    return model, v


@contextmanager
def expect_feasible(data):
    model, v = _model(data)
    yield model, v
    _, status = _solve(model)
    assert status in (cp_model.OPTIMAL, cp_model.FEASIBLE), "expected a feasible model"


@contextmanager
def expect_infeasible(data):
    model, v = _model(data)
    yield model, v
    _, status = _solve(model)
    assert status == cp_model.INFEASIBLE, "expected an infeasible model"


@contextmanager
def expect_objective(data, value: int):
    model, v = _model(data)
    objective, _, _ = primary_objective(model, v, data)
    model.minimize(objective)
    yield model, v
    solver, status = _solve(model)
    assert status == cp_model.OPTIMAL
    assert round(solver.objective_value) == value
