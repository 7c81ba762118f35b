"""LLM deployment planner: how should this model be deployed on this cluster, and what will each
token cost? A step model of serving (calibrated kernel rates beside the ideal roofline) and CP-SAT
to choose the deployment that serves a workload at the lowest cost per token.

The pipeline, upstream first, is the order of the subpackages: model, hardware, physics, problem,
placement, solver, studies, output, cli. The public face (imported on first use, so that the
command line starts fast):

    from pathlib import Path
    import planner
    path = Path("problems/llama-3.1-70b-hgx-h100.yaml")  # from the repository root
    resolved = planner.resolve_problem(planner.load_problem(path), base_dir=path.parent)
    result = planner.solve(resolved)                # SolveResult: deployments, status, stats, explanation
    record = planner.solve_record(result)           # the plan as `planner solve --json` writes it (planner.solve_plan: typed)
    planner.check_plan(resolved, record)            # independent check of a plan record: [] when it holds
    planner.export_plan(record, "sglang")           # launch script (json, vllm, sglang, trtllm, lws)
    planner.evaluate("llama-3.1-70b", "hgx-h100", batch=64, input_tokens=2048, output_tokens=256, tp=8)

README.md's "Python API" section shows more; tests/test_readme_example.py runs both as printed.
"""

import importlib

__version__ = "0.1.0"
__all__ = ["check_plan", "estimate", "evaluate", "export_plan", "load_problem", "resolve_problem", "solve", "solve_plan", "solve_record"]

_HOME = {
    "check_plan": "planner.output.validate",
    "estimate": "planner.physics.estimate",
    "evaluate": "planner.quick",
    "export_plan": "planner.output.export",
    "load_problem": "planner.problem.schema",
    "resolve_problem": "planner.problem.resolve",
    "solve": "planner.solver.solve",
    "solve_plan": "planner.output.plan_writer",
    "solve_record": "planner.output.plan_writer",
}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
