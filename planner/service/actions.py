"""What each endpoint does: the options read by the CLI's parser, the same library calls as the
CLI's command handlers (planner/cli/), and the same JSON records the CLI writes with --json."""

import json
import time
from dataclasses import dataclass

from planner.cli.catalog import catalog_record
from planner.cli.common import finite, refuse_failing_plan
from planner.errors import InputIssue, PlannerInputError
from planner.hardware.catalog import load_hardware_catalog
from planner.limits import MAX_TIME_LIMIT_S
from planner.modes import Confidence
from planner.output.export import export_plan
from planner.output.placement_picture import COLOUR_BY, placement_svg
from planner.output.plan import Plan
from planner.service.inputs import (
    bundled_problems,
    command_args,
    problem_input,
    resolved_plan_problem,
)
from planner.units import MS

__all__ = ["ACTIONS", "Limits", "OutOfTime", "action_answer", "catalog_answer", "problems_answer", "schema_answer", "to_json"]

PLACEHOLDER = "PROBLEM"  # the positional problem argument; the problem itself comes from the request


class OutOfTime(Exception):
    """A request's work passed its deadline (checked between the steps the library reports)."""


@dataclass(frozen=True)
class Limits:
    """The server's limits on one request's work."""

    time_limit_s: float = 30.0  # CP-SAT time limit of one solve (a frontier's every point), at most
    solver_workers: int = 2  # CP-SAT threads of one solve, at most
    deadline: float | None = None  # time.monotonic() after which the request's work stops at its next step

    def time_limit(self, requested: float | None, problem_default: float) -> float:
        return min(requested if requested is not None else problem_default, self.time_limit_s, MAX_TIME_LIMIT_S)

    def check(self, *_progress) -> None:
        """A progress callback: stops the work (OutOfTime) once the deadline has passed, so that an
        abandoned request (answered 504) frees its worker after one more step, not after every step."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise OutOfTime()


def to_json(record: object) -> bytes:
    """The CLI's JSON encoding (planner.cli.common.write_json): NaN and infinities as null."""
    return json.dumps(finite(record), default=str, allow_nan=False).encode()


def _options(body: dict, *reserved: str) -> dict:
    return {k: v for k, v in body.items() if k not in reserved}


def solve_answer(body: dict, limits: Limits) -> dict:
    """`planner solve PROBLEM --json`."""
    from planner.output.plan_report import solve_record
    from planner.problem.resolve import resolve_problem
    from planner.solver.solve import solve

    given = problem_input(body.get("problem"))
    args = command_args("solve", _options(body, "problem"), PLACEHOLDER)
    problem = given.problem
    if args.confidence:
        problem = problem.model_copy(update={"solver": problem.solver.model_copy(update={"confidence": Confidence(args.confidence)})})
    resolved = resolve_problem(problem, base_dir=given.base_dir, source=given.source)
    workers = min(args.workers or problem.solver.workers, limits.solver_workers)
    result = solve(resolved, time_limit_s=limits.time_limit(args.time_limit, problem.solver.time_limit_s), seed=args.seed, workers=workers,
                   progress=limits.check)
    return solve_record(result)


def estimate_answer(body: dict, limits: Limits) -> dict:
    """`planner estimate [PROBLEM] --flags --json`: a bundled problem by name, or the flags alone."""
    from planner.cli.estimate import estimate_inputs
    from planner.output.report import estimate_record
    from planner.physics.estimate import estimate

    name = body.get("problem")
    if name is not None and not isinstance(name, str):
        raise PlannerInputError(InputIssue("problem", "estimate takes a bundled problem's name, not a document",
                                           "name a bundled problem, or give model, rack, isl and osl"))
    path = problem_input(name).path if name is not None else None
    args = command_args("estimate", _options(body, "problem"), None)
    args.problem = str(path) if path is not None else None
    return estimate_record(estimate(estimate_inputs(args)))


def compare_answer(body: dict, limits: Limits) -> dict:
    """`planner compare PROBLEM --racks ... --json`."""
    from planner.output.sweep_report import compare_record
    from planner.studies.sweeps import compare_racks

    given = problem_input(body.get("problem"))
    args = command_args("compare", _options(body, "problem"), PLACEHOLDER)
    racks = [r.strip() for r in args.racks.split(",") if r.strip()] if args.racks is not None else list(load_hardware_catalog().racks)
    if not racks:
        raise PlannerInputError(InputIssue("racks", f"no rack id in {args.racks!r}", "give rack ids, e.g. [\"hgx-h100\", \"gb200-nvl72\"]"))
    rows = compare_racks(given.problem, racks, base_dir=given.base_dir, count=args.count,
                         time_limit_s=limits.time_limit(args.time_limit, given.problem.solver.time_limit_s), workers=limits.solver_workers,
                         progress=limits.check)
    return compare_record(rows)


def frontier_answer(body: dict, limits: Limits) -> dict:
    """`planner frontier PROBLEM --json`."""
    from planner.output.sweep_report import frontier_record
    from planner.studies.sweeps import sweep_frontier

    given = problem_input(body.get("problem"))
    args = command_args("frontier", _options(body, "problem"), PLACEHOLDER)
    frontier = sweep_frontier(given.problem, base_dir=given.base_dir, workload=args.workload, points=args.points,
                              min_tpot_s=None if args.min_tpot_ms is None else args.min_tpot_ms * MS,
                              max_tpot_s=None if args.max_tpot_ms is None else args.max_tpot_ms * MS,
                              time_limit_s=limits.time_limit(args.time_limit, given.problem.solver.time_limit_s), workers=limits.solver_workers,
                              progress=limits.check)
    return frontier_record(frontier)


