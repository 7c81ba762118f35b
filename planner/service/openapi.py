"""The OpenAPI document at /docs and /openapi.json: each endpoint's request body described from the
project's own schemas (the problem and plan pydantic models) and the CLI parser's options (their
help, defaults and choices), so the API reference cannot drift from the command line."""

import argparse

from planner.cli.parser import build_parser
from planner.output.placement_picture import COLOUR_BY
from planner.service.inputs import OPTIONS, bundled_problems

__all__ = ["add_schemas", "request_schema", "sweep_request_schema"]

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
PLAN_REF = {"$ref": "#/components/schemas/Plan"}
COMMAND_OF = {"solve": "solve", "estimate": "estimate", "compare": "compare", "frontier": "frontier", "curve": "curve", "export": "export"}


def _option_schemas(command: str) -> dict[str, dict]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    by_dest = {a.dest: a for a in sub._actions if a.option_strings}
    schemas = {}
    for name in OPTIONS[command]:
        action = by_dest[name]
        schema: dict = {"description": f"{action.option_strings[-1]}: {action.help or ''}".strip()}
        if action.choices:
            schema["enum"] = list(action.choices)
        if action.default is not None and action.default is not argparse.SUPPRESS:
            schema["default"] = action.default
        schemas[name] = schema
    return schemas


def request_schema(action: str) -> dict:
    """The JSON Schema of `action`'s request body."""
    problem = {"anyOf": [{"type": "string", "enum": list(bundled_problems()), "description": "a bundled problem's name"}, PROBLEM_REF],
               "description": "a bundled problem's name, or a problem document (what a problem YAML holds; no file paths)"}
    if action == "model":
        return {"type": "object", "properties": {"config": {"type": "object", "description": "a Hugging Face config.json"},
                                                 "id": {"type": "string", "default": "imported"}},
                "required": ["config"], "additionalProperties": False}
    if action in ("check", "view"):
        properties = {"plan": PLAN_REF}
        if action == "view":
            properties["colour_by"] = {"enum": list(COLOUR_BY), "default": "replica"}
        return {"type": "object", "properties": properties, "required": ["plan"], "additionalProperties": False}
    properties = _option_schemas(COMMAND_OF[action])
    if action == "export":
        return {"type": "object", "properties": {"plan": PLAN_REF, **properties}, "required": ["plan"], "additionalProperties": False}
    if action == "estimate":
        problem = {"type": "string", "enum": list(bundled_problems()), "description": "optional: a bundled problem giving model, rack and workload"}
    properties = {"problem": problem, **properties}
    return {"type": "object", "properties": properties, "required": [] if action == "estimate" else ["problem"], "additionalProperties": False}


def sweep_request_schema() -> dict:
    """The body of POST /v1/sweeps: a sweep document whose base is a bundled problem's name or a problem document."""
    from planner.studies.sweep import SweepSpec

    schema = SweepSpec.model_json_schema(ref_template="#/components/schemas/{model}")
    schema.pop("$defs", None)  # Axis: a component (add_schemas)
    schema["properties"]["base"] = {"anyOf": [{"type": "string", "enum": list(bundled_problems())}, PROBLEM_REF],
                                    "description": "a bundled problem's name, or a problem document (no file paths)"}
    return schema


def add_schemas(document: dict) -> dict:
    """`document` with the Problem, Plan and sweep schemas (and the models they refer to) as components."""
    from planner.output.plan import Plan
    from planner.problem.schema import Problem
    from planner.studies.sweep import SweepSpec

    components = document.setdefault("components", {}).setdefault("schemas", {})
    for model in (Problem, Plan, SweepSpec):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    return document
