"""`planner calibrate`: fit compact kernel curves to NVIDIA aiconfigurator's measured kernel tables, keep
the tables' departures from them as correction grids, and write both: `topologies/kernels.yaml` and
`topologies/kernel_grids/<accelerator>.zip` (read by planner/hardware/kernels.py).

The tables are the parquet files of the aiconfigurator-core wheel (Apache-2.0) under
`aiconfigurator_core/systems/data/<system>/<family>/<engine>/<version>/`. Their latencies are in
milliseconds (DeepEP tables: microseconds); every attention, GEMM and MoE row is one layer on one GPU;
communication `message_size` is an element count. Per (accelerator, engine) and kernel format the
newest version holding usable rows is fitted; the forms are in planner/hardware/kernel_forms.py, the
classes in calibrate_classes.py, the grids and their leave-one-out scoring in calibrate_grids.py.
Peaks F and BW come from the planner's own accelerator catalog, so the fitted efficiencies are
fractions of the catalog figures.

This module needs pandas and pyarrow (the optional `calibrate` extra); the planner never imports it
when it plans.
"""

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from planner.errors import InputIssue, PlannerInputError, unknown_name_issue
from planner.hardware.calibrate_classes import CLASS_FAMILIES, collectives
from planner.hardware.calibrate_io import write_kernel_catalog
from planner.hardware.catalog import Accelerator, HardwareCatalog, load_hardware_catalog
from planner.hardware.kernel_grids import Grid, GridSet

__all__ = ["ENGINES", "GRIDS_DIR", "SYSTEM_ACCELERATORS", "Calibration", "Tables", "calibrate", "calibrate_accelerator", "package_version", "version_key",
           "write_kernel_catalog"]

SYSTEM_ACCELERATORS = {  # aiconfigurator system name -> planner accelerator id
    "h100_sxm": "h100-sxm", "h200_sxm": "h200-sxm", "b200_sxm": "b200",
    "gb200": "gb200", "b300_sxm": "b300", "gb300": "gb300",
}
ENGINES = ("trtllm", "sglang", "vllm")
SOURCE = {"package": "aiconfigurator-core", "license": "Apache-2.0", "tables": "aiconfigurator_core/systems/data"}
GRIDS_DIR = "kernel_grids"  # next to kernels.yaml: one <accelerator>.zip of correction grids each
NCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")


@dataclass(frozen=True)
class Suspect:
    """A table whose measurement looks wrong: skipped, and named in the engine's `suspect` list."""

    engine: str
    kernel_class: str
    fmt: str
    systems: tuple[str, ...] | None  # None: every system
    reason: str


SUSPECT = (
    Suspect("vllm", "gemm", "fp8_block", None, "host floor of 60-350 us in the measurement"),
    Suspect("sglang", "attention_prefill", "fp8", None, "slow triton path (eta 0.06-0.16)"),
    Suspect("sglang", "mla_decode", "fp8", ("h100_sxm", "h200_sxm"), "10x slower than bf16 KV (fallback path)"),
)

_VERSION = re.compile(r"(\d+(?:\.\d+)*)(?:\.?(dev|a|b|rc|post)(\d+))?")
_STAGE = {"dev": -4, "a": -3, "b": -2, "rc": -1, None: 0, "post": 1}


def version_key(text: str) -> tuple:
    """Sort key of an engine version string: 1.3.0rc20 < 1.3.0 < 1.3.0.post1 (unparsable sorts first)."""
    match = _VERSION.match(text)
    if not match:
        return ((), -9, 0)
    release = tuple(int(x) for x in match.group(1).split("."))
    return release, _STAGE[match.group(2)], int(match.group(3) or 0)


