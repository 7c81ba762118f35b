"""Shared fixtures: the built-in catalogs and a helper to build one deployment's inputs."""

import pytest

from planner.hardware.catalog import load_hardware_catalog
from planner.model.catalog import load_model_catalog
from planner.modes import StepModel
from planner.physics.deployment import Layout, Precisions
from planner.physics.estimate import estimate
from planner.physics.inputs import DeploymentInputs
from planner.precision import FlopsFormat, Precision


@pytest.fixture(scope="session")
def hw():
    return load_hardware_catalog()


@pytest.fixture(scope="session")
def models():
    return load_model_catalog()


@pytest.fixture(scope="session")
def run_estimate(hw, models):
    """run_estimate(model, rack, batch, isl, osl, tp=1, ep=1, pp=1, dp_attn=None, weights=..., ...): the ideal
    roofline unless step_model= says otherwise (the lecture's claims and the golden numbers are ideal physics)."""

    def run(model, rack, batch, isl, osl, *, tp=1, ep=1, pp=1, dp_attn=None, weights="bf16", kv="bf16",
            compute=None, activations="bf16", arch=None, rack_type=None, **kwargs):
        layout = Layout(tp, ep, pp, dp_attn) if dp_attn else Layout.with_default_dp_attn(tp, ep, pp)
        weights = Precision(weights)
        fmt = FlopsFormat(compute) if compute else (FlopsFormat.FP8 if weights in (Precision.FP8,) else FlopsFormat.BF16)
        precisions = Precisions(weights, Precision(kv), Precision(activations), fmt)
        kwargs.setdefault("step_model", StepModel.ROOFLINE)
        inputs = DeploymentInputs(arch or models[model], rack_type or hw.racks[rack], layout, batch, isl, osl, precisions,
                                  hw.overheads, **kwargs)
        return estimate(inputs)

    return run


@pytest.fixture(scope="session")
def solved_bundled():
    """Every feasible bundled problem, resolved and solved once for the session: name -> (resolved, result)."""
    from planner.paths import data_dir
    from planner.problem.resolve import resolve_problem
    from planner.problem.schema import load_problem
    from planner.solver.solve import solve

    out = {}
    for path in sorted(data_dir("problems").glob("*.yaml")):
        if not path.stem.startswith("infeasible"):
            resolved = resolve_problem(load_problem(path), base_dir=path.parent)
            out[path.stem] = (resolved, solve(resolved))
    return out
