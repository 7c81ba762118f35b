"""`planner calibrate <probe dir> --out <catalog dir>`: a probe's tables fitted into a user catalog
(planner/hardware/calibrate_probe.py) under a new accelerator key, with each class's leave-one-out error."""

import argparse
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from planner.cli.common import EXIT_OK
from planner.errors import (
    InputIssue,
    PlannerInputError,
    issues_from_validation_error,
    load_yaml_file,
    unknown_name_issue,
)
from planner.hardware.catalog import load_hardware_catalog
from planner.hardware.specs import AcceleratorSpec, RackSpec
from planner.model.catalog import load_model_catalog
from planner.modes import Engine
from planner.paths import data_dir

__all__ = ["DEFAULT_ENGINE", "probe_calibrate_command"]

DEFAULT_ENGINE = Engine.VLLM  # the engine whose kernels PyTorch's and flash-attn's are closest to
PROBED_SUFFIX = "-probed"


def _extra_specs(path: str | None) -> tuple[list[AcceleratorSpec], list[RackSpec]]:
    """Accelerators and racks of a file: a catalog-style file (accelerators:, racks:) or a problem file
    (cluster.custom_accelerators, cluster.custom_racks)."""
    if path is None:
        return [], []
    raw = load_yaml_file(Path(path)) or {}
    raw = raw if isinstance(raw, dict) else {}
    cluster = raw.get("cluster")
    names = ("custom_accelerators", "custom_racks") if isinstance(cluster, dict) else ("accelerators", "racks")
    source = cluster if isinstance(cluster, dict) else raw
    accels, racks = source.get(names[0], []), source.get(names[1], [])
    try:
        return [AcceleratorSpec.model_validate(a) for a in accels], [RackSpec.model_validate(r) for r in racks]
    except ValidationError as exc:
        raise PlannerInputError(issues_from_validation_error(exc, path)) from None


def _base(args: argparse.Namespace, device: str) -> tuple[AcceleratorSpec, list[RackSpec]]:
    from planner.hardware.calibrate_probe import match_accelerator, shipped_specs

    accels, racks = shipped_specs()
    extra_accels, extra_racks = _extra_specs(args.accelerators)
    by_id = {a.id: a for a in accels} | {a.id: a for a in extra_accels}
    wanted = args.accelerator or (extra_accels[0].id if len(extra_accels) == 1 else match_accelerator(device, accels))
    if wanted is None:
        raise PlannerInputError(InputIssue("--accelerator", f"the probed device '{device}' matches no single catalog accelerator",
                                           "name it with --accelerator ID, or define it in a file given with --accelerators"))
    if wanted not in by_id:
        raise PlannerInputError(unknown_name_issue("--accelerator", "accelerator", wanted, by_id))
    return by_id[wanted], racks + extra_racks


def _summary(record: dict, key: str, engine: str) -> Table:
    from planner.cli.calibrate_summary import CLASS_COLUMNS, summary_rows

    table = Table(title=f"leave-one-out error (median/p90, worst format) of {key} {engine}, probed on {record['source']['device']}")
    for column in ("system", "engine", *CLASS_COLUMNS):
        table.add_column(column.replace("_", " "))
    for row in summary_rows(record):
        table.add_row(*row)
    return table


def _compare(console: Console, out: Path, probe_dir: Path, base: str, key: str, engine: str) -> None:
    """The decode step on the probed curves against the shipped ones of the same engine, where the part has shipped
    curves and a rack: at the whole steps the probe measured (not in a smoke run), else at a few batches of each dense
    model probed."""
    from planner.cli.probe_compare import (
        compare_rows,
        compare_table,
        default_points,
        first_fitting,
        measured_points,
    )
    from planner.hardware.calibrate_probe import probe_record
    from planner.hardware.kernels import kernel_rates
    from planner.hardware.user_catalog import with_user_catalog

    hardware = with_user_catalog(load_hardware_catalog(), out)
    shipped = next((r for r in hardware.racks.values() if r.accelerator.id == base), None)
    probed = next((r for r in hardware.racks.values() if r.accelerator.id == key), None)
    if shipped is None or probed is None or kernel_rates(base, Engine(engine)) is None:
        console.print(f"no shipped curves of {base} to compare with", markup=False)
        return
    run = probe_record(probe_dir).get("run", {})
    models = load_model_catalog()
    measured = [] if run.get("smoke") else [p for p in measured_points(probe_dir) if p[0] in models]
    if measured:
        rows = compare_rows(out, shipped, probed, measured, engine)
    else:
        rows = first_fitting(out, shipped, probed, default_points([str(m) for m in run.get("models", [])], shipped.n_accelerators),
                             engine)
    console.print(compare_table(rows, key, f"{base} {engine}"))


def probe_calibrate_command(args: argparse.Namespace, console: Console) -> int:
    from planner.hardware.calibrate_probe import (
        calibrate_probe,
        probe_record,
        write_user_catalog,
    )

    if not getattr(args, "output", None):
        raise PlannerInputError(InputIssue("--out", "no user catalog directory given", "pass --out DIR (a new directory of yours)"))
    out = Path(args.output)
    if out.resolve() == data_dir("topologies").resolve() or out.suffix in (".yaml", ".yml"):
        raise PlannerInputError(InputIssue("--out", f"{out} is not a directory of its own", "pass a new directory: the shipped catalog stays as it is"))
    if out.exists() and not out.is_dir():
        raise PlannerInputError(InputIssue("--out", f"{out} is a file", "pass a directory (new, or one calibrate wrote before)"))
    device = str(probe_record(Path(args.tables))["probe"].get("device"))
    base, racks = _base(args, device)
    key = args.name or f"{base.id}{PROBED_SUFFIX}"
    if key in load_hardware_catalog().accelerators:
        raise PlannerInputError(InputIssue("--name", f"{key} is an accelerator of the shipped catalog",
                                           f"pick a new id, e.g. {base.id}{PROBED_SUFFIX} or one naming your machine"))
    engine = Engine(args.engine or DEFAULT_ENGINE)
    try:
        calibration = calibrate_probe(Path(args.tables), base, key, engine.value, racks, load_hardware_catalog())
    except ValidationError as exc:  # an id that is not a catalog id (lowercase kebab-case)
        raise PlannerInputError(issues_from_validation_error(exc, "--name")) from None
    except KeyError as exc:  # a table without a column the fits read (an edited or foreign table)
        raise PlannerInputError(InputIssue("tables", f"a table under {args.tables} has no column {exc}",
                                           "give the tables `planner probe` wrote, unchanged")) from None
    kernels = write_user_catalog(out, calibration)
    console.print(_summary(calibration.measured_record(), key, engine.value))
    if calibration.kept_collectives:
        console.print(f"collectives: {calibration.kept_collectives}", markup=False)
    spec = calibration.accelerator
    console.print(f"accelerator {key}: {base.name} with measured HBM fraction {spec.hbm_bandwidth_fraction} and compute fractions "
                  f"{ {str(k): v for k, v in (spec.compute_fraction or {}).items()} }", markup=False)
    console.print(f"racks: {', '.join(r.id for r in calibration.racks)}", markup=False)
    _compare(console, out, Path(args.tables), base.id, key, engine.value)
    console.print(f"wrote {kernels}, {out / 'hardware.yaml'} and {out / 'kernel_grids'}; use them with "
                  f"planner estimate --kernel-catalog {out} --rack {calibration.racks[0].id} ...", markup=False)
    return EXIT_OK
