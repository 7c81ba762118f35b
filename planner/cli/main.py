"""Command-line interface: parse, load validated inputs, call the library, render.

Exit codes: 0 success, 2 bad input (message names the field and the fix), 3 infeasible (the
deployment or problem cannot be served; the output says why).
"""

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from planner import __version__
from planner.errors import InputIssue, PlannerInputError, unknown_name_issue
from planner.hardware.catalog import HardwareCatalog, load_hardware_catalog
from planner.model.architecture import kv_bytes_per_token, param_counts
from planner.model.catalog import load_model_catalog
from planner.modes import OverlapPolicy, ServingRole
from planner.output.report import estimate_record, render_estimate
from planner.paths import data_dir
from planner.physics.deployment import Layout, layout_issues
from planner.physics.estimate import (
    DEFAULT_PREFILL_CHUNK_TOKENS,
    DeploymentInputs,
    estimate,
)
from planner.physics.kv_cache import cache_use, load_tier_specs, tiers_for
from planner.precision import Precision
from planner.problem.spec import (
    PrecisionSpec,
    load_problem,
    problem_json_schema,
    resolve_precisions,
    resolve_problem,
)

__all__ = ["main"]

EXIT_OK, EXIT_INVALID_PLAN, EXIT_BAD_INPUT, EXIT_INFEASIBLE = 0, 1, 2, 3
_FLAG_OF_FIELD = {"layout.tp": "--tp", "layout.ep": "--ep", "layout.pp": "--pp", "layout.dp_attn": "--dp-attn", "layout.batch": "--batch"}


