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

__all__ = ["compare_command", "curve_command", "frontier_command", "sweep_command"]


def compare_command(args: argparse.Namespace, console: Console) -> int:
    from planner.output.sweep_report import compare_record, render_compare
    from planner.studies.sweeps import compare_racks

    problem, path = problem_arg(args.problem)
    racks = [r.strip() for r in args.racks.split(",") if r.strip()] if args.racks is not None else list(load_hardware_catalog().racks)
    if not racks:
        from planner.errors import InputIssue, PlannerInputError

        raise PlannerInputError(InputIssue("--racks", f"no rack id in {args.racks!r}", "give comma-separated rack ids, e.g. hgx-h100,gb200-nvl72"))
    with Progress("planning on") as progress:
        rows = compare_racks(problem, racks, base_dir=path.parent, count=args.count, time_limit_s=args.time_limit, progress=progress)
    title = f"{problem.name}: the same workloads on each rack type ({'as many racks as needed' if args.count is None else f'{args.count} per type'})"
    render_compare(rows, console, title)
    if args.plot:
        from planner.output.charts import plot_compare

        console.print(f"wrote {plot_compare(rows, args.plot, title)}", markup=False)
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
        console.print(f"wrote {plot_frontier(frontier, args.plot, title)}", markup=False)
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
        console.print(f"wrote {plot_curve(curve, args.plot, title)}", markup=False)
    if args.csv:
        write_text(args.csv, curve_csv(curve), console)
    if args.json:
        write_json(args.json, curve_record(curve), console)
    return EXIT_OK


def _write_partial(points: list, out, name: str, console: Console) -> None:
    """After Ctrl-C: the table of the points finished so far (all of them stay in rows.jsonl)."""
    from planner.output.sweep_table import write_tables
    from planner.studies.sweep_run import ROWS_FILE, read_rows

    done = read_rows(out)
    rows = [row for p in points for row in done.get(p.index, [])]
    console.print(f"interrupted after {len(done)} of {len(points)} points; they are kept in {out / ROWS_FILE}", markup=False)
    for path in write_tables(rows, out, name) if rows else []:
        console.print(f"wrote {path} (the finished points only)", markup=False)


def sweep_command(args: argparse.Namespace, console: Console) -> int:
    """Expand the sweep file, solve every point not yet in --out, write the table, charts and summary."""
    import hashlib
    import json
    from pathlib import Path

    from planner.errors import InputIssue, PlannerInputError
    from planner.output.sweep_table import summary_lines, write_charts, write_tables
    from planner.studies.sweep import expand_sweep, load_sweep
    from planner.studies.sweep_run import ROWS_FILE, run_sweep

    spec, base, base_dir = load_sweep(Path(args.spec))
    points = expand_sweep(spec, base)
    time_limit = args.time_limit or spec.time_limit_s
    out = Path(args.out)
    fingerprint = hashlib.sha256(json.dumps([[p.id, p.problem] for p in points] + [time_limit, spec.seed], sort_keys=True,
                                            default=str).encode()).hexdigest()[:16]
    manifest = out / "sweep.json"
    if manifest.exists() and json.loads(manifest.read_text()).get("fingerprint") != fingerprint:
        if not args.restart:
            raise PlannerInputError(InputIssue("--out", f"{out} holds the rows of another sweep (or other settings)",
                                               "choose another --out, or pass --restart to discard them"))
        (out / ROWS_FILE).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"name": spec.name, "points": len(points), "fingerprint": fingerprint,
                                    "spec": spec.model_dump(mode="json")}, indent=2) + "\n")
    console.print(f"{spec.name}: {len(points)} problems from {args.spec} ({'Ray ' + args.ray if args.ray else f'{args.workers} local worker(s)'})",
                  markup=False)
    try:
        with Progress("solving points") as progress:
            rows = run_sweep(points, out, base_dir, time_limit, spec.seed, workers=args.workers, ray_address=args.ray,
                             progress=lambda done, total: progress(done, total, f"{done}/{total} points"))
    except KeyboardInterrupt:
        _write_partial(points, out, spec.name, console)
        raise
    axes = [a.column() for a in spec.all_axes()]
    written = write_tables(rows, out, spec.name) + write_charts(rows, axes, out, spec.name)
    if not any(path.suffix == ".parquet" for path in written):
        console.print("no Parquet table: pyarrow is not installed (pip install \".[sweep]\" adds it); the CSV holds the same rows",
                      markup=False)
    summary = summary_lines(rows, axes)
    (out / "summary.md").write_text(f"# {spec.name}\n\n" + "\n".join(f"- {line}" for line in summary) + "\n")
    for line in summary:
        console.print(f"  - {line}", markup=False)
    for path in [*written, out / "summary.md"]:
        console.print(f"wrote {path}", markup=False)
    return EXIT_OK if any(r.get("usd_per_million_output_tokens") is not None for r in rows) else EXIT_INFEASIBLE
