"""What the commands share: output files, problem and plan arguments, the sweep progress bar."""

import json
from pathlib import Path

from rich.console import Console

from planner.errors import InputIssue, PlannerInputError, unknown_name_issue
from planner.output.plan import Plan
from planner.output.plan_records import finite
from planner.paths import data_dir
from planner.problem.resolve import resolve_problem
from planner.problem.schema import load_problem

__all__ = ["Progress", "finite", "load_checked_plan", "load_plan", "plan_from_document", "problem_arg", "refuse_failing_plan", "resolve_problem_path", "resolved_from_plan", "write_json", "write_text"]


EXIT_OK, EXIT_INVALID_PLAN, EXIT_BAD_INPUT, EXIT_INFEASIBLE = 0, 1, 2, 3


def write_text(path: str, text: str, console: Console | None = None) -> None:
    """Write `text` to `path` (creating folders) and, given a console, say so."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    except OSError as exc:  # a directory, a path under a file, no permission, a full disk
        raise PlannerInputError(InputIssue(str(path), f"cannot write: {exc.strerror or exc}",
                                           "pass a file path in a writable directory")) from None
    if console is not None:
        console.print(f"wrote {path}", markup=False)


def write_json(path: str, record: dict, console: Console | None = None) -> None:
    write_text(path, json.dumps(finite(record), indent=2, default=str, allow_nan=False) + "\n", console)


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


def problem_arg(text: str):
    path = resolve_problem_path(text)
    return load_problem(path), path


class Progress:
    """A rich progress bar on standard error for sweeps: (done, total, what) callbacks."""

    def __init__(self, label: str):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                            TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True), transient=True)
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


def load_plan(text: str) -> tuple[Plan, Path]:
    """A plan JSON written by `planner solve --json`, checked for the fields every command needs."""
    from planner.errors import load_json_file

    path = Path(text)
    record = load_json_file(path, fix="pass the JSON written by `planner solve PROBLEM --json PATH`")
    return plan_from_document(record, text), path


def plan_from_document(record: object, text: str) -> Plan:
    """A plan document (already parsed) validated as a `Plan` with at least one deployment; `text`
    names it in messages."""
    if not isinstance(record, dict):
        raise PlannerInputError(InputIssue(text, "not a plan (the JSON is not an object)", "pass the JSON written by `planner solve --json`"))
    from planner.output.plan import parse_plan

    plan = parse_plan(record, text)  # the structure every reader relies on, or the field and the fix
    if not plan.deployments:
        raise PlannerInputError(InputIssue(f"{text}: deployments", f"the plan has no deployments (status {plan.status})",
                                           "solve a feasible problem first"))
    return plan


def resolved_from_plan(plan: Plan, path: Path):
    from planner.problem.schema import parse_problem

    base = path.parent / plan.problem_dir if plan.problem_dir else path.parent  # relative to the plan file
    return resolve_problem(parse_problem(plan.problem_spec, source=f"{path}: problem_spec"), base_dir=base, source=str(path))


def load_checked_plan(text: str) -> tuple[Plan, Path]:
    """A plan that passes the independent checker (HBM, limits, demand, racks, placement, expert
    maps re-derived from its embedded problem), for commands that act on it (`export`, `view`);
    a plan that fails is refused with its first problems, before anything is written."""
    from planner.output.validate import check_plan

    plan, path = load_plan(text)
    refuse_failing_plan(check_plan(resolved_from_plan(plan, path), plan, placement=True), text)
    return plan, path


def refuse_failing_plan(violations: list, text: str) -> None:
    """PlannerInputError with a plan's first problems when its check found any."""
    if violations:
        shown = "; ".join(str(v) for v in violations[:3]) + (f"; and {len(violations) - 3} more" if len(violations) > 3 else "")
        raise PlannerInputError(InputIssue(text, f"the plan fails its check: {shown}",
                                           f"re-solve the problem, or run `planner check {text}` for every problem"))
