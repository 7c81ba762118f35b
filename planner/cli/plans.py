"""`planner solve`, `export`, `check` and `view`: make a plan, then launch, verify or draw it."""

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console

from planner.cli.common import (
    EXIT_INFEASIBLE,
    EXIT_INVALID_PLAN,
    EXIT_OK,
    load_checked_plan,
    load_plan,
    resolve_problem_path,
    resolved_from_plan,
    write_json,
    write_text,
)
from planner.errors import InputIssue, PlannerInputError
from planner.modes import Confidence
from planner.problem.resolve import resolve_problem
from planner.problem.schema import load_problem

__all__ = ["check_command", "export_command", "solve_command", "view_command"]


def solve_command(args: argparse.Namespace, console: Console) -> int:
    from planner.output.plan import plan_document
    from planner.output.plan_report import render_solve, solve_plan
    from planner.solver.solve import solve

    path = resolve_problem_path(args.problem)
    problem = load_problem(path)
    if getattr(args, "confidence", None):
        problem = problem.model_copy(update={"solver": problem.solver.model_copy(update={"confidence": Confidence(args.confidence)})})
    resolved = resolve_problem(problem, base_dir=path.parent, source=str(path))
    with console.status("enumerating candidates and solving...") as status:
        result = solve(resolved, time_limit_s=args.time_limit, seed=args.seed, workers=args.workers,
                       progress=lambda text: status.update(f"evaluating {text}"))
    render_solve(result, console)
    if args.json:
        plan = solve_plan(result)
        if plan.problem_dir is not None:
            plan = plan.model_copy(update={"problem_dir": os.path.relpath(Path(plan.problem_dir).resolve(), Path(args.json).resolve().parent)})
        write_json(args.json, plan_document(plan), console)
    return EXIT_OK if result.has_plan else EXIT_INFEASIBLE


def export_command(args: argparse.Namespace, console: Console) -> int:
    from planner.output.export import export_plan

    plan, path = load_checked_plan(args.plan)
    if args.output and Path(args.output).resolve() == Path(path).resolve():
        raise PlannerInputError(InputIssue("-o", f"{args.output} is the plan being exported; writing there would replace it",
                                           "choose another output path, e.g. placement.json"))
    text = export_plan(plan, args.format or str(plan.engine), engine=args.engine)
    if args.output:
        write_text(args.output, text, console)
        if text.startswith("#!"):  # a launch script runs as ./launch.sh
            Path(args.output).chmod(0o755)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def check_command(args: argparse.Namespace, console: Console) -> int:
    from planner.output.validate import check_plan

    plan, path = load_plan(args.plan)
    violations = check_plan(resolved_from_plan(plan, path), plan, placement=True)
    if not violations:
        console.print(f"[green]valid[/green]: {len(plan.deployments)} deployments on {plan.placed_accelerators} accelerators; HBM, latency limits, "
                      "demand, racks, placement and expert maps re-derived from the problem and the step model")
        return EXIT_OK
    err = Console(stderr=True, width=140, highlight=False)
    err.print(f"{path}: {len(violations)} problem(s):", markup=False)
    for v in violations:
        err.print(f"  - {v}", markup=False)
    return EXIT_INVALID_PLAN


def view_command(args: argparse.Namespace, console: Console) -> int:
    from planner.output.plan_view import render_placement

    plan, _ = load_checked_plan(args.plan)
    render_placement(plan, console, args.rack)
    if args.plot:
        from planner.output.placement_picture import placement_png, placement_svg

        if Path(args.plot).suffix.lower() == ".png":
            placement_png(plan, args.plot, args.colour_by, args.rack)
            console.print(f"wrote {args.plot}", markup=False)
        elif Path(args.plot).suffix.lower() == ".svg":
            write_text(args.plot, placement_svg(plan, args.colour_by, args.rack), console)
        else:
            raise PlannerInputError(InputIssue("--plot", f"{args.plot}: unknown picture format", "end the file name in .svg or .png"))
    return EXIT_OK
