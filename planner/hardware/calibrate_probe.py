"""`planner calibrate <probe dir> --out <catalog dir>`: fit the tables a `planner probe` run wrote
(aiconfigurator-core's layout under `probe/`, planner/probe/run.py) into a user catalog: a directory
holding `kernels.yaml` and `kernel_grids/` (the shipped catalog's format) and `hardware.yaml`, the
probed part as a new accelerator (a copy of its catalog or problem-file entry under a new id, with the
probe's measured HBM and GEMM fractions) and its racks. The shipped catalog is never written.

Beyond aiconfigurator's classes the probe measures elementwise work (fitted as t = t0 + bytes /
(BW eta_bw), the step model's elementwise form) and HBM copies (a line t = alpha + bytes moved / rate
through the copies many times larger than L2: the rate over the catalog peak is the new
accelerator's hbm_bandwidth_fraction).

A probe of one device measures no collectives. The probed part then keeps the collective curves the
shipped catalog has for its base part (NCCL's and the engine's all-reduce and all-to-all, with their
grids), and its engine's `versions` say so; a part without shipped curves has none, and its
all-reduces take the link model (step_calibrated._all_reduces)."""

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from planner.errors import InputIssue, PlannerInputError, load_yaml_file
from planner.hardware.calibrate import Tables, calibrate_accelerator
from planner.hardware.calibrate_fits import fit_alpha_rate, round_sig
from planner.hardware.calibrate_io import write_kernel_catalog
from planner.hardware.catalog import HardwareCatalog
from planner.hardware.kernel_grids import Grid, GridSet, read_grid_file
from planner.hardware.probe_layout import PROBE_ENGINE, PROBE_FILE, PROBE_SYSTEM
from planner.hardware.specs import AcceleratorSpec, RackSpec
from planner.hardware.user_catalog import HARDWARE_FILE
from planner.paths import data_dir
from planner.units import MS

__all__ = ["ProbeCalibration", "calibrate_probe", "match_accelerator", "probe_record", "shipped_collectives", "shipped_specs",
           "write_user_catalog"]

MAX_FRACTION = 1.0  # a measured fraction above the datasheet peak is held at the peak
HBM_COPY_L2_MULTIPLE = 8  # copies of at least this many times the L2 cache measure HBM...
MIN_COPY_ROWS = 4  # ...when at least this many were measured (else every copy is fitted)
COLLECTIVES = ("all_reduce", "all_to_all")  # an engine's collective classes in kernels.yaml
REQUIRED_CLASSES = ("gemm", "attention_decode", "attention_prefill")  # the others fall back to these (kernels.KernelRates)
ENGINE_ORDER = ("trtllm", "sglang", "vllm")  # whose collectives a part keeps when its engine has none (kernels.kernel_rates' order)


@dataclass(frozen=True)
class ProbeCalibration:
    """kernels.yaml record, grids by accelerator, and hardware.yaml's accelerators and racks."""

    record: dict
    grids: dict[str, dict[str, Grid | GridSet]]
    accelerator: AcceleratorSpec
    racks: list[RackSpec]
    kept_collectives: str | None = None  # where the collective curves came from when the probe measured none

    def measured_record(self) -> dict:
        """`record` without the collective curves kept from the shipped catalog (what the probe fitted)."""
        if self.kept_collectives is None:
            return self.record
        out = {k: v for k, v in self.record.items() if k != "accelerators"}
        out["accelerators"] = {}
        for key, entry in self.record["accelerators"].items():
            engines = {e: {c: v for c, v in fits.items() if c not in COLLECTIVES} for e, fits in entry["engines"].items()}
            out["accelerators"][key] = {k: v for k, v in entry.items() if k not in ("nccl", "engines")} | {"engines": engines}
        return out


def probe_record(directory: Path) -> dict:
    """The probe.yaml of a probe directory."""
    path = Path(directory) / PROBE_FILE
    if not path.is_file():
        raise PlannerInputError(InputIssue("tables", f"{directory} has no {PROBE_FILE}", "give the --out directory of `planner probe`"))
    record = load_yaml_file(path)
    if not isinstance(record, dict) or not isinstance(record.get("probe"), dict):
        raise PlannerInputError(InputIssue("tables", f"{path} is not a probe record (no 'probe' section)",
                                           "give the --out directory of `planner probe` as it wrote it"))
    return record


def shipped_specs() -> tuple[list[AcceleratorSpec], list[RackSpec]]:
    """The accelerators and racks of the shipped catalog as written (friendly units)."""
    root = data_dir("topologies")
    accels = [AcceleratorSpec.model_validate(a) for p in sorted((root / "accelerators").glob("*.yaml"))
              for a in load_yaml_file(p)["accelerators"]]
    racks = [RackSpec.model_validate(r) for p in sorted((root / "racks").glob("*.yaml")) for r in load_yaml_file(p)["racks"]]
    return accels, racks


