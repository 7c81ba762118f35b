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


UNION_TAG_PREFIXES = ("function-", "tagged-union", "union[", "tag:")  # pydantic's names for union members, not fields


def _location(loc: tuple) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif not str(item).startswith(UNION_TAG_PREFIXES):
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
    if kind == "scale_up_kind":
        return "write scale_up: {kind: switched}, full_mesh, torus (with dims) or links (with a links list)"
    if kind == "value_error":
        return str(ctx.get("fix", "see the message"))
    return "correct the value (`planner schema` describes every field)"


def _sibling_fields(schema: dict, loc: tuple) -> set[str]:
    """The field names allowed next to the one at `loc` (the object that holds it), found by walking
    the JSON Schema; every alternative of a union counts. Empty when the walk gets lost."""
    defs = schema.get("$defs", {})

    def expand(node: dict) -> list[dict]:
        if "$ref" in node:
            return expand(defs.get(node["$ref"].rsplit("/", 1)[-1], {}))
        alternatives = node.get("anyOf") or node.get("oneOf")
        if alternatives:
            return [n for alt in alternatives for n in expand(alt)]
        return [node]

    def kind_of(node: dict) -> object:
        kind = node.get("properties", {}).get("kind", {})
        return kind.get("const", (kind.get("enum") or [None])[0])

    nodes = expand(schema)
    for key in loc[:-1]:
        if isinstance(key, str) and key.startswith(UNION_TAG_PREFIXES):
            continue
        tagged = [n for n in nodes if isinstance(key, str) and kind_of(n) == key]
        if tagged:  # a discriminated union member named by its `kind`
            nodes = tagged
            continue
        following = []
        for node in nodes:
            if isinstance(key, int) and node.get("type") == "array":
                following += expand(node.get("items", {}))
            elif isinstance(key, str) and key in node.get("properties", {}):
                following += expand(node["properties"][key])
            elif isinstance(key, str) and isinstance(node.get("additionalProperties"), dict):
                following += expand(node["additionalProperties"])
        nodes = following
    return {name for node in nodes for name in node.get("properties", {})}


def issues_from_validation_error(exc: ValidationError, prefix: str = "", model=None) -> list[InputIssue]:
    """Turn pydantic's errors into field / problem / fix issues. With `model` (the pydantic class
    validated), a misspelt field gets the closest real field names."""
    issues = []
    schema = model.model_json_schema() if model is not None else None
    for error in exc.errors(include_url=False):
        field = _location(error["loc"])
        if prefix:
            field = prefix if field == "(top level)" else f"{prefix}.{field}"
        message = error["msg"].removeprefix("Value error, ")
        fix = _fix_for(error)
        if error["type"] == "extra_forbidden" and schema is not None:
            close = closest_names(str(error["loc"][-1]), _sibling_fields(schema, error["loc"]))
            if close:
                message = f"unknown field '{error['loc'][-1]}'. did you mean {', '.join(repr(c) for c in close)}?"
                fix = f"rename it to '{close[0]}' or remove it (`planner schema --markdown` lists every field)"
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