def curve_answer(body: dict, limits: Limits) -> dict:
    """`planner curve PROBLEM --json`."""
    from planner.output.sweep_report import curve_record
    from planner.studies.sweeps import batch_curve

    given = problem_input(body.get("problem"))
    args = command_args("curve", _options(body, "problem"), PLACEHOLDER)
    return curve_record(batch_curve(given.problem, base_dir=given.base_dir, workload=args.workload, points=args.points))


def check_answer(body: dict, limits: Limits) -> dict:
    """`planner check PLAN`: the violations it prints, one string each (none: valid)."""
    from planner.output.validate import check_plan

    _only(body, "plan")
    plan, resolved = resolved_plan_problem(body.get("plan"))
    violations = check_plan(resolved, plan, placement=True)
    return {"valid": not violations, "violations": [str(v) for v in violations],
            "deployments": len(plan.deployments), "accelerators": plan.placed_accelerators}


def _checked_plan(body: dict) -> Plan:
    from planner.output.validate import check_plan

    plan, resolved = resolved_plan_problem(body.get("plan"))
    refuse_failing_plan(check_plan(resolved, plan, placement=True), "plan")
    return plan


def export_answer(body: dict, limits: Limits) -> dict:
    """`planner export PLAN --format F [--engine E]`: the text it writes, and a file name for it."""
    args = command_args("export", _options(body, "plan"), PLACEHOLDER)
    plan = _checked_plan(body)
    fmt = args.format or str(plan.engine)
    text = export_plan(plan, fmt, engine=args.engine)
    name = {"json": "placement.json", "lws": "manifests.yaml"}.get(fmt, f"launch-{fmt}.sh")
    return {"format": fmt, "filename": name, "text": text}


def view_answer(body: dict, limits: Limits) -> str:
    """`planner view PLAN --plot plan.svg [--colour-by C]`: the placement picture (SVG text)."""
    _only(body, "plan", "colour_by")
    colour_by = body.get("colour_by", "replica")
    if colour_by not in COLOUR_BY:
        raise PlannerInputError(InputIssue("colour_by", f"unknown colouring {str(colour_by)[:40]!r}", f"use one of: {', '.join(COLOUR_BY)}"))
    return placement_svg(_checked_plan(body), colour_by)


def model_answer(body: dict, limits: Limits) -> dict:
    """A pasted Hugging Face config.json as the problem's model: {"inline": the architecture in the
    catalog's format} (planner/model/hf_config.py, the importer `config_json:` uses)."""
    from planner.model.hf_config import spec_from_hf_config

    _only(body, "config", "id")
    config, model_id = body.get("config"), body.get("id", "imported")
    if not isinstance(config, dict):
        raise PlannerInputError(InputIssue("config", "not a config.json object", "paste the model's config.json (a JSON object)"))
    if not isinstance(model_id, str) or not model_id.strip():
        raise PlannerInputError(InputIssue("id", "not a name", "give the model a short id, e.g. my-model"))
    try:
        spec = spec_from_hf_config(config, model_id.strip()[:80], path="config")
    except (TypeError, ValueError, ArithmeticError, AttributeError, KeyError) as exc:  # the importer trusts the field types
        raise PlannerInputError(InputIssue("config", f"cannot read the config ({type(exc).__name__}: {str(exc)[:120]})",
                                           "give whole numbers where the config.json has them (layers, sizes, heads, experts)")) from None
    return {"inline": spec.model_dump(mode="json", exclude_none=True)}


def _only(body: dict, *fields: str) -> None:
    unknown = [k for k in body if k not in fields]
    if unknown:
        raise PlannerInputError([InputIssue(str(k)[:80], "unknown field", f"send only: {', '.join(fields)}") for k in unknown])


def catalog_answer() -> dict:
    """`planner catalog --json`."""
    return catalog_record()


def schema_answer(kind: str) -> dict:
    """`planner schema [--plan | --sweep]`."""
    if kind == "plan":
        from planner.output.plan import plan_json_schema

        return plan_json_schema()
    if kind == "sweep":
        from planner.studies.sweep import SweepSpec

        return SweepSpec.model_json_schema()
    if kind == "problem":
        from planner.problem.schema import problem_json_schema

        return problem_json_schema()
    raise PlannerInputError(InputIssue("kind", f"unknown schema {kind[:40]!r}", "use one of: problem, plan, sweep"))


def problems_answer() -> dict:
    """The bundled problems, name -> document (what its YAML holds), for the page's one-click choice."""
    from planner.errors import load_yaml_file

    return {name: load_yaml_file(path) for name, path in bundled_problems().items()}


ACTIONS = {"solve": solve_answer, "estimate": estimate_answer, "compare": compare_answer, "frontier": frontier_answer,
           "curve": curve_answer, "check": check_answer, "export": export_answer, "view": view_answer, "model": model_answer}


def action_answer(name: str, body: object, limits: Limits) -> object:
    if not isinstance(body, dict):
        raise PlannerInputError(InputIssue("(body)", "the request body is not a JSON object", "send a JSON object, e.g. {\"problem\": NAME}"))
    return ACTIONS[name](body, limits)
