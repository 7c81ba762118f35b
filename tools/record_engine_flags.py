#!/usr/bin/env python3
"""Record the real command-line flags of an installed LLM serving engine.

Development tool for the deployment planner: the launch-script exporter must
only ever write flags that exist in the engine version it targets.  Rather
than transcribing flags from documentation, this script imports the engine's
*own* argument parser, built exactly the way the engine's launcher builds it,
and dumps every option it registers to JSON.

Usage::

    python record_engine_flags.py vllm   vllm-<version>.json
    python record_engine_flags.py sglang sglang-<version>.json

Parsers recorded:

* ``vllm``   -- ``vllm serve``: ``make_arg_parser(FlexibleArgumentParser())``
  from ``vllm.entrypoints.common.cli_args`` (older releases:
  ``vllm.entrypoints.openai.cli_args``).
* ``sglang`` -- ``sglang serve`` / ``python -m sglang.launch_server``:
  ``ServerArgs.add_cli_args(argparse.ArgumentParser())``.  If the router
  packages are importable, their ``launch_router`` parsers are recorded too,
  under ``"routers"``: ``sglang_router`` (package ``sglang-router``) and its
  successor ``smg`` (Shepherd Model Gateway, package ``smg``).

Output shape::

    {"engine": "vllm", "version": "<engine.__version__>",
     "recorded_with": "record_engine_flags.py",
     "options": {"--flag": {"option_strings": [...], "type": ..., ...}},
     "positionals": {...}, ...}

Each option records: every option string the parser accepts, the type name,
choices, the default (JSON-safe), nargs, whether it is a boolean flag (takes
no value: store_true/store_false/BooleanOptionalAction and friends), and any
deprecation (from the action itself or from its help text).

No GPU is needed.  On a machine without one, vLLM cannot infer its platform
while building defaults, so ``VLLM_TARGET_DEVICE=cpu`` is set unless the
caller already set it; the choice is recorded in the output (a few defaults
are platform dependent, which the output notes).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import enum
import functools
import importlib
import importlib.metadata
import json
import math
import os
import platform
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCRIPT_NAME = Path(__file__).name

# Actions whose option takes no value on the command line.
_NO_VALUE_ACTIONS = (
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse._StoreConstAction,
    argparse._AppendConstAction,
    argparse._CountAction,
    argparse.BooleanOptionalAction,
)
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+")


# --------------------------------------------------------------------------
# JSON helpers
# --------------------------------------------------------------------------
def json_safe(value: Any, _depth: int = 0) -> Any:
    """Return a JSON-serialisable rendering of ``value``.

    Primitives pass through; enums become their value; dataclasses and
    pydantic models become dicts; containers are converted recursively
    (sets are sorted for stable output); anything else becomes ``repr()``.
    """
    if _depth > 8:
        return repr(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, enum.Enum):
        return json_safe(value.value, _depth + 1)
    if isinstance(value, (list, tuple)):
        return [json_safe(v, _depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [json_safe(v, _depth + 1) for v in value]
        return sorted(items, key=lambda x: json.dumps(x, sort_keys=True))
    if isinstance(value, dict):
        return {str(k): json_safe(v, _depth + 1) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        try:
            return {
                f.name: json_safe(getattr(value, f.name), _depth + 1)
                for f in dataclasses.fields(value)
            }
        except (TypeError, AttributeError):  # exotic dataclass
            return repr(value)
    if hasattr(value, "model_dump") and not isinstance(value, type):
        try:
            return json_safe(value.model_dump(), _depth + 1)
        except Exception:  # noqa: BLE001 - any failure: fall back to repr()
            return repr(value)
    if isinstance(value, type):
        return value.__name__
    return repr(value)


def type_name(t: Any) -> str | None:
    """Readable name for an argparse ``type=`` callable.

    Plain types give their name (``int``).  Wrapper closures such as vLLM's
    ``optional_type(int)`` or ``parse_dataclass`` are unwrapped through their
    closure cells / default arguments so the wrapped type shows, e.g.
    ``optional_type[int]`` or ``parse_dataclass[EPLBConfig]``.
    """
    if t is None:
        return None
    if isinstance(t, type):
        return t.__name__
    if isinstance(t, functools.partial):
        return f"partial[{type_name(t.func)}]"
    qual = getattr(t, "__qualname__", None) or type(t).__name__
    base = qual.rsplit(".<locals>.", 1)[-1].split(".")[-1].lstrip("_") or qual
    if base == "<lambda>":
        base = qual.replace(".<locals>.", ".")
    inner: list[str] = []
    for cell in getattr(t, "__closure__", None) or ():
        try:
            obj = cell.cell_contents
        except ValueError:  # empty cell
            continue
        if isinstance(obj, type) or callable(obj):
            inner.append(type_name(obj) or repr(obj))
    for obj in getattr(t, "__defaults__", None) or ():
        if isinstance(obj, type):
            inner.append(obj.__name__)
    return f"{base}[{', '.join(inner)}]" if inner else base


# --------------------------------------------------------------------------
# Parser walking
# --------------------------------------------------------------------------
def _groups_by_action(parser: argparse.ArgumentParser) -> dict[int, str]:
    groups: dict[int, str] = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            groups[id(action)] = group.title or ""
    return groups


def _exclusive_groups(parser: argparse.ArgumentParser) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for group in parser._mutually_exclusive_groups:
        members = [a.dest for a in group._group_actions]
        for action in group._group_actions:
            out[id(action)] = [m for m in members if m != action.dest]
    return out


def _primary_name(option_strings: list[str]) -> str:
    for opt in option_strings:
        if opt.startswith("--"):
            return opt
    return option_strings[0]


def _is_boolean(action: argparse.Action) -> bool:
    if isinstance(
        action,
        (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction),
    ):
        return True
    # Custom actions (e.g. SGLang's DeprecatedStoreTrueAction) that take no
    # value and store a bool.
    return action.nargs == 0 and (
        isinstance(action.const, bool) or isinstance(action.default, bool)
    )


def describe_action(
    action: argparse.Action,
    parser: argparse.ArgumentParser,
    group: str | None,
    deprecated_set: set[int],
    exclusive: dict[int, list[str]],
) -> dict[str, Any]:
    """Describe one argparse action as a JSON-safe dict."""
    accepted = sorted(
        (s for s, a in parser._option_string_actions.items() if a is action),
        key=lambda s: (s not in action.option_strings, s),
    )
    takes_value = not (isinstance(action, _NO_VALUE_ACTIONS) or action.nargs == 0)
    help_text = action.help if action.help not in (None, argparse.SUPPRESS) else None
    cls = type(action)
    info: dict[str, Any] = {
        "option_strings": list(action.option_strings),
        "dest": action.dest,
        "action": cls.__name__,
        "type": type_name(action.type)
        if action.type is not None
        else ("bool" if _is_boolean(action) else ("str" if takes_value else None)),
        "choices": json_safe(list(action.choices)) if action.choices is not None else None,
        "default": json_safe(
            action.default if action.default is not argparse.SUPPRESS else "==SUPPRESS=="
        ),
        "nargs": action.nargs,
        "takes_value": takes_value,
        "is_boolean_flag": _is_boolean(action),
        "required": bool(action.required),
        "group": group,
        "hidden": action.help == argparse.SUPPRESS,
        "help": help_text,
    }
    hidden_aliases = [s for s in accepted if s not in action.option_strings]
    if hidden_aliases:
        # Accepted by the parser but not shown in --help (e.g. vLLM's
        # --no-enable-x next to --disable-x).
        info["hidden_option_strings"] = hidden_aliases
    if isinstance(action, argparse.BooleanOptionalAction):
        neg = getattr(action, "negative_option_strings", None)
        info["negative_option_strings"] = (
            sorted(neg) if neg else [s for s in action.option_strings if s.startswith("--no-")]
        )
    if action.metavar is not None:
        info["metavar"] = json_safe(action.metavar)
    if action.const is not None:
        info["const"] = json_safe(action.const)
    if id(action) in exclusive:
        info["mutually_exclusive_with"] = exclusive[id(action)]

    # Deprecation: Python 3.13 ``deprecated=``, vLLM's FlexibleArgumentParser
    # bookkeeping for older Pythons, SGLang's Deprecated*Action classes, and
    # finally any help text that says "deprecated".
    notes: list[str] = []
    deprecated = bool(getattr(action, "deprecated", False)) or id(action) in deprecated_set
    if cls.__name__.startswith("Deprecated"):
        deprecated = True
        notes.append(f"action class {cls.__name__}")
    for attr in ("new_flag", "const_value", "error_message"):
        val = getattr(action, attr, None)
        if val is not None:
            notes.append(f"{attr}={val!r}")
    if help_text:
        notes.extend(
            sentence.strip()
            for sentence in _SENTENCE_SPLIT_RE.split(" ".join(help_text.split()))
            if "deprecat" in sentence.lower()
        )
    if help_text and not deprecated:
        # The help may merely *mention* deprecation (of a value, of another
        # flag); only call the flag itself deprecated when the help opens with
        # "Deprecated", has a sentence that does, or names this flag /
        # "this option" as deprecated.
        own = "|".join(re.escape(s) for s in action.option_strings)
        sentences = _SENTENCE_SPLIT_RE.split(" ".join(help_text.split()))
        deprecated = bool(
            any(re.match(r"\(?\s*deprecated\b", x, re.IGNORECASE) for x in sentences)
            or re.search(
                rf"(?:{own}|this (?:flag|option|argument))\s+(?:is|has been)\s+deprecated",
                help_text,
                re.IGNORECASE,
            )
        )
    info["deprecated"] = deprecated
    info["deprecation"] = "; ".join(dict.fromkeys(notes)) or None
    return info


def describe_parser(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Return {"options": {...}, "positionals": {...}} for a parser."""
    groups = _groups_by_action(parser)
    exclusive = _exclusive_groups(parser)
    deprecated_set = {id(a) for a in getattr(parser, "_deprecated", set())}
    options: dict[str, Any] = {}
    positionals: dict[str, Any] = {}
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        info = describe_action(action, parser, groups.get(id(action)), deprecated_set, exclusive)
        if action.option_strings:
            options[_primary_name(action.option_strings)] = info
        else:
            positionals[action.dest] = info
    return {
        "options": dict(sorted(options.items())),
        "positionals": positionals,
        "option_count": len(options),
    }


