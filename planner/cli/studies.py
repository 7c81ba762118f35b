"""`planner compare`, `frontier` and `curve`: the same problem asked many times."""

import argparse

from rich.console import Console

from planner.cli.common import (
    EXIT_INFEASIBLE,
    EXIT_OK,
    Progress,
    problem_arg,
    write_json,
    write_text,
)
from planner.hardware.catalog import load_hardware_catalog

__all__ = ["compare_command", "curve_command", "frontier_command"]


def compare_command(args: argparse.Namespace, console: Console) -> int:
    from planner.output.sweep_report import compare_record, render_compare
    from planner.studies.sweeps import compare_racks

    problem, path = problem_arg(args.problem)
    racks = [r.strip() for r in args.racks.split(",") if r.strip()] if args.racks else list(load_hardware_catalog().racks)
    with Progress("planning on") as progress:
        rows = compare_racks(problem, racks, base_dir=path.parent, count=args.count, time_limit_s=args.time_limit, progress=progress)
    title = f"{problem.name}: the same workloads on each rack type ({'as many racks as needed' if args.count is None else f'{args.count} per type'})"
    render_compare(rows, console, title)
    if args.plot:
        from planner.output.charts import plot_compare

        console.print(f"wrote {plot_compare(rows, args.plot, title)}")
    if args.json:
        write_json(args.json, compare_record(rows), console)
    return EXIT_OK if any(r.usd_per_million_output_tokens is not None for r in rows) else EXIT_INFEASIBLE


def frontier_command(args: argparse.Namespace, console: Console) -> int:
    from planner.output.sweep_report import (
        frontier_csv,
        frontier_record,
        render_frontier,
    )
    from planner.studies.sweeps import sweep_frontier

    problem, path = problem_arg(args.problem)
    with Progress("sweeping") as progress:
        frontier = sweep_frontier(problem, base_dir=path.parent, workload=args.workload, points=args.points,
                                  min_tpot_s=None if args.min_tpot_ms is None else args.min_tpot_ms * 1e-3,
                                  max_tpot_s=None if args.max_tpot_ms is None else args.max_tpot_ms * 1e-3,
                                  time_limit_s=args.time_limit, progress=progress)
    render_frontier(frontier, console)
    if args.plot:
        from planner.output.charts import plot_frontier

        title = f"{problem.name}: {frontier.model}, workload {frontier.workload}"
        console.print(f"wrote {plot_frontier(frontier, args.plot, title)}")
    if args.csv:
        write_text(args.csv, frontier_csv(frontier), console)
    if args.json:
        write_json(args.json, frontier_record(frontier), console)
    return EXIT_OK if frontier.frontier else EXIT_INFEASIBLE


def curve_command(args: argparse.Namespace, console: Console) -> int:
    from planner.output.sweep_report import curve_csv, curve_record, render_curve
    from planner.studies.sweeps import batch_curve

    problem, path = problem_arg(args.problem)
    with console.status("solving and evaluating the batch range..."):
        curve = batch_curve(problem, base_dir=path.parent, workload=args.workload, points=args.points)
    render_curve(curve, console)
    if args.plot:
        from planner.output.charts import plot_curve

        title = f"{curve.model} on {curve.rack_id}, {curve.layout.describe()}"
        console.print(f"wrote {plot_curve(curve, args.plot, title)}")
    if args.csv:
        write_text(args.csv, curve_csv(curve), console)
    if args.json:
        write_json(args.json, curve_record(curve), console)
    return EXIT_OK
