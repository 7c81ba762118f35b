"""A user catalog: a directory `planner calibrate <probe dir> --out DIR` wrote, holding `hardware.yaml`
(accelerators and racks, in the shipped catalog's format) and `kernels.yaml` with `kernel_grids/` (the
measured kernel curves of those accelerators). Layered over the shipped catalog, it adds its
accelerators and racks, and the calibrated step model reads their curves from DIR; nothing shipped
changes."""

from dataclasses import replace
from pathlib import Path

from planner.errors import InputIssue, PlannerInputError, load_yaml_file
from planner.hardware.catalog import HardwareCatalog
from planner.hardware.specs import AcceleratorSpec, RackSpec

__all__ = ["HARDWARE_FILE", "KERNELS_FILE", "with_user_catalog"]

HARDWARE_FILE = "hardware.yaml"
KERNELS_FILE = "kernels.yaml"


def _specs(directory: Path, field_name: str) -> tuple[list[AcceleratorSpec], list[RackSpec]]:
    from pydantic import ValidationError

    from planner.errors import issues_from_validation_error

    path = directory / HARDWARE_FILE
    if not path.is_file() or not (directory / KERNELS_FILE).is_file():
        raise PlannerInputError(InputIssue(field_name, f"{directory} is not a user catalog (no {HARDWARE_FILE} and {KERNELS_FILE})",
                                           "give the --out directory of `planner calibrate <probe dir>`"))
    raw = load_yaml_file(path) or {}
    try:
        return ([AcceleratorSpec.model_validate(a) for a in raw.get("accelerators", [])],
                [RackSpec.model_validate(r) for r in raw.get("racks", [])])
    except ValidationError as exc:
        raise PlannerInputError(issues_from_validation_error(exc, str(path))) from None


def with_user_catalog(hardware: HardwareCatalog, directory: Path, field_name: str = "--kernel-catalog") -> HardwareCatalog:
    """`hardware` with the user catalog in `directory` layered over it: its accelerators (whose kernel
    curves are read from `directory`) and racks added."""
    directory = Path(directory).resolve()
    accelerators, racks = _specs(directory, field_name)
    layered = hardware.with_overrides(accelerators=accelerators, racks=racks, field_prefix=field_name)
    ids = {a.id for a in accelerators}
    accel = {k: replace(a, kernels_dir=directory) if k in ids else a for k, a in layered.accelerators.items()}
    rack_map = {k: replace(r, accelerator=accel[r.accelerator.id]) for k, r in layered.racks.items()}
    return replace(layered, accelerators=accel, racks=rack_map)
