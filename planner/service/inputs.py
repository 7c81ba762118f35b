"""What a request may send, checked before anything runs: bundled problems by name (looked up in a
fixed list, never joined into a path), problem documents (the JSON of a problem YAML) without file
paths, plan documents, and command options read by the CLI's own argument parser."""

import argparse
import re
from functools import lru_cache
from pathlib import Path

from planner.cli.common import plan_from_document
from planner.cli.parser import build_parser
from planner.errors import (
    InputIssue,
    PlannerInputError,
    load_yaml_file,
    unknown_name_issue,
)
from planner.output.plan import Plan
from planner.paths import data_dir
from planner.problem.resolve import resolve_problem
from planner.problem.schema import Problem, parse_problem

__all__ = ["PATH_FIELDS", "ProblemInput", "bundled_problems", "command_args", "problem_input", "refuse_paths", "resolved_plan_problem"]

PATH_FIELDS = ("file", "config_json", "previous_plan")  # the problem fields that name a file on the server
# options a request may give each command: every flag that does not name a file to write (--json, --plot, --csv, -o)
OPTIONS = {
    "solve": ("time_limit", "seed", "workers", "confidence"),
    "estimate": ("workload", "model", "rack", "tp", "ep", "pp", "dp_attn", "batch", "redundant_experts", "expert_imbalance",
                 "expert_routing", "isl", "osl", "weights_precision", "kv_precision", "activations_precision", "compute_precision",
                 "price", "overlap", "engine", "step_model", "prefill_chunk", "role", "speculative_tokens", "acceptance",
                 "acceptance_length", "cache_tier"),
    "compare": ("racks", "count", "time_limit"),
    "frontier": ("workload", "points", "min_tpot_ms", "max_tpot_ms", "time_limit"),
    "curve": ("workload", "points"),
    "export": ("format", "engine"),
}


@lru_cache(maxsize=1)
def bundled_problems() -> dict[str, Path]:
    """Bundled problem name -> its file: the only problem files a request can name."""
    return {p.stem: p for p in sorted(data_dir("problems").glob("*.yaml"))}


class ProblemInput:
    """A problem from a request: its validated document and the directory its file lived in."""

    def __init__(self, problem: Problem, base_dir: Path, source: str, path: Path | None = None):
        self.problem, self.base_dir, self.source, self.path = problem, base_dir, source, path

    def resolve(self):
        return resolve_problem(self.problem, base_dir=self.base_dir, source=self.source)


def _names_files(value: object, where: str = "problem") -> list[str]:
    if isinstance(value, dict):
        return [f"{where}.{k}" for k, v in value.items() if k in PATH_FIELDS and v is not None] + \
            [f for k, v in value.items() for f in _names_files(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [f for i, v in enumerate(value) for f in _names_files(v, f"{where}[{i}]")]
    return []


def refuse_paths(document: dict, where: str) -> None:
    fields = _names_files(document, where)
    if fields:
        raise PlannerInputError([InputIssue(f, "names a file on the server; a request cannot read server files",
                                            "give the model as a catalog id or {inline: {...}} (POST /v1/model turns a pasted "
                                            "config.json into one), and expert loads as synthetic") for f in fields])


def problem_input(value: object) -> ProblemInput:
    """A bundled problem's name, or a problem document (what a problem YAML holds, as JSON)."""
    bundled = bundled_problems()
    if isinstance(value, str):
        if value not in bundled:  # a membership test: the text never becomes a path
            raise PlannerInputError(unknown_name_issue("problem", "bundled problem", value[:80], bundled))
        path = bundled[value]
        return ProblemInput(parse_problem(load_yaml_file(path), source=value), path.parent, str(path), path)
    if not isinstance(value, dict):
        raise PlannerInputError(InputIssue("problem", "give a bundled problem's name or a problem document (a JSON object)",
                                           "send {\"problem\": \"deepseek-v3-gb200-nvl72\"} or the problem YAML's content as JSON"))
    refuse_paths(value, "problem")
    return ProblemInput(parse_problem(value, source="problem"), data_dir("problems"), "problem")


def resolved_plan_problem(document: object) -> tuple[Plan, object]:
    """A plan document validated as the CLI validates plan files, and its embedded problem resolved."""
    plan = plan_from_document(document, "plan")
    refuse_paths(plan.problem_spec, "plan.problem_spec")
    if plan.problem_dir is not None:
        raise PlannerInputError(InputIssue("plan.problem_dir", "names a directory on the server", "remove problem_dir (set it to null)"))
    problem = parse_problem(plan.problem_spec, source="plan: problem_spec")
    return plan, resolve_problem(problem, base_dir=data_dir("problems"), source="plan")


class _Refused(Exception):
    pass


def _parser_for(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]

    def error(message: str):
        raise _Refused(message)

    parser.error = sub.error = error  # the CLI's messages, raised instead of printed with an exit
    return sub


def _word(key: str, value: object) -> str:
    if isinstance(value, list) and all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in value):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise PlannerInputError(InputIssue(key, f"{type(value).__name__} is not an option value", "write a number or a text"))
    return str(value)


def command_args(command: str, options: dict, positional: str | None = None) -> argparse.Namespace:
    """The namespace `planner COMMAND` would parse from the same options given as flags: {"time_limit": 5}
    is `--time-limit=5`; the CLI's parser checks types, ranges and choices and words the message."""
    allowed = OPTIONS[command]
    unknown = [k for k in options if k not in allowed]
    if unknown:
        raise PlannerInputError([unknown_name_issue(str(k)[:80], f"option of {command}", str(k)[:80], allowed) for k in unknown])
    sub = _parser_for(command)
    flags = {a.dest: a.option_strings[-1] for a in sub._actions if a.option_strings}
    argv = [positional] if positional is not None else []
    argv += [f"{flags[k]}={_word(k, v)}" for k, v in options.items() if v is not None]
    try:
        args, extra = sub.parse_known_args(argv)
        if extra:
            raise _Refused(f"unrecognized arguments: {' '.join(extra)}")
        return args
    except _Refused as exc:
        named = re.match(r"argument (\S+?):", str(exc))
        name = next((k for k in options if named and flags[k] in named.group(1).split("/")), "options")
        raise PlannerInputError(InputIssue(name, str(exc), f"see `planner {command} --help` for the option's values")) from None