def _write_text(path: str, text: str, console: Console | None = None) -> None:
    """Write `text` to `path` (creating folders) and, given a console, say so."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    if console is not None:
        console.print(f"wrote {path}")


def _write_json(path: str, record: dict, console: Console | None = None) -> None:
    _write_text(path, json.dumps(record, indent=2, default=str) + "\n", console)


def resolve_problem_path(text: str) -> Path:
    """A problem path, or the name of a bundled problem (with or without .yaml)."""
    path = Path(text)
    if path.exists():
        return path
    bundled = data_dir("problems")
    for candidate in (bundled / text, bundled / f"{text}.yaml"):
        if candidate.exists():
            return candidate
    names = sorted(p.stem for p in bundled.glob("*.yaml"))
    raise PlannerInputError(unknown_name_issue("PROBLEM", "problem file", text, names))


# ---------------------------------------------------------------------------------------------
# estimate


def _estimate_inputs(args: argparse.Namespace) -> DeploymentInputs:
    hardware: HardwareCatalog = load_hardware_catalog()
    models = load_model_catalog()
    arch, spec, rack_id = None, PrecisionSpec(), None
    isl, osl = 2048, 256
    cache_request = None
    if args.problem:
        path = resolve_problem_path(args.problem)
        resolved = resolve_problem(load_problem(path), base_dir=path.parent, source=str(path))
        hardware = resolved.hardware
        names = [w.name for w in resolved.workloads]
        workload = resolved.workloads[names.index(args.workload)] if args.workload in names else resolved.workloads[0]
        if args.workload and args.workload not in names:
            raise PlannerInputError(unknown_name_issue("--workload", "workload", args.workload, names))
        model = resolved.models[workload.model_key]
        arch, spec, rack_id = model.arch, model.precisions, resolved.rack_counts[0][0].id
        isl, osl = workload.input_tokens, workload.output_tokens
        cache_request = workload.prefix_cache
    issues = []
    if args.model:
        if args.model not in models:
            issues.append(unknown_name_issue("--model", "model", args.model, models))
        else:
            arch = models[args.model]
    if args.rack:
        if args.rack not in hardware.racks:
            issues.append(unknown_name_issue("--rack", "rack", args.rack, hardware.racks))
        rack_id = args.rack
    if arch is None and not args.model:
        issues.append(InputIssue("--model", "no model given", "pass --model NAME (see `planner catalog`) or a problem file"))
    if rack_id is None and not args.rack:
        issues.append(InputIssue("--rack", "no rack given", "pass --rack NAME (see `planner catalog`) or a problem file"))
    if args.batch is None:
        issues.append(InputIssue("--batch", "no decode batch given", "pass --batch N (sequences in flight per replica)"))
    tier_id = args.cache_tier or (cache_request.tier if cache_request is not None and cache_request.tier != "auto" else None)
    if args.cache_tier and cache_request is None:
        issues.append(InputIssue("--cache-tier", "no prompt cache to place: the workload declares no prefix_cache",
                                 "pass a problem whose workload has prefix_cache, or drop --cache-tier"))
    if issues:
        raise PlannerInputError(issues)
    rack = hardware.racks[rack_id]
    cache = None
    if tier_id is not None and cache_request is not None:
        tiers = [t.id for t in tiers_for(rack.accelerator)]
        if tier_id not in tiers:
            raise PlannerInputError(unknown_name_issue("--cache-tier", f"KV tier on {rack.accelerator.id}", tier_id, tiers))
        cache = cache_use(cache_request, tier_id, rack.accelerator)
    if args.price is not None:
        hardware = hardware.with_overrides(price_usd_per_hour={rack.accelerator.id: args.price})
        rack = hardware.racks[rack_id]
    layout = Layout(tp=args.tp, ep=args.ep, pp=args.pp, dp_attn=args.dp_attn) if args.dp_attn else Layout.with_default_dp_attn(args.tp, args.ep, args.pp)
    issues = [InputIssue(_FLAG_OF_FIELD.get(i.field, i.field), i.problem, i.fix.replace("dp_attn", "--dp-attn"))
              for i in layout_issues(arch, layout, args.batch)]
    if issues:
        raise PlannerInputError(issues)
    flags = {"weights": args.weights_precision, "kv_cache": args.kv_precision,
             "activations": args.activations_precision, "compute": args.compute_precision}
    spec = PrecisionSpec(**(spec.model_dump() | {k: v for k, v in flags.items() if v is not None}))
    precisions, notes = resolve_precisions(spec, arch, rack.accelerator, field_name="--compute-precision")
    return DeploymentInputs(
        arch=arch, rack=rack, layout=layout, batch_per_replica=args.batch,
        input_tokens=args.isl or isl, output_tokens=args.osl or osl, precisions=precisions,
        overheads=hardware.overheads, overlap=OverlapPolicy(args.overlap), prefill_chunk_tokens=args.prefill_chunk, notes=notes,
        role=ServingRole(args.role), prefix_cache=cache,
    )


def _cmd_estimate(args: argparse.Namespace, console: Console) -> int:
    inputs = _estimate_inputs(args)
    result = estimate(inputs)
    render_estimate(result, console)
    if args.json:
        _write_json(args.json, estimate_record(result), console)
    return EXIT_OK if result.fits else EXIT_INFEASIBLE


# ---------------------------------------------------------------------------------------------
# solve


def _cmd_solve(args: argparse.Namespace, console: Console) -> int:
    from planner.output.plan_report import render_solve, solve_record
    from planner.solver.solve import solve

    path = resolve_problem_path(args.problem)
    resolved = resolve_problem(load_problem(path), base_dir=path.parent, source=str(path))
    with console.status("enumerating candidates and solving...") as status:
        result = solve(resolved, time_limit_s=args.time_limit, seed=args.seed, workers=args.workers,
                       progress=lambda text: status.update(f"evaluating {text}"))
    render_solve(result, console)
    if args.json:
        _write_json(args.json, solve_record(result), console)
    return EXIT_OK if result.has_plan else EXIT_INFEASIBLE


# ---------------------------------------------------------------------------------------------
# plans: export, check, view


def load_plan(text: str) -> tuple[dict, Path]:
    """A plan JSON written by `planner solve --json`, checked for the fields every command needs."""
    path = Path(text)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlannerInputError(InputIssue(text, "file not found", "pass the JSON written by `planner solve PROBLEM --json PATH`")) from None
    except json.JSONDecodeError as exc:
        raise PlannerInputError(InputIssue(text, f"not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}",
                                           "pass the JSON written by `planner solve --json`")) from None
    if not isinstance(record, dict) or record.get("format") != "llm-deployment-plan":
        raise PlannerInputError(InputIssue(text, "not a plan written by `planner solve --json`", "solve a problem with --json PATH first"))
    if record.get("format_version") != 1:
        raise PlannerInputError(InputIssue(f"{text}: format_version", f"version {record.get('format_version')} is not supported",
                                           "re-solve the problem with this planner version"))
    if not record.get("deployments"):
        raise PlannerInputError(InputIssue(f"{text}: deployments", f"the plan has no deployments (status {record.get('status')})",
                                           "solve a feasible problem first"))
    return record, path


def _resolved_from_plan(record: dict, path: Path):
    from planner.problem.spec import parse_problem

    if "problem_spec" not in record:
        raise PlannerInputError(InputIssue(f"{path}: problem_spec", "missing", "re-solve the problem: plans embed their problem"))
    base = Path(record.get("problem_dir") or path.parent)
    return resolve_problem(parse_problem(record["problem_spec"], source=f"{path}: problem_spec"), base_dir=base, source=str(path))


def _cmd_export(args: argparse.Namespace, console: Console) -> int:
    from planner.output.export import export_plan

    record, path = load_plan(args.plan)
    if args.output and Path(args.output).resolve() == Path(path).resolve():
        raise PlannerInputError(InputIssue("-o", f"{args.output} is the plan being exported; writing there would replace it",
                                           "choose another output path, e.g. placement.json"))
    text = export_plan(record, args.format)
    if args.output:
        _write_text(args.output, text, console)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _cmd_check(args: argparse.Namespace, console: Console) -> int:
    from planner.output.validate import check_plan

    record, path = load_plan(args.plan)
    resolved = _resolved_from_plan(record, path)
    violations = check_plan(resolved, record, placement=True)
    if not violations:
        n = sum(len(d.get("placement", [])) for d in record["deployments"])
        console.print(f"[green]valid[/green]: {len(record['deployments'])} deployments on {n} accelerators; HBM, latency limits, "
                      "demand, racks, placement and expert maps re-derived from the problem and the roofline")
        return EXIT_OK
    err = Console(stderr=True, width=140, highlight=False)
    err.print(f"{path}: {len(violations)} problem(s):", markup=False)
    for v in violations:
        err.print(f"  - {v}", markup=False)
    return EXIT_INVALID_PLAN


def _cmd_view(args: argparse.Namespace, console: Console) -> int:
    from planner.output.plan_view import render_placement

    record, _ = load_plan(args.plan)
    render_placement(record, console, args.rack)
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# sweeps: compare, frontier, curve


def _problem_arg(text: str):
    path = resolve_problem_path(text)
    return load_problem(path), path


class _Progress:
    """A rich progress bar on standard error for sweeps: (done, total, what) callbacks."""

    def __init__(self, label: str):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                            console=Console(stderr=True), transient=True)
        self.task = None

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def __call__(self, done: int, total: int, what: str) -> None:
        if self.task is None:
            self.task = self.bar.add_task(what, total=total)
        self.bar.update(self.task, completed=done, description=what)


def _cmd_compare(args: argparse.Namespace, console: Console) -> int:
    from planner.output.sweep_report import compare_record, render_compare
    from planner.studies.sweeps import compare_racks

    problem, path = _problem_arg(args.problem)
    racks = [r.strip() for r in args.racks.split(",") if r.strip()] if args.racks else list(load_hardware_catalog().racks)
    with _Progress("planning on") as progress:
        rows = compare_racks(problem, racks, base_dir=path.parent, count=args.count, time_limit_s=args.time_limit, progress=progress)
    title = f"{problem.name}: the same workloads on each rack type ({'as many racks as needed' if args.count is None else f'{args.count} per type'})"
    render_compare(rows, console, title)
    if args.plot:
        from planner.output.charts import plot_compare

        console.print(f"wrote {plot_compare(rows, args.plot, title)}")
    if args.json:
        _write_json(args.json, compare_record(rows), console)
    return EXIT_OK if any(r.usd_per_million_output_tokens is not None for r in rows) else EXIT_INFEASIBLE


def _cmd_frontier(args: argparse.Namespace, console: Console) -> int:
    from planner.output.sweep_report import (
        frontier_csv,
        frontier_record,
        render_frontier,
    )
    from planner.studies.sweeps import sweep_frontier

    problem, path = _problem_arg(args.problem)
    with _Progress("sweeping") as progress:
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
        _write_text(args.csv, frontier_csv(frontier), console)
    if args.json:
        _write_json(args.json, frontier_record(frontier), console)
    return EXIT_OK if frontier.frontier else EXIT_INFEASIBLE


def _cmd_curve(args: argparse.Namespace, console: Console) -> int:
    from planner.output.sweep_report import curve_csv, curve_record, render_curve
    from planner.studies.sweeps import batch_curve

    problem, path = _problem_arg(args.problem)
    with console.status("solving and evaluating the batch range..."):
        curve = batch_curve(problem, base_dir=path.parent, workload=args.workload, points=args.points)
    render_curve(curve, console)
    if args.plot:
        from planner.output.charts import plot_curve

        title = f"{curve.model} on {curve.rack_id}, {curve.layout.describe()}"
        console.print(f"wrote {plot_curve(curve, args.plot, title)}")
    if args.csv:
        _write_text(args.csv, curve_csv(curve), console)
    if args.json:
        _write_json(args.json, curve_record(curve), console)
    return EXIT_OK


def _cmd_cache(args: argparse.Namespace, console: Console) -> int:
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
        _write_json(args.json, cache_record(items), console)
    return EXIT_OK


def _cmd_prices(args: argparse.Namespace, console: Console) -> int:
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
        _write_json(args.json, {"provider": sheet.provider, "implied_kv_bytes_per_token": reading.implied_kv_bytes_per_token,
                                "memory_bound_factor": reading.memory_bound_factor, "hit_discount": reading.hit_discount,
                                "implied_tiers": [{"retention_s": r, "tier": t} for r, t in reading.implied_tiers],
                                "working": list(reading.lines)}, console)
    return EXIT_OK


def _cmd_lifecycle(args: argparse.Namespace, console: Console) -> int:
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
    flops_per_s = accel.dense_flops_per_s[fmt] * accel.compute_fraction_by_format[fmt]
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
        _write_json(args.json, {"active_params": n, "inference_tokens": result.inference_tokens,
                                "pretrain_tokens_equal_flops": result.pretrain_tokens_equal_flops,
                                "pretrain_tokens_equal_cost": result.pretrain_tokens_equal_cost,
                                "rl_tokens_equal_flops": result.rl_tokens_equal_flops, "chinchilla_tokens": result.chinchilla_tokens,
                                "pipeline_bubble": training.bubble, "working": list(result.lines)}, console)
    return EXIT_OK


def _rl_factor(text: str) -> float:
    value = float(text)
    if not 2.0 <= value <= 6.0:
        raise argparse.ArgumentTypeError(f"RL costs 2 (rollouts only) to 6 (backward on every rollout) FLOPs per parameter and token, got {text}")
    return value


# ---------------------------------------------------------------------------------------------
# schema and catalog


def _cmd_schema(args: argparse.Namespace, console: Console) -> int:
    if args.markdown:
        from planner.problem.schema_doc import schema_markdown

        text = schema_markdown().rstrip("\n")
    else:
        text = json.dumps(problem_json_schema(), indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    return EXIT_OK


def catalog_record() -> dict:
    hardware, models = load_hardware_catalog(), load_model_catalog()
    accelerators = [{
        "id": a.id, "name": a.name, "hbm_capacity_bytes": a.hbm_capacity_bytes, "hbm_bandwidth_bytes_per_s": a.hbm_bandwidth_bytes_per_s,
        "dense_flops_per_s": {str(k): v for k, v in a.dense_flops_per_s.items()},
        "scale_up_bandwidth_bytes_per_s": a.scale_up_bandwidth_bytes_per_s, "scale_out_bandwidth_bytes_per_s": a.scale_out_bandwidth_bytes_per_s,
        "price_usd_per_hour": a.price_usd_per_hour, "price_basis": a.price_basis,
    } for a in hardware.accelerators.values()]
    racks = [{
        "id": r.id, "name": r.name, "accelerator": r.accelerator.id, "accelerators": r.n_accelerators,
        "topology": r.topology.kind, "dims": list(r.topology.dims), "domain_hbm_bytes": r.n_accelerators * r.accelerator.hbm_capacity_bytes,
    } for r in hardware.racks.values()]
    model_rows = []
    for m in models.values():
        counts = param_counts(m)
        model_rows.append({
            "id": m.id, "name": m.name, "total_params": counts.total, "active_params": counts.active_matmul,
            "layers": m.n_layers, "attention": str(m.attention.kind),
            "routed_experts": m.moe.n_routed_experts if m.moe else 0, "experts_per_token": m.moe.experts_per_token if m.moe else 0,
            "kv_bytes_per_token_bf16": kv_bytes_per_token(m, 2.0), "max_context_tokens": m.max_context_tokens,
        })
    tiers = [{
        "id": s.id, "name": s.name,
        "capacity": s.capacity or f"{s.capacity_gb_per_accelerator:g} GB per accelerator",
        "read_bandwidth": (f"{s.read_bandwidth} x {s.read_fraction:g}" if s.read_fraction else s.read_bandwidth) if s.read_bandwidth
        else f"{s.read_gb_per_s_per_accelerator:g} GB/s per accelerator",
        "first_byte_latency_s": s.first_byte_latency_ms / 1e3,
        "cost": s.cost or f"{s.usd_per_gb_month:g} USD per GB-month", "sources": dict(s.sources),
    } for s in load_tier_specs()]
    return {"accelerators": accelerators, "racks": racks, "models": model_rows, "kv_tiers": tiers}


def _cmd_catalog(args: argparse.Namespace, console: Console) -> int:
    from planner.output.catalog_view import render_catalog

    record = catalog_record()
    if args.json:
        _write_json(args.json, record)
    render_catalog(record, console, args.section)
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# parser


def _add_estimate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("estimate", help="evaluate one fixed deployment and show its roofline breakdown",
                       description="Evaluate one replica: step-time terms, TPOT, TTFT, HBM use and cost. "
                                   "Exit code 3 when the deployment does not fit in HBM.")
    p.add_argument("problem", nargs="?", help="optional problem file (or bundled problem name) giving model, rack and workload")
    p.add_argument("--workload", help="workload of the problem to use (default: the first)")
    p.add_argument("--model", help="model id, e.g. llama-3.1-70b")
    p.add_argument("--rack", help="rack / scale-up unit id, e.g. hgx-h100")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree of attention and dense weights")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages")
    p.add_argument("--dp-attn", type=int, default=None, help="attention data-parallel ranks per stage (default: ep/tp when ep > tp)")
    p.add_argument("--batch", type=int, help="sequences in flight per replica (all micro-batches)")
    p.add_argument("--isl", type=int, help="input (prompt) tokens per request (default 2048, or the problem's)")
    p.add_argument("--osl", type=int, help="output tokens per request (default 256, or the problem's)")
    precisions = [p.value for p in Precision]
    p.add_argument("--weights-precision", choices=precisions, help="weight format (default: the model's native one)")
    p.add_argument("--kv-precision", choices=precisions, help="KV-cache format (default bf16)")
    p.add_argument("--activations-precision", choices=precisions, help="activation format (default bf16)")
    p.add_argument("--compute-precision", choices=precisions, help="matmul format (default: the weights')")
    p.add_argument("--price", type=float, help="USD per accelerator-hour instead of the catalog estimate")
    p.add_argument("--overlap", choices=[o.value for o in OverlapPolicy], default=OverlapPolicy.SERIAL.value,
                   help="serial: communication adds to the step (default); overlapped: hidden behind compute/memory")
    p.add_argument("--prefill-chunk", type=int, default=DEFAULT_PREFILL_CHUNK_TOKENS, help="tokens per prefill forward pass")
    p.add_argument("--role", choices=[r.value for r in ServingRole], default=ServingRole.AGGREGATED.value,
                   help="aggregated (prefill rides in the decode steps, default), or one replica of a prefill or decode pool")
    p.add_argument("--cache-tier", metavar="TIER",
                   help="with a problem whose workload declares prefix_cache: the KV tier its cached prefixes wait in "
                        "(hbm, host-dram, local-flash, remote-storage; default: the problem's tier unless it is auto)")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON (SI units)")
    p.set_defaults(func=_cmd_estimate)


def _positive(kind: type) -> object:
    """argparse type: a number of `kind` greater than zero."""

    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def _add_solve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("solve", help="choose the cheapest deployment of every workload on the fleet (CP-SAT)",
                       description="Enumerate layouts with the roofline, let CP-SAT choose rack types, layouts, batches and "
                                   "replica counts, and explain the plan. Exit code 0 with a plan, 2 for bad input, 3 when infeasible.")
    p.add_argument("problem", help="problem file, or the name of a bundled problem (see problems/)")
    p.add_argument("--json", metavar="PATH", help="write the plan as JSON (SI units)")
    p.add_argument("--time-limit", type=_positive(float), default=None, help="CP-SAT time limit in seconds (default: the problem's)")
    p.add_argument("--seed", type=int, default=None, help="CP-SAT random seed (default: the problem's)")
    p.add_argument("--workers", type=_positive(int), default=None, help="CP-SAT worker threads (default: the problem's)")
    p.set_defaults(func=_cmd_solve)


def _add_plan_commands(sub: argparse._SubParsersAction) -> None:
    from planner.output.export import FORMATS

    export = sub.add_parser("export", help="export a solved plan for a serving stack",
                            description="Write the plan's placement (json) or launch scripts for vLLM, SGLang or TensorRT-LLM.")
    export.add_argument("plan", help="plan JSON written by `planner solve --json`")
    export.add_argument("--format", choices=FORMATS, default="json", help="json: placement document; others: a launch script")
    export.add_argument("-o", "--output", help="write to a file instead of standard output")
    export.set_defaults(func=_cmd_export)
    check = sub.add_parser("check", help="verify a plan independently of the solver (exit 0 valid, 1 invalid)",
                           description="Reload a plan and re-derive everything from its problem and the roofline: HBM, latency "
                                       "limits, demand, rack packing, accelerator placement and expert maps.")
    check.add_argument("plan", help="plan JSON written by `planner solve --json`")
    check.set_defaults(func=_cmd_check)
    view = sub.add_parser("view", help="show a plan's placement rack by rack")
    view.add_argument("plan", help="plan JSON written by `planner solve --json`")
    view.add_argument("--rack", help="only this rack instance (gb200-nvl72#0) or rack type")
    view.set_defaults(func=_cmd_view)


def _add_sweeps(sub: argparse._SubParsersAction) -> None:
    compare = sub.add_parser("compare", help="plan the same workloads on each rack generation, side by side",
                             description="Re-plan the problem on each rack type alone and compare cost per token, throughput per "
                                         "accelerator, TPOT, accelerators and racks, and the binding limit.")
    compare.add_argument("problem", help="problem file, or the name of a bundled problem")
    compare.add_argument("--racks", help="comma-separated rack ids (default: every rack type in the catalog)")
    compare.add_argument("--count", type=_positive(int), default=None, help="racks of each type (default: as many as the plan needs)")
    compare.add_argument("--time-limit", type=_positive(float), default=None, help="CP-SAT time limit per rack type, seconds")
    compare.add_argument("--plot", metavar="PNG", help="also draw the comparison")
    compare.add_argument("--json", metavar="PATH", help="also write the rows as JSON (SI units)")
    compare.set_defaults(func=_cmd_compare)
    frontier = sub.add_parser("frontier", help="the Pareto frontier of cost per token against per-user speed",
                              description="Sweep one workload's TPOT limit from the fastest achievable to the HBM-bound batch, solving "
                                          "each point with CP-SAT warm-started from the previous one; report the frontier.")
    frontier.add_argument("problem", help="problem file, or the name of a bundled problem")
    frontier.add_argument("--workload", help="workload to sweep (needed when the problem has several)")
    frontier.add_argument("--points", type=_positive(int), default=16, help="TPOT limits to try (default 16)")
    frontier.add_argument("--min-tpot-ms", type=_positive(float), default=None, help="tightest TPOT limit (default: the fastest layout's)")
    frontier.add_argument("--max-tpot-ms", type=_positive(float), default=None, help="loosest TPOT limit (default: HBM-bound batches)")
    frontier.add_argument("--time-limit", type=_positive(float), default=None, help="CP-SAT time limit per point, seconds")
    frontier.add_argument("--plot", metavar="PNG", help="also draw the frontier")
    frontier.add_argument("--csv", metavar="CSV", help="also write every point as CSV")
    frontier.add_argument("--json", metavar="PATH", help="also write every point as JSON (SI units)")
    frontier.set_defaults(func=_cmd_frontier)
    curve = sub.add_parser("curve", help="cost per token and TPOT against batch size for the planned deployment",
                           description="Solve the problem, take the workload's deployment and evaluate it over its batch range: "
                                       "weight amortisation (cost ~ 1/B) down to the compute and KV floor, the plan's batch marked.")
    curve.add_argument("problem", help="problem file, or the name of a bundled problem")
    curve.add_argument("--workload", help="workload to use (needed when the problem has several)")
    curve.add_argument("--points", type=_positive(int), default=48, help="batch sizes to evaluate (default 48)")
    curve.add_argument("--plot", metavar="PNG", help="also draw the curve")
    curve.add_argument("--csv", metavar="CSV", help="also write every batch as CSV")
    curve.add_argument("--json", metavar="PATH", help="also write the curve as JSON (SI units)")
    curve.set_defaults(func=_cmd_curve)


def _add_economics(sub: argparse._SubParsersAction) -> None:
    cache = sub.add_parser("cache", help="prompt-caching economics: break-even retention per KV tier, hit discount",
                           description="Solve the problem, then for each workload's deployment and each KV tier: the cost of "
                                       "holding cached tokens, the retention beyond which recomputing is cheaper, reload time, "
                                       "and the discount of a hit against a miss.")
    cache.add_argument("problem", help="problem file, or the name of a bundled problem")
    cache.add_argument("--workload", help="only this workload")
    cache.add_argument("--time-limit", type=_positive(float), default=None, help="CP-SAT time limit, seconds")
    cache.add_argument("--json", metavar="PATH", help="also write the figures as JSON (SI units)")
    cache.set_defaults(func=_cmd_cache)
    prices = sub.add_parser("prices", help="read a provider's prices backwards: KV bytes per token, memory-boundness, cache tiers",
                            description="From public prices (input, output, cached input, a long-context step, cache-write "
                                        "retentions) infer what they imply under the roofline, with the working shown.")
    prices.add_argument("sheet", help="price sheet YAML (examples/prices/ has two)")
    prices.add_argument("--model", default="deepseek-v3", help="model whose active parameters and KV format to assume (default deepseek-v3)")
    prices.add_argument("--active-params", type=_positive(float), default=None, help="assume this many active parameters instead")
    prices.add_argument("--accelerator", default="gb200", help="accelerator whose F, BW and price to assume (default gb200)")
    prices.add_argument("--precision", default="bf16", choices=["bf16", "fp8", "fp4"], help="matched precision of F and the KV (default bf16)")
    prices.add_argument("--json", metavar="PATH", help="also write the reading as JSON")
    prices.set_defaults(func=_cmd_prices)
    life = sub.add_parser("lifecycle", help="pre-training, RL and inference over a model's life, and how far past Chinchilla",
                          description="Compute and cost of pre-training (6ND), RL (2-6ND) and inference (2ND) for a model, a "
                                      "serving rate and a lifetime; the token counts where they balance, the Chinchilla ratio, "
                                      "and the pipeline bubble of the training layout.")
    life.add_argument("--model", default="deepseek-v3", help="catalog model for the active parameters (default deepseek-v3)")
    life.add_argument("--active-params", type=_positive(float), default=None, help="active parameters instead of a catalog model")
    life.add_argument("--serving-tokens-per-s", type=_positive(float), default=5e7, help="tokens served per second (default 5e7, the lecture's frontier scale)")
    life.add_argument("--lifetime-days", type=_positive(float), default=60, help="days the model serves (default 60)")
    life.add_argument("--pretrain-tokens", type=_positive(float), default=None, help="compare with an actual pre-training token count")
    life.add_argument("--rl-flops-per-token", type=_rl_factor, default=4.0, help="RL FLOPs per parameter and token, 2-6 (default 4)")
    life.add_argument("--problem", help="price inference tokens with this problem's plan (its first workload)")
    life.add_argument("--inference-usd-per-million", type=_positive(float), default=None, help="or give the inference cost per million tokens")
    life.add_argument("--accelerator", default="gb200", help="training accelerator (default gb200)")
    life.add_argument("--precision", default="bf16", choices=["bf16", "fp8", "fp4"], help="training matmul format (default bf16)")
    life.add_argument("--training-accelerators", type=_positive(int), default=8192, help="accelerators training (default 8192)")
    life.add_argument("--pp", type=_positive(int), default=8, help="pipeline stages of the training layout (default 8)")
    life.add_argument("--micro-batches", type=_positive(int), default=32, help="micro-batches per training step (default 32)")
    life.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    life.set_defaults(func=_cmd_lifecycle)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="planner", description="Plan LLM deployments on clusters and cost each token.")
    parser.add_argument("--version", action="version", version=f"planner {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_solve(sub)
    _add_estimate(sub)
    _add_plan_commands(sub)
    _add_sweeps(sub)
    _add_economics(sub)
    schema = sub.add_parser("schema", help="print the JSON Schema of problem files (or a Markdown reference)")
    schema.add_argument("--markdown", action="store_true", help="the field reference as Markdown tables (as in the README)")
    schema.add_argument("-o", "--output", help="write to a file instead of standard output")
    schema.set_defaults(func=_cmd_schema)
    catalog = sub.add_parser("catalog", help="list accelerators, racks, models and KV-cache tiers with their key numbers")
    catalog.add_argument("section", nargs="?", choices=["accelerators", "racks", "models", "kv-tiers"], help="only this section")
    catalog.add_argument("--json", metavar="PATH", help="also write the catalog as JSON")
    catalog.set_defaults(func=_cmd_catalog)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console(width=max(140, Console().width), highlight=False)
    try:
        return args.func(args, console)
    except PlannerInputError as exc:
        Console(stderr=True, width=120, highlight=False).print(exc.render(), markup=False)
        return EXIT_BAD_INPUT
