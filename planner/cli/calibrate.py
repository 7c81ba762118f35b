"""`planner calibrate`: fit the kernel curves of topologies/kernels.yaml and their correction grids
(topologies/kernel_grids/) to aiconfigurator's measured kernel tables (an unpacked
`aiconfigurator_core/systems/data` directory or the aiconfigurator-core wheel), and print each class's
leave-one-out error."""

import argparse
import re
import tempfile
import zipfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from planner.cli.calibrate_summary import CLASS_COLUMNS, summary_rows, target_misses
from planner.cli.common import EXIT_OK
from planner.errors import InputIssue, PlannerInputError

__all__ = ["DEFAULT_OUTPUT", "calibrate_command"]

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


def calibrate_command(args: argparse.Namespace, console: Console) -> int:
    """args.tables: data directory or wheel; args.output: kernels.yaml path (default topologies/kernels.yaml);
    args.systems: aiconfigurator systems or planner accelerator ids (default: every calibrated one);
    args.engines (optional): engines to fit (default trtllm, sglang, vllm)."""
    _require_extras()
    from planner.hardware.probe_layout import PROBE_FILE

    if (Path(args.tables) / PROBE_FILE).is_file():
        from planner.cli.probe_calibrate import probe_calibrate_command

        return probe_calibrate_command(args, console)
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
        calibration = calibrate(tables, systems=systems, engines=engines, version=version)
    record = calibration.record
    if not record["accelerators"]:
        raise PlannerInputError(InputIssue("tables", f"no kernel tables of {', '.join(systems)} under {tables}",
                                           f"give the {TABLES_IN_WHEEL} directory of aiconfigurator-core"))
    write_kernel_catalog(record, output, calibration.grids)
    table = Table(title=f"leave-one-out error (median/p90, worst format) of the kernel rates from {record['source']['package']} "
                        f"{record['source']['version']}")
    for column in ("system", "engine", *CLASS_COLUMNS):
        table.add_column(column.replace("_", " "))
    for row in summary_rows(record):
        table.add_row(*row)
    console.print(table)
    misses = target_misses(record)
    console.print(f"median within 10% (MoE 15%) in every class: {'yes' if not misses else 'no: ' + ', '.join(misses)}", markup=False)
    grid_bytes = sum((output.parent / a["grids"]).stat().st_size for a in record["accelerators"].values() if a.get("grids"))
    console.print(f"wrote {output} ({output.stat().st_size / 1024:.0f} KiB) and its grids ({grid_bytes / 1024:.0f} KiB)", markup=False)
    return EXIT_OK


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("tables", help="aiconfigurator_core/systems/data directory or aiconfigurator-core wheel")
    parser.add_argument("-o", "--output", default=str(DEFAULT_OUTPUT))
    parser.add_argument("--systems", nargs="+")
    parser.add_argument("--engines", nargs="+")
    raise SystemExit(calibrate_command(parser.parse_args(), Console()))
