"""`planner cache`, `prices` and `lifecycle`: serving economics beyond one plan."""

import argparse
from pathlib import Path

from rich.console import Console

from planner.cli.common import (
    EXIT_INFEASIBLE,
    EXIT_OK,
    resolve_problem_path,
    write_json,
)
from planner.errors import InputIssue, PlannerInputError, unknown_name_issue
from planner.hardware.catalog import load_hardware_catalog
from planner.model.architecture import param_counts
from planner.model.catalog import load_model_catalog
from planner.problem.resolve import resolve_problem
from planner.problem.schema import load_problem

__all__ = ["cache_command", "lifecycle_command", "prices_command"]


def cache_command(args: argparse.Namespace, console: Console) -> int:
    from planner.output.cache_report import cache_economics, cache_record, render_cache
    from planner.solver.solve import solve

    path = resolve_problem_path(args.problem)
    resolved = resolve_problem(load_problem(path), base_dir=path.parent, source=str(path))
    with console.status("solving the problem for its deployments..."):
        result = solve(resolved, time_limit_s=args.time_limit, explain=False)
    if not result.has_plan:
        console.print(f"[red]No plan ({result.status})[/red]: run `planner solve {args.problem}` to see why")
        return EXIT_INFEASIBLE
    names = [w.name for w in resolved.workloads]
    if args.workload and args.workload not in names:
        raise PlannerInputError(unknown_name_issue("--workload", "workload", args.workload, names))
    items = [cache_economics(result, w) for w in names if not args.workload or w == args.workload]
    render_cache(items, console)
    if args.json:
        write_json(args.json, cache_record(items), console)
    return EXIT_OK


def prices_command(args: argparse.Namespace, console: Console) -> int:
    from planner.studies.prices import load_price_sheet, read_prices

    path = Path(args.sheet)
    if not path.exists():
        raise PlannerInputError(InputIssue("SHEET", f"{path} not found", "pass a price sheet YAML (see examples/prices/)"))
    sheet = load_price_sheet(path)
    reading = read_prices(sheet, model_id=args.model, accelerator_id=args.accelerator, precision=args.precision,
                          active_params=args.active_params)
    console.print(f"[bold]{sheet.provider}[/bold] (source: {sheet.source})", markup=True, highlight=False)
    for line in reading.lines:
        console.print(line, markup=False)
    if args.json:
        write_json(args.json, {"provider": sheet.provider, "implied_kv_bytes_per_token": reading.implied_kv_bytes_per_token,
                                "memory_bound_factor": reading.memory_bound_factor, "hit_discount": reading.hit_discount,
                                "implied_tiers": [{"retention_s": r, "tier": t} for r, t in reading.implied_tiers],
                                "working": list(reading.lines)}, console)
    return EXIT_OK


def lifecycle_command(args: argparse.Namespace, console: Console) -> int:
    from planner.physics.cost import usd_per_s
    from planner.physics.roofline import matmul_flops
    from planner.precision import FlopsFormat
    from planner.studies.lifecycle import TrainingLayout, lifecycle
    from planner.units import BILLION, SECONDS_PER_DAY, TOKENS_PER_MILLION

    hardware, models = load_hardware_catalog(), load_model_catalog()
    if args.accelerator not in hardware.accelerators:
        raise PlannerInputError(unknown_name_issue("--accelerator", "accelerator", args.accelerator, hardware.accelerators))
    if args.active_params is None and args.model not in models:
        raise PlannerInputError(unknown_name_issue("--model", "model", args.model, models))
    n = args.active_params or param_counts(models[args.model]).active_matmul
    accel = hardware.accelerators[args.accelerator]
    fmt = FlopsFormat(args.precision)
    if fmt not in accel.dense_flops_per_s:
        raise PlannerInputError(InputIssue("--precision", f"{accel.id} has no {fmt} tensor cores", f"use one of {', '.join(accel.dense_flops_per_s)}"))
    flops_per_s = accel.achievable_flops_per_s(fmt)
    training = TrainingLayout(accel.id, args.training_accelerators, flops_per_s, accel.price_usd_per_hour, args.pp, args.micro_batches)
    if args.problem:
        from planner.solver.solve import solve

        path = resolve_problem_path(args.problem)
        resolved = resolve_problem(load_problem(path), base_dir=path.parent, source=str(path))
        result = solve(resolved, explain=False)
        if not result.has_plan:
            console.print(f"[red]No plan for {args.problem} ({result.status})[/red]")
            return EXIT_INFEASIBLE
        w = resolved.workloads[0].name
        per_token = result.workload_usd_per_million_output_tokens(w) / TOKENS_PER_MILLION
        basis = f"the plan of {path.stem}, workload {w}"
    elif args.inference_usd_per_million is not None:
        per_token, basis = args.inference_usd_per_million / TOKENS_PER_MILLION, "given"
    else:
        per_token = float(matmul_flops(n, 1)) / flops_per_s * usd_per_s(accel.price_usd_per_hour, 1)
        basis = f"compute-bound lower bound on {accel.id}; pass --problem for a planned cost"
    result = lifecycle(n, args.serving_tokens_per_s, args.lifetime_days * SECONDS_PER_DAY, per_token, training,
                       args.rl_flops_per_token, args.pretrain_tokens, basis)
    console.print(f"[bold]Lifecycle of a {n / BILLION:.0f}B-active-parameter model[/bold] (claim 11)")
    for line in result.lines:
        console.print(f"  - {line}", markup=False)
    if args.json:
        write_json(args.json, {"active_params": n, "inference_tokens": result.inference_tokens,
                                "pretrain_tokens_equal_flops": result.pretrain_tokens_equal_flops,
                                "pretrain_tokens_equal_cost": result.pretrain_tokens_equal_cost,
                                "rl_tokens_equal_flops": result.rl_tokens_equal_flops, "chinchilla_tokens": result.chinchilla_tokens,
                                "pipeline_bubble": training.bubble, "working": list(result.lines)}, console)
    return EXIT_OK