class Tables:
    """The parquet tables of one aiconfigurator system directory."""

    def __init__(self, root: Path, system: str):
        self.root = Path(root) / system
        self.system = system

    def versions(self, family: str, engine: str, name: str) -> list[str]:
        """Versions of `family/engine` holding the table `name`, newest first."""
        base = self.root / family / engine
        if not base.is_dir():
            return []
        found = [d.name for d in base.iterdir() if (d / name).is_file()]
        return sorted(found, key=version_key, reverse=True)

    def read(self, family: str, engine: str, version: str, name: str) -> pd.DataFrame:
        """The table's rows whose latency is a measurement (finite and positive; a missing, zero or
        negative one is dropped, as in some of aiconfigurator's quantize and sparse-attention tables)."""
        path = self.root / family / engine / version / name
        try:
            rows = pd.read_parquet(path)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError: not a parquet file, truncated, ...
            reason = str(exc).splitlines()[0][:240] if str(exc) else type(exc).__name__
            raise PlannerInputError(InputIssue("tables", f"{path} is not a readable parquet table ({reason})",
                                               "give the tables as aiconfigurator-core or `planner probe` wrote them")) from None
        if "latency" not in rows.columns:
            return rows
        latency = pd.to_numeric(rows["latency"], errors="coerce")
        return rows[np.isfinite(latency) & (latency > 0)].assign(latency=latency)

    def newest(self, family: str, engine: str, name: str) -> tuple[pd.DataFrame, str] | None:
        """The newest version of a table and its version string, or None."""
        versions = self.versions(family, engine, name)
        return (self.read(family, engine, versions[0], name), versions[0]) if versions else None

    def newest_by_format(self, family: str, engine: str, name: str, column: str,
                         usable: Callable[[pd.DataFrame], pd.DataFrame]) -> dict[str, tuple[pd.DataFrame, str]]:
        """Per value of `column`: the usable rows of the newest version that has any, and that version."""
        out: dict[str, tuple[pd.DataFrame, str]] = {}
        for version in self.versions(family, engine, name):
            for fmt, rows in usable(self.read(family, engine, version, name)).groupby(column):
                if fmt not in out and len(rows):
                    out[str(fmt)] = (rows, version)
        return out


@dataclass
class _Context:
    """What the fits of one (system, engine) share: the tables, the accelerator, the grids built so
    far, the GEMM streaming rates (for the expert GEMMs' cold-weight floor) and the suspect tables skipped."""

    tables: Tables
    engine: str
    accel: Accelerator
    l2_bytes: float  # the L2 cache that decides which GEMM shapes stream their weights from HBM
    grids: dict[str, Grid | GridSet] = field(default_factory=dict)
    stream_fraction: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def suspect(self, kernel_class: str, fmt: str) -> bool:
        """True (and noted) when the table of `kernel_class` in `fmt` is on the suspect list."""
        for rule in SUSPECT:
            if (rule.engine, rule.kernel_class, rule.fmt) == (self.engine, kernel_class, fmt) and \
                    (rule.systems is None or self.tables.system in rule.systems):
                self.notes.append(f"{self.engine} {fmt} {kernel_class}: {rule.reason}")
                return True
        return False


@dataclass(frozen=True)
class Calibration:
    """What `calibrate` produced: the kernels.yaml record and each accelerator's grids by name."""

    record: dict
    grids: dict[str, dict[str, Grid | GridSet]]


def _engine_record(ctx: _Context) -> dict:
    """versions, every fitted class and the suspect tables of one engine; {} without any fit."""
    record: dict = {"versions": {}}
    used: dict[str, set[str]] = {}
    for family, produce in CLASS_FAMILIES:
        classes, versions = produce(ctx)
        for kernel_class, fits in classes.items():
            if fits:
                record[kernel_class] = fits
        if versions:
            used.setdefault(family, set()).update(versions)
    if len(record) == 1:
        return {}
    record["versions"] = {f: ", ".join(sorted(v, key=version_key, reverse=True)) for f, v in used.items()}
    if ctx.notes:
        record["suspect"] = ctx.notes
    return record