def match_accelerator(device: str, specs: list[AcceleratorSpec]) -> str | None:
    """The one accelerator whose name holds the device's model number (the first word with a digit,
    e.g. H200 in "NVIDIA H200"), or None when none or several do."""
    words = [w for w in re.split(r"[\s_]+", device.lower()) if re.search(r"\d", w)]
    if not words:
        return None
    found = [s.id for s in specs if words[0] in re.split(r"[\s_]+", s.name.lower())]
    return found[0] if len(found) == 1 else None


def _source(probe: dict) -> dict[str, str]:
    """kernels.yaml's source: the probe's record flattened to strings."""
    libraries = ", ".join(f"{k} {v}" for k, v in probe.get("libraries", {}).items())
    clocks = ", ".join(f"{k} {v}" for k, v in probe.get("driver_and_clocks", {}).items())
    out = {"package": "planner probe", "version": str(probe.get("libraries", {}).get("torch", "?")), "device": str(probe.get("device")),
           "runtime": str(probe.get("runtime", "cpu")), "libraries": libraries, "date": str(probe.get("date")),
           "backends": ", ".join(f"{k}: {v}" for k, v in probe.get("backends", {}).items())}
    return out | ({"driver_and_clocks": clocks} if clocks else {})


def _latest(tables: Tables, family: str, name: str) -> pd.DataFrame | None:
    found = tables.newest(family, PROBE_ENGINE, name)
    return None if found is None else found[0]


def _elementwise(tables: Tables, hbm_bytes_per_s: float) -> dict:
    """{bf16: t0_s, eta_bw (fraction of the catalog HBM peak), fit_spread, rows} from the elementwise table."""
    rows = _latest(tables, "elementwise", "elementwise_perf.parquet")
    if rows is None or len(rows) < 4:
        return {}
    fit = fit_alpha_rate(rows["bytes"].to_numpy(dtype=float), rows["latency"].to_numpy(dtype=float) * MS, "bytes_per_s")
    return {"bf16": {"t0_s": fit.record["alpha_s"], "eta_bw": round_sig(fit.record["bytes_per_s"] / hbm_bytes_per_s),
                     "fit_spread": fit.record["fit_spread"], "rows": len(rows)}}


def _hbm_fraction(tables: Tables, hbm_bytes_per_s: float, l2_bytes: float) -> float | None:
    """The copy rate over the catalog peak (at most 1): 1 / slope of the least-squares line
    t = alpha + bytes moved / rate through the copies that dwarf the L2 cache (at least
    HBM_COPY_L2_MULTIPLE x its size, when MIN_COPY_ROWS of them were measured: smaller ones partly stay
    in L2 and run faster than HBM; else through every copy)."""
    rows = _latest(tables, "mem", "mem_perf.parquet")
    if rows is None or len(rows) < MIN_COPY_ROWS:
        return None
    large = rows[rows["bytes"] >= HBM_COPY_L2_MULTIPLE * l2_bytes]
    rows = large if len(large) >= MIN_COPY_ROWS else rows
    seconds_per_byte, _ = np.polyfit(rows["bytes_moved"].to_numpy(dtype=float), rows["latency"].to_numpy(dtype=float) * MS, 1)
    return min(MAX_FRACTION, round_sig(1.0 / (seconds_per_byte * hbm_bytes_per_s)))


def _grid_names(tree) -> set[str]:
    if isinstance(tree, dict):
        return {tree["grid"]} if isinstance(tree.get("grid"), str) else set().union(*(_grid_names(v) for v in tree.values()))
    return set()


def shipped_collectives(base_id: str, engine: str) -> tuple[dict, dict, dict[str, Grid | GridSet], str] | None:
    """The shipped catalog's collective curves of part `base_id`: its NCCL section, `engine`'s
    all-reduce and all-to-all (or, where `engine` has none, the first engine's in ENGINE_ORDER that
    does), their grids by name, and that engine; None when the part has no shipped collectives."""
    root = data_dir("topologies")
    entry = load_yaml_file(root / "kernels.yaml", catalog=True)["accelerators"].get(base_id)
    if not entry:
        return None
    engines = entry.get("engines", {})
    chosen = next((e for e in (engine, *ENGINE_ORDER) if any(engines.get(e, {}).get(c) for c in COLLECTIVES)), None)
    nccl = entry.get("nccl") or {}
    if chosen is None and not nccl:
        return None
    curves = {c: engines[chosen][c] for c in COLLECTIVES if chosen and engines[chosen].get(c)}
    names = _grid_names(nccl) | _grid_names(curves)
    grids = {k: v for k, v in read_grid_file(root / entry["grids"]).items() if k in names} if names and entry.get("grids") else {}
    return nccl, curves, grids, chosen or "nccl"


