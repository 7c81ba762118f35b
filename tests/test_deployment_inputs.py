"""One deployment, four ways in: `planner.evaluate`, `planner estimate`, the solver's candidates and
the plan checker all build its DeploymentInputs with `physics.inputs.deployment_inputs`, so they
build the same record and refuse the same deployments."""

import dataclasses
from pathlib import Path

import pytest

from planner.cli.estimate import estimate_inputs
from planner.cli.parser import build_parser
from planner.errors import PlannerInputError
from planner.output import validate
from planner.output.plan_writer import solve_plan
from planner.physics.inputs import DeploymentInputs
from planner.problem.resolve import resolve_problem
from planner.problem.schema import load_problem
from planner.quick import evaluate, inputs_for
from planner.solver.solve import solve

PROBLEMS = Path(__file__).resolve().parents[1] / "problems"


def _differences(a: DeploymentInputs, b: DeploymentInputs) -> list[str]:
    return [f.name for f in dataclasses.fields(DeploymentInputs) if getattr(a, f.name) != getattr(b, f.name)]


def _estimate_args(problem: Path, layout, batch: int) -> list[str]:
    return ["estimate", str(problem), "--tp", str(layout.tp), "--ep", str(layout.ep), "--pp", str(layout.pp),
            "--dp-attn", str(layout.dp_attn), "--batch", str(batch)]


@pytest.mark.parametrize("name", ["llama-3.1-70b-hgx-h100", "deepseek-v3-gb200-nvl72"])
def test_every_path_builds_the_same_inputs_for_one_deployment(name):
    path = PROBLEMS / f"{name}.yaml"
    resolved = resolve_problem(load_problem(path), base_dir=path.parent)
    result = solve(resolved, explain=False)
    assert result.has_plan
    chosen = result.deployments[0].candidate
    workload = resolved.workloads[0]
    model = resolved.models[workload.model_key]
    spec = model.precisions
    # the solver's candidate, as enumerated (a problem without an expert-load profile: even expert loads)
    solver = chosen.inputs
    quick = inputs_for(model.arch.id, chosen.rack_id, chosen.batch, workload.input_tokens, workload.output_tokens,
                       tp=chosen.layout.tp, ep=chosen.layout.ep, pp=chosen.layout.pp, dp_attn=chosen.layout.dp_attn,
                       weights=spec.weights, kv_cache=spec.kv_cache, compute=spec.compute)
    cli = estimate_inputs(build_parser().parse_args(_estimate_args(path, chosen.layout, chosen.batch)))
    violations = []
    checker = validate._inputs(resolved, solve_plan(result).deployments[0], "deployments[0]", violations)
    assert violations == []
    for other in (quick, cli, checker):
        assert _differences(solver, other) == []


def test_evaluate_refuses_what_estimate_refuses():
    # DeepSeek-V3's fp8 checkpoint has 128-wide scaling blocks; tp=32 (ep=1, so expert_tp=32) cuts its
    # dense MLP (18432 = 144 blocks) into 576-wide slices and its expert MLP (2048 = 16 blocks) into
    # 64-wide ones, neither a whole number of blocks; tp=8 gives 2304 = 18 blocks and 256 = 2 blocks.
    flags = ["estimate", "--model", "deepseek-v3", "--rack", "gb200-nvl72", "--batch", "32", "--isl", "2048", "--osl", "256"]
    with pytest.raises(PlannerInputError) as by_cli:
        estimate_inputs(build_parser().parse_args([*flags, "--tp", "32"]))
    with pytest.raises(PlannerInputError) as by_evaluate:
        evaluate("deepseek-v3", "gb200-nvl72", batch=32, input_tokens=2048, output_tokens=256, tp=32)
    problems = lambda exc: sorted(i.problem for i in exc.value.issues)
    assert problems(by_cli) == problems(by_evaluate)
    assert any("18432 split 32 ways" in p for p in problems(by_evaluate))
    assert any("2048 split 32 ways" in p for p in problems(by_evaluate))
    accepted = evaluate("deepseek-v3", "gb200-nvl72", batch=32, input_tokens=2048, output_tokens=256, tp=8)
    assert accepted.inputs == estimate_inputs(build_parser().parse_args([*flags, "--tp", "8"]))