def _nccl(ctx: _Context) -> dict:
    """NCCL collectives (nccl-tests, fp16 buffers) of the newest NCCL version measured on the system."""
    table = ctx.tables.newest("comm", "nccl", "nccl_perf.parquet")
    if table is None:
        return {}
    rows = table[0][table[0]["nccl_dtype"] == "half"]
    fits = {op: collectives(ctx, rows[rows["op_name"] == op], op, "nccl") for op in NCCL_OPS}
    return {op: f for op, f in fits.items() if f}


def _system_names(systems: Iterable[str]) -> list[str]:
    """aiconfigurator system names; planner accelerator ids (h100-sxm) are accepted as well."""
    by_accelerator = {a: s for s, a in SYSTEM_ACCELERATORS.items()}
    out = []
    for name in systems:
        system = name if name in SYSTEM_ACCELERATORS else by_accelerator.get(name)
        if system is None:
            raise PlannerInputError(unknown_name_issue("systems", "aiconfigurator system", name, SYSTEM_ACCELERATORS))
        out.append(system)
    return out


def package_version(tables_dir: Path) -> str:
    """The aiconfigurator-core version from the unpacked wheel's dist-info next to the tables, or "unknown"."""
    parents = Path(tables_dir).resolve().parents  # <wheel root>/aiconfigurator_core/systems/data
    if len(parents) < 3:
        return "unknown"
    for metadata in parents[2].glob("aiconfigurator_core-*.dist-info/METADATA"):
        for line in metadata.read_text().splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def _largest_l2(catalog: HardwareCatalog) -> float:
    return max((a.l2_cache_bytes for a in catalog.accelerators.values() if a.l2_cache_bytes), default=0.0)


def calibrate(tables_dir: Path, systems: Iterable[str] = tuple(SYSTEM_ACCELERATORS), engines: Iterable[str] = ENGINES,
              catalog: HardwareCatalog | None = None, version: str | None = None) -> Calibration:
    """Fit every kernel class of `systems` x `engines` found under `tables_dir` (an unpacked
    `aiconfigurator_core/systems/data`) and build its correction grids. The record (kernels.yaml)
    names each accelerator's grid file, `GRIDS_DIR/<id>.zip`, relative to kernels.yaml. A part
    without an L2 figure in the catalog takes the largest L2 of the catalog to pick streaming shapes."""
    catalog = catalog or load_hardware_catalog()
    root = Path(tables_dir)
    accelerators: dict[str, dict] = {}
    grids: dict[str, dict[str, Grid | GridSet]] = {}
    for system in _system_names(systems):
        if not (root / system).is_dir():
            continue
        accel = catalog.accelerators[SYSTEM_ACCELERATORS[system]]
        entry, found = calibrate_accelerator(Tables(root, system), accel, engines, accel.l2_cache_bytes or _largest_l2(catalog))
        if "nccl" in entry or entry["engines"]:
            accelerators[accel.id] = entry
            grids[accel.id] = found
    source = {"package": SOURCE["package"], "version": version or package_version(root), **SOURCE}
    return Calibration({"source": source, "accelerators": accelerators}, grids)


def calibrate_accelerator(tables: Tables, accel: Accelerator, engines: Iterable[str], l2_bytes: float) -> tuple[dict, dict[str, Grid | GridSet]]:
    """The kernels.yaml entry of one accelerator (its NCCL collectives and every engine with tables
    under `tables`) and its grids by name; `l2_bytes` picks the GEMM shapes that stream their weights."""
    entry: dict = {"system": tables.system, "grids": f"{GRIDS_DIR}/{accel.id}.zip"}
    shared = _Context(tables, "nccl", accel, l2_bytes)
    if nccl := _nccl(shared):
        entry["nccl"] = nccl
    found = dict(shared.grids)
    fitted = {}
    for engine in engines:
        ctx = _Context(tables, engine, accel, l2_bytes)
        fitted[engine] = _engine_record(ctx)
        found |= ctx.grids if fitted[engine] else {}
    entry["engines"] = {e: r for e, r in fitted.items() if r}
    return entry, found