def _probed_spec(base: AcceleratorSpec, key: str, engine_record: dict, hbm_fraction: float | None, probe: dict) -> AcceleratorSpec:
    """`base` under the new id, its HBM and GEMM fractions replaced by the probe's measurements."""
    note = f"planner probe, {probe.get('device')}, {probe.get('date')}"
    update: dict = {"id": key, "name": f"{base.name} (probed: {probe.get('device')})", "sources": dict(base.sources)}
    if hbm_fraction is not None:
        update["hbm_bandwidth_fraction"] = hbm_fraction
        update["sources"]["hbm_bandwidth_fraction"] = note
    gemm = {fmt: min(MAX_FRACTION, fit["eta_max"]) for fmt, fit in engine_record.get("gemm", {}).items() if fmt in base.dense_tflop_per_s}
    if gemm:
        update["compute_fraction"] = dict(base.compute_fraction or {}) | gemm
        update["sources"]["compute_fraction"] = note
    return AcceleratorSpec.model_validate(base.model_dump() | update)


def _racks(base: AcceleratorSpec, key: str, racks: list[RackSpec], devices: int) -> list[RackSpec]:
    """Copies of the racks of `base` for the new accelerator; without any, one switched box of the probed devices."""
    mine = [r for r in racks if r.accelerator == base.id]
    if not mine:
        return [RackSpec(id=f"{key}-x{devices}", name=f"{devices} x {base.name} (probed machine)", accelerator=key, accelerators=devices,
                         scale_up={"kind": "switched"})]
    return [RackSpec.model_validate(r.model_dump() | {"id": f"{key}-{r.id}", "name": f"{r.name}, {key}", "accelerator": key}) for r in mine]


def calibrate_probe(directory: Path, base: AcceleratorSpec, key: str, engine: str, racks: list[RackSpec],
                    hardware: HardwareCatalog) -> ProbeCalibration:
    """Fit a probe directory's tables for accelerator `base` (its peaks) under the new id `key` and `engine`."""
    probe = probe_record(directory)["probe"]
    accel = hardware.with_overrides(accelerators=[base.model_copy(update={"id": key})]).accelerators[key]
    tables = Tables(Path(directory), PROBE_SYSTEM)
    l2_bytes = accel.l2_cache_bytes or float(probe.get("l2_cache_bytes") or 0.0)
    entry, grids = calibrate_accelerator(tables, accel, (PROBE_ENGINE,), l2_bytes)
    fitted = entry["engines"].pop(PROBE_ENGINE, None)
    if fitted is None:
        raise PlannerInputError(InputIssue("tables", f"no kernel table under {directory} has enough shapes to fit",
                                           "run `planner probe` again with a larger --budget-s"))
    if missing := [c for c in REQUIRED_CLASSES if not fitted.get(c)]:
        raise PlannerInputError(InputIssue("tables", f"no {', '.join(missing)} table under {directory} has enough measured shapes to fit "
                                                     "(every step needs them)", "run `planner probe` again, with a larger --budget-s"))
    fitted |= {"elementwise": e} if (e := _elementwise(tables, accel.hbm_bandwidth_bytes_per_s)) else {}
    note = None
    if not entry.get("nccl") and not any(fitted.get(c) for c in COLLECTIVES) and (kept := shipped_collectives(base.id, engine)):
        nccl, curves, kept_grids, from_engine = kept
        note = f"shipped {base.id} {from_engine} curves (the probe measured none)"
        fitted |= curves
        fitted.setdefault("versions", {})["collectives"] = note
        entry |= {"nccl": nccl} if nccl else {}
        grids = dict(grids) | kept_grids
    entry |= {"system": str(probe.get("device")), "engines": {engine: fitted}}
    spec = _probed_spec(base, key, fitted, _hbm_fraction(tables, accel.hbm_bandwidth_bytes_per_s, l2_bytes), probe)
    devices = int(probe.get("ranks") or probe.get("device_count") or 1)
    return ProbeCalibration({"source": _source(probe), "accelerators": {key: entry}}, {key: grids}, spec, _racks(base, key, racks, devices),
                            note)


def write_user_catalog(out: Path, calibration: ProbeCalibration) -> Path:
    """kernels.yaml, kernel_grids/ and hardware.yaml in `out`; returns the kernels.yaml path."""
    kernels = Path(out) / "kernels.yaml"
    write_kernel_catalog(calibration.record, kernels, calibration.grids)
    hardware = {"accelerators": [calibration.accelerator.model_dump(mode="json", exclude_none=True)],
                "racks": [r.model_dump(mode="json", exclude_none=True) for r in calibration.racks]}
    (Path(out) / HARDWARE_FILE).write_text("# The probed accelerator and its racks (planner calibrate). Name a rack in a problem file\n"
                                           "# (cluster.kernel_catalog: this directory) or in `planner estimate --kernel-catalog`.\n"
                                           + yaml.safe_dump(hardware, sort_keys=False, width=200))
    return kernels