# --------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------
def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def record_vllm() -> dict[str, Any]:
    """Build the parser exactly as ``vllm serve`` does and describe it."""
    notes = []
    if "VLLM_TARGET_DEVICE" not in os.environ:
        try:
            import torch

            has_gpu = torch.cuda.is_available()
        except ImportError:
            has_gpu = False
        if not has_gpu:
            os.environ["VLLM_TARGET_DEVICE"] = "cpu"
            notes.append(
                "no GPU: VLLM_TARGET_DEVICE=cpu was set so vLLM could "
                "infer a platform while building defaults; a few "
                "defaults (e.g. device-dependent ones) may differ on CUDA/ROCm"
            )
    # vLLM only renders help text (from config dataclass docstrings) when it
    # sees "--help" in sys.argv at import time (arg_utils.NEEDS_HELP).  Fake
    # that while importing and building; do NOT put "serve" in argv, which
    # would drop the (still accepted) --model option as `vllm serve --help`
    # does.
    saved_argv = sys.argv
    sys.argv = [saved_argv[0], "--help"]
    try:
        import vllm
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        try:  # current layout
            from vllm.entrypoints.common.cli_args import make_arg_parser

            where = "vllm.entrypoints.common.cli_args.make_arg_parser"
        except ImportError:  # older releases
            from vllm.entrypoints.openai.cli_args import make_arg_parser

            where = "vllm.entrypoints.openai.cli_args.make_arg_parser"
        parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    finally:
        sys.argv = saved_argv

    # Values checked after parsing (not argparse choices) that an exporter
    # needs: the quantization methods ModelConfig accepts.
    value_sets: dict[str, Any] = {}
    try:
        quant = importlib.import_module("vllm.model_executor.layers.quantization")
        value_sets["--quantization"] = {
            "accepted": list(quant.QUANTIZATION_METHODS),
            "deprecated (need --allow-deprecated-quantization)": list(
                getattr(quant, "DEPRECATED_QUANTIZATION_METHODS", [])
            ),
            "source": "vllm.model_executor.layers.quantization.QUANTIZATION_METHODS",
        }
    except Exception as exc:  # noqa: BLE001 - optional extra; record the error
        value_sets["--quantization"] = {"error": f"{type(exc).__name__}: {exc}"}
    commit = None
    try:
        commit = importlib.import_module("vllm._version").commit_id
    except (ImportError, AttributeError):
        commit = None
    out = {
        "engine": "vllm",
        "version": vllm.__version__,
        "commit": commit,
        "command": "vllm serve [model_tag] [options]",
        "parser_built_with": f"{where}(FlexibleArgumentParser())",
        "vllm_target_device": os.environ.get("VLLM_TARGET_DEVICE"),
        "parser_notes": [
            (
                "FlexibleArgumentParser accepts '_' in place of '-' in option names "
                "(--tensor_parallel_size == --tensor-parallel-size) and "
                "dotted keys for JSON config args (--compilation-config.mode 3)."
            ),
            "--config FILE.yaml supplies the same options from YAML.",
            (
                "Where an option lists 'metavar' values but no 'choices', vLLM "
                "documents those values but argparse does not enforce them "
                "(the config dataclass validates later)."
            ),
        ]
        + notes,
        "value_sets": value_sets,
    }
    out.update(describe_parser(parser))
    return out


