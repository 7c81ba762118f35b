"""Command-line interface: parse, load validated inputs, call the library, render.

Exit codes: 0 success, 1 invalid plan (check), 2 bad input (the message names the field and the
fix), 3 infeasible (the deployment or problem cannot be served; the output says why).
"""

import importlib

from planner.cli.parser import build_parser

__all__ = ["main"]


EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT


def main(argv: list[str] | None = None) -> int:
    """Parse `argv`, import the command's module (only that one) and run its handler."""
    args = build_parser().parse_args(argv)
    from rich.console import Console

    from planner.errors import PlannerInputError

    module_name, function_name = args.handler.split(":")
    handler = getattr(importlib.import_module(module_name), function_name)
    console = Console(width=max(140, Console().width), highlight=False)
    try:
        return handler(args, console)
    except PlannerInputError as exc:
        Console(stderr=True, width=120, highlight=False).print(exc.render(), markup=False)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # a sweep keeps every finished point in its --out and resumes from there
        Console(stderr=True, highlight=False).print("interrupted" + (f"; run the same command again to resume from {args.out}"
                                                                     if getattr(args, "out", None) else ""), markup=False)
        return EXIT_INTERRUPTED
