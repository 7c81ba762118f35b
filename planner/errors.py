"""User-facing input errors: every message names the field, says what is wrong and how to fix it."""

import difflib
import json
import re
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
    "load_json_file",
    "load_yaml_file",
    "parse_json_text",
    "parse_yaml_text",
    "read_input_text",
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
        elif not str(item).startswith(UNION_TAG_PREFIXES) and item != "[key]":  # pydantic's marker of a bad mapping key
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


NUMBER_WITH_UNIT = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%/]+[A-Za-z%/0-9]*)\s*$")


def _unit_fix(error: dict) -> str | None:
    """For a number written with its unit ("40ms", "2 GB"): the field with the number alone (the
    field's name says its unit)."""
    value = error.get("input")
    found = NUMBER_WITH_UNIT.match(value) if isinstance(value, str) else None
    if found is None:
        return None
    name = next((str(item) for item in reversed(error["loc"]) if isinstance(item, str)), "the field")
    number, unit = found.groups()
    named = name.rsplit("_", 1)[-1] if "_" in name else None
    if named is not None and unit.lower() != named.lower():
        return f"drop the unit and write the number in {named}, the unit the field's name gives: {name}: <value in {named}>"
    return f"drop the unit: {name}: {number} (the field's name gives the unit)"


def _fix_for(error: dict) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind in ("int_parsing", "float_parsing") and _unit_fix(error):
        return _unit_fix(error)
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


MAX_INPUT_FILE_BYTES = 4 * 1024 * 1024  # the largest bundled input is under 40 kB; a 4 MB file is not a hand-written problem
MAX_YAML_ALIASES = 200  # anchors are handy for repeated workloads; thousands of them are an alias bomb


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a mapping that repeats a key is an error (PyYAML keeps the last
    silently, so a second `workloads:` would replace the first), and aliases are counted."""

    def __init__(self, stream):
        super().__init__(stream)
        self.aliases_seen = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self.aliases_seen += 1
            if self.aliases_seen > MAX_YAML_ALIASES:
                event = self.peek_event()
                raise yaml.constructor.ConstructorError(
                    None, None, f"more than {MAX_YAML_ALIASES} aliases (*name)", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges, it is not a key
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
                seen[key] = key_node.start_mark.line + 1
            except TypeError:  # an unhashable key: let PyYAML report it
                break
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' repeats (first on line {first}); PyYAML would keep only the last",
                    key_node.start_mark)
        return yaml.constructor.SafeConstructor.construct_mapping(self, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)

if hasattr(yaml, "CSafeLoader"):  # libyaml's parser: 4x faster on the 80 kB kernel catalog (0.29 s -> 0.07 s)
    class _StrictCatalogLoader(yaml.CSafeLoader):
        """For catalog files (the kernel curves `planner calibrate` writes): repeated keys are refused
        as in `_StrictLoader`, but libyaml composes the nodes, so aliases are not counted."""

        construct_mapping = _StrictLoader.construct_mapping

    _StrictCatalogLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictCatalogLoader.construct_mapping)
else:  # pragma: no cover - PyYAML built without libyaml
    _StrictCatalogLoader = _StrictLoader


def parse_yaml_text(text: str, source: str, catalog: bool = False) -> object:
    """Parse YAML strictly (no repeated keys, bounded aliases); errors name the line and column.
    `catalog`: a large generated catalog file, parsed by libyaml where PyYAML has it (aliases not counted)."""
    try:
        return yaml.load(text, Loader=_StrictCatalogLoader if catalog else _StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = f"YAML error at {where}: {exc.problem or exc}"
        raise PlannerInputError(
            InputIssue(source, problem, "fix the YAML at that line (check indentation, colons, quotes and repeated keys)")
        ) from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise PlannerInputError(InputIssue(source, f"YAML error: {str(exc)[:200] or 'nested too deeply'}", "fix the YAML syntax")) from None


def read_input_text(path: Path) -> str:
    """The text of an input file, refused with a one-line reason when it is missing, unreadable,
    not UTF-8 or larger than MAX_INPUT_FILE_BYTES."""
    try:
        if path.exists() and not path.is_dir() and not path.is_file():  # a FIFO blocks, /dev/zero never ends
            raise PlannerInputError(InputIssue(str(path), "not a regular file", "pass a problem, plan or profile file"))
        size = path.stat().st_size
        if size > MAX_INPUT_FILE_BYTES:
            raise PlannerInputError(InputIssue(str(path), f"file is {size:,} bytes, over the {MAX_INPUT_FILE_BYTES:,}-byte limit",
                                               "pass a problem, plan or profile file, not a data dump"))
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlannerInputError(
            InputIssue(str(path), "file not found", "check the path (relative paths start from the current directory)")
        ) from None
    except (IsADirectoryError, PermissionError) as exc:
        raise PlannerInputError(InputIssue(str(path), f"cannot read: {exc.strerror}", "pass a readable file")) from None
    except UnicodeDecodeError as exc:
        raise PlannerInputError(InputIssue(str(path), f"not UTF-8 text (byte {exc.start})", "save the file as UTF-8 text")) from None
    except OSError as exc:
        raise PlannerInputError(InputIssue(str(path), f"cannot read: {exc.strerror or exc}", "pass a readable file")) from None


def load_yaml_file(path: Path, catalog: bool = False) -> object:
    """Parse a YAML file strictly; syntax errors, repeated keys and unreadable files become an
    InputIssue with the line and column."""
    return parse_yaml_text(read_input_text(path), str(path), catalog)


def _no_constant(name: str) -> None:
    raise ValueError(f"non-standard JSON number {name}")


def parse_json_text(text: str, source: str, fix: str = "fix the JSON") -> object:
    """Parse JSON strictly: NaN and Infinity (Python's json accepts them, JSON.parse does not) and
    syntax errors become an InputIssue with the line and column."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise PlannerInputError(InputIssue(source, f"not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}", fix)) from None
    except ValueError as exc:
        raise PlannerInputError(InputIssue(source, str(exc), "write a finite number (or null)")) from None
    except RecursionError:
        raise PlannerInputError(InputIssue(source, "JSON nested too deeply", fix)) from None


def load_json_file(path: Path, fix: str = "fix the JSON") -> object:
    """A JSON input file, read and parsed strictly (see `read_input_text` and `parse_json_text`)."""
    return parse_json_text(read_input_text(path), str(path), fix)