def _record_router(module: str, dist: str, launcher: str) -> dict[str, Any] | None:
    """Describe a router's ``launch_router`` parser, if the package imports."""
    try:
        router_args = importlib.import_module(f"{module}.router_args")
    except Exception as exc:  # noqa: BLE001 - not installed or native ext. missing
        return {"available": False, "error": f"{type(exc).__name__}: {exc}"}
    parser = argparse.ArgumentParser(prog=launcher)
    router_args.RouterArgs.add_cli_args(parser, use_router_prefix=False)
    module_version = None
    try:
        module_version = importlib.import_module(f"{module}.version").__version__
    except (ImportError, AttributeError):
        module_version = None
    out = {
        "available": True,
        "package": dist,
        "version": _dist_version(dist) or module_version,
        "module_version_attr": module_version,
        "command": launcher,
        "parser_built_with": f"{module}.router_args.RouterArgs.add_cli_args(ArgumentParser(), use_router_prefix=False)",
    }
    out.update(describe_parser(parser))
    return out


def record_sglang() -> dict[str, Any]:
    """Build the parser as ``sglang serve`` does and describe it (+ routers)."""
    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    out = {
        "engine": "sglang",
        "version": sglang.__version__,
        "command": "python -m sglang.launch_server [options]  (or: sglang serve [options])",
        "parser_built_with": "sglang.srt.server_args.ServerArgs.add_cli_args(argparse.ArgumentParser())",
        "parser_notes": [
            (
                "--config FILE.yaml is merged into argv before parsing "
                "(sglang.srt.server_args.prepare_server_args)."
            ),
        ],
    }
    out.update(describe_parser(parser))
    out["routers"] = {
        "sglang_router": _record_router(
            "sglang_router", "sglang-router", "python -m sglang_router.launch_router"
        ),
        "smg": _record_router("smg", "smg", "smg launch  (== python -m smg.launch_router)"),
    }
    return out


ENGINES: dict[str, Callable[[], dict[str, Any]]] = {
    "vllm": record_vllm,
    "sglang": record_sglang,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engine", choices=sorted(ENGINES))
    ap.add_argument("out", type=Path, help="output JSON path")
    args = ap.parse_args(argv)

    record = ENGINES[args.engine]()
    header = {
        "engine": record.pop("engine"),
        "version": record.pop("version"),
        "recorded_with": SCRIPT_NAME,
        "recorded_at": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": platform.python_version(),
    }
    header.update(record)
    args.out.write_text(json.dumps(header, indent=1, ensure_ascii=False) + "\n")
    print(
        f"{header['engine']} {header['version']}: {header['option_count']} options -> {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
