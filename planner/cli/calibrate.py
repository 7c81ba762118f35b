"""`planner calibrate`: fit the kernel curves of topologies/kernels.yaml to aiconfigurator's measured
kernel tables (an unpacked `aiconfigurator_core/systems/data` directory or the aiconfigurator-core wheel)."""

import argparse
import re
import statistics
import tempfile
import zipfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from planner.cli.common import EXIT_OK
from planner.errors import InputIssue, PlannerInputError

__all__ = ["DEFAULT_OUTPUT", "calibrate_command", "summary_rows"]

DEFAULT_OUTPUT = Path("topologies") / "kernels.yaml"
TABLES_IN_WHEEL = "aiconfigurator_core/systems/data"
WHEEL_VERSION = re.compile(r"aiconfigurator_core-([^-]+)-")
NEEDS = InputIssue("calibrate", "needs pandas, pyarrow and scipy", 'pip install "llm-deployment-planner[calibrate]"')


def _require_extras() -> None:
    """Raise the install hint when the optional `calibrate` extra is missing."""
    try:
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
        import scipy  # noqa: F401
    except ImportError:
        raise PlannerInputError(NEEDS) from None


def _tables_dir(source: Path, scratch: Path) -> tuple[Path, str | None]:
    """The tables directory for `source` (a data directory, an unpacked wheel or a .whl file, which is
    unzipped into `scratch`) and the package version when the wheel's name tells it."""
    if not source.exists():
        raise PlannerInputError(InputIssue("tables", f"{source} does not exist",
                                           f"give the {TABLES_IN_WHEEL} directory or the aiconfigurator-core wheel"))
    if source.is_file():
        if not zipfile.is_zipfile(source):
            raise PlannerInputError(InputIssue("tables", f"{source} is neither a directory nor a wheel",
                                               "give the unpacked tables directory or the .whl file"))
        with zipfile.ZipFile(source) as wheel:
            members = [m for m in wheel.namelist() if m.startswith(TABLES_IN_WHEEL + "/") and m.endswith(".parquet")]
            wheel.extractall(scratch, members)
        match = WHEEL_VERSION.match(source.name)
        return scratch / TABLES_IN_WHEEL, match.group(1) if match else None
    inside = source / TABLES_IN_WHEEL
    return (inside if inside.is_dir() else source), None


def summary_rows(record: dict) -> list[tuple[str, str, str, str]]:
    """(system, engine, classes fitted, median spread p10/p50/p90 over the engine's fits) per engine."""
    rows = []
    for accel in record["accelerators"].values():
        for engine, classes in accel.get("engines", {}).items():
            fitted = [c for c in classes if c not in ("versions", "suspect")]
            spreads = [fit["spread"] for fit in _fits(classes, fitted)]
            median = "/".join(f"{statistics.median(s[i] for s in spreads):.2f}" for i in range(3)) if spreads else "-"
            rows.append((accel["system"], engine, ", ".join(fitted), median))
    return rows


def _fits(classes: dict, names: list[str]) -> list[dict]:
    """Every fit record (a dict with a spread) under the given classes, however deeply nested."""
    out, todo = [], [classes[n] for n in names]
    while todo:
        node = todo.pop()
        if "spread" in node:
            out.append(node)
        else:
            todo.extend(v for v in node.values() if isinstance(v, dict))
    return out


def calibrate_command(args: argparse.Namespace, console: Console) -> int:
    """args.tables: data directory or wheel; args.output: kernels.yaml path (default topologies/kernels.yaml);
    args.systems: aiconfigurator systems or planner accelerator ids (default: every calibrated one);
    args.engines (optional): engines to fit (default trtllm, sglang, vllm)."""
    _require_extras()
    from planner.hardware.calibrate import (
        ENGINES,
        SYSTEM_ACCELERATORS,
        calibrate,
        write_kernel_catalog,
    )

    output = Path(args.output) if getattr(args, "output", None) else DEFAULT_OUTPUT
    systems = getattr(args, "systems", None) or tuple(SYSTEM_ACCELERATORS)
    engines = getattr(args, "engines", None) or ENGINES
    with tempfile.TemporaryDirectory(prefix="planner-calibrate-") as scratch:
        tables, version = _tables_dir(Path(args.tables), Path(scratch))
        record = calibrate(tables, systems=systems, engines=engines, version=version)
    if not record["accelerators"]:
        raise PlannerInputError(InputIssue("tables", f"no kernel tables of {', '.join(systems)} under {tables}",
                                           f"give the {TABLES_IN_WHEEL} directory of aiconfigurator-core"))
    write_kernel_catalog(record, output)
    table = Table(title=f"kernel curves fitted to {record['source']['package']} {record['source']['version']}")
    for column in ("system", "engine", "classes fitted", "median spread p10/p50/p90"):
        table.add_column(column)
    for row in summary_rows(record):
        table.add_row(*row)
    console.print(table)
    console.print(f"wrote {output} ({output.stat().st_size / 1024:.0f} KiB)", markup=False)
    return EXIT_OK


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("tables", help="aiconfigurator_core/systems/data directory or aiconfigurator-core wheel")
    parser.add_argument("-o", "--output", default=str(DEFAULT_OUTPUT))
    parser.add_argument("--systems", nargs="+")
    parser.add_argument("--engines", nargs="+")
    raise SystemExit(calibrate_command(parser.parse_args(), Console()))
