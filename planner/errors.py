"""User-facing input errors: every message names the field, says what is wrong and how to fix it."""

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

__all__ = [
    "InputIssue",
    "PlannerInputError",
    "closest_names",
    "issues_from_validation_error",
    "load_yaml_file",
    "unknown_name_issue",
]


@dataclass(frozen=True)
class InputIssue:
    """One thing wrong with the input: where (`field`), what (`problem`) and what to do (`fix`)."""

    field: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}\n    fix: {self.fix}"


class PlannerInputError(Exception):
    """Bad input (problem file, catalog entry, CLI flag). The CLI prints it and exits with code 2."""

    def __init__(self, issues: InputIssue | Iterable[InputIssue], source: str = ""):
        self.issues = (issues,) if isinstance(issues, InputIssue) else tuple(issues)
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        head = f"invalid input in {self.source}" if self.source else "invalid input"
        return head + ":\n" + "\n".join(f"  - {issue}" for issue in self.issues)


def closest_names(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Catalog names closest to a misspelt one, best first."""
    choices = list(choices)
    close = difflib.get_close_matches(name.lower(), choices, n=n, cutoff=0.4)
    if not close:  # substring hits help for partial names such as "h100" or "deepseek"
        close = [c for c in choices if name.lower() in c][:n]
    return close


def unknown_name_issue(field: str, kind: str, name: str, choices: Iterable[str]) -> InputIssue:
    """Issue for a name that is not in a catalog, suggesting the closest known names."""
    choices = sorted(choices)
    close = closest_names(name, choices)
    hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    listing = ", ".join(choices) if len(choices) <= 40 else f"{len(choices)} names; run `planner catalog`"
    return InputIssue(field, f"unknown {kind} '{name}'. {hint}".strip(), f"use one of: {listing}")


def _location(loc: tuple) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif not str(item).startswith(("function-", "tagged-union", "union[")):
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def _fix_for(error: dict) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        return "remove this field or check its spelling (`planner schema` lists every field)"
    if kind == "missing":
        return "add this field (`planner schema` shows its type and meaning)"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return f"use a value within the allowed range ({error['msg'].lower()})"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return "write a whole number"
    if kind in ("float_parsing", "float_type"):
        return "write a number (YAML needs a dot in exponent form: 3.35e+12, or plain 3350000000000)"
    if kind in ("enum", "literal_error"):
        return f"use one of: {ctx.get('expected', 'the listed values')}"
    if kind == "value_error":
        return str(ctx.get("fix", "see the message"))
    return "correct the value (`planner schema` describes every field)"


def issues_from_validation_error(exc: ValidationError, prefix: str = "") -> list[InputIssue]:
    """Turn pydantic's errors into field / problem / fix issues."""
    issues = []
    for error in exc.errors(include_url=False):
        field = _location(error["loc"])
        if prefix:
            field = prefix if field == "(top level)" else f"{prefix}.{field}"
        message = error["msg"].removeprefix("Value error, ")
        fix = _fix_for(error)
        if error["type"] == "value_error" and "\n    fix: " in message:
            message, fix = message.split("\n    fix: ", 1)
        issues.append(InputIssue(field, message, fix))
    return issues


def load_yaml_file(path: Path) -> object:
    """Parse a YAML file; syntax errors become an InputIssue with the line and column."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise PlannerInputError(
            InputIssue(str(path), "file not found", "check the path (relative paths start from the current directory)")
        ) from None
    except (IsADirectoryError, PermissionError) as exc:
        raise PlannerInputError(InputIssue(str(path), f"cannot read: {exc.strerror}", "pass a readable file")) from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = f"YAML syntax error at {where}: {exc.problem or exc}"
        raise PlannerInputError(
            InputIssue(str(path), problem, "fix the YAML at that line (check indentation, colons and quotes)")
        ) from None
    except yaml.YAMLError as exc:
        raise PlannerInputError(InputIssue(str(path), f"YAML error: {exc}", "fix the YAML syntax")) from None
