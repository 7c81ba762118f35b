"""`planner calibrate`: fit compact kernel curves to NVIDIA aiconfigurator's measured kernel tables and
write them as `topologies/kernels.yaml` (read by planner/hardware/kernels.py).

The tables are the parquet files of the aiconfigurator-core wheel (Apache-2.0) under
`aiconfigurator_core/systems/data/<system>/<family>/<engine>/<version>/`. Their latencies are in
milliseconds (DeepEP tables: microseconds); every attention, GEMM and MoE row is one layer on one GPU;
communication `message_size` is an element count. Per (accelerator, engine) and kernel format the
newest version holding usable rows is fitted; the forms are in planner/hardware/calibrate_fits.py.
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

from planner.errors import PlannerInputError, unknown_name_issue
from planner.hardware.calibrate_fits import (
    fit_alpha_rate,
    fit_attention_decode,
    fit_attention_prefill,
    fit_gemm,
    fit_mla_decode,
    fit_mla_prefill,
    fit_moe,
    ring_factor,
)
from planner.hardware.calibrate_io import all_to_all_rows, write_kernel_catalog
from planner.hardware.catalog import Accelerator, HardwareCatalog, load_hardware_catalog
from planner.precision import FlopsFormat, Precision, bytes_per_value
from planner.units import MS

__all__ = ["ENGINES", "SYSTEM_ACCELERATORS", "Tables", "calibrate", "package_version", "version_key", "write_kernel_catalog"]

SYSTEM_ACCELERATORS = {  # aiconfigurator system name -> planner accelerator id
    "h100_sxm": "h100-sxm", "h200_sxm": "h200-sxm", "b200_sxm": "b200",
    "gb200": "gb200", "b300_sxm": "b300", "gb300": "gb300",
}
ENGINES = ("trtllm", "sglang", "vllm")
SOURCE = {"package": "aiconfigurator-core", "license": "Apache-2.0", "tables": "aiconfigurator_core/systems/data"}
GEMM_MIN_NK = 1024  # fit dense GEMMs on planner-sized shapes only: tiny N or K misfit by 2-4x
MIN_ROWS = 8
HALF_BYTES = bytes_per_value(Precision.BF16)  # collectives and DeepEP tables move bf16/half elements

# table format -> (key in kernels.yaml, tensor-core format, stored weight/activation precision)
GEMM_FORMATS = {
    "bfloat16": ("bf16", FlopsFormat.BF16, Precision.BF16),
    "fp8": ("fp8", FlopsFormat.FP8, Precision.FP8),
    "fp8_block": ("fp8_block", FlopsFormat.FP8, Precision.FP8),
    "nvfp4": ("fp4", FlopsFormat.FP4, Precision.NVFP4),
}
MOE_FORMATS = {
    "fp8_block": ("fp8_block", FlopsFormat.FP8, Precision.FP8),
    "bfloat16": ("bf16", FlopsFormat.BF16, Precision.BF16),
    "fp8": ("fp8", FlopsFormat.FP8, Precision.FP8),
    "nvfp4": ("fp4", FlopsFormat.FP4, Precision.NVFP4),
    "w4a16_mxfp4": ("mxfp4", FlopsFormat.BF16, Precision.MXFP4),
}
KV_FORMATS = {"bfloat16": ("bf16", Precision.BF16), "fp8": ("fp8", Precision.FP8)}
NCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")
A2A_ORDER = [(m, p) for m in ("low_latency", "normal") for p in ("dispatch", "combine")]


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
        return pd.read_parquet(self.root / family / engine / version / name)

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
    """What the fits of one (system, engine) share, and the suspect tables they skipped."""

    tables: Tables
    engine: str
    accel: Accelerator
    notes: list[str] = field(default_factory=list)

    def suspect(self, kernel_class: str, fmt: str) -> bool:
        """True (and noted) when the table of `kernel_class` in `fmt` is on the suspect list."""
        for rule in SUSPECT:
            if (rule.engine, rule.kernel_class, rule.fmt) == (self.engine, kernel_class, fmt) and \
                    (rule.systems is None or self.tables.system in rule.systems):
                self.notes.append(f"{self.engine} {fmt} {kernel_class}: {rule.reason}")
                return True
        return False


def _min_latency(rows: pd.DataFrame, keys: list[str], column: str = "latency") -> pd.DataFrame:
    """One row per shape: the fastest of the kernels measured for it."""
    return rows.groupby(keys, as_index=False)[column].min()


def _columns(frame: pd.DataFrame, names: Iterable[str]) -> list[np.ndarray]:
    return [frame[name].to_numpy(dtype=float) for name in names]


def _window_zero(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["window_size"] == 0] if "window_size" in rows else rows


# ---------------------------------------------------------------------------------------------
# Kernel classes of one engine: each returns ({class: {format: fit}}, versions used)


def _gemm(ctx: _Context) -> tuple[dict, set[str]]:
    fits, versions = {}, set()
    found = ctx.tables.newest_by_format("gemm", ctx.engine, "gemm_perf.parquet", "gemm_dtype", lambda d: d)
    for table_fmt, (key, flops_fmt, precision) in GEMM_FORMATS.items():
        if table_fmt not in found or flops_fmt not in ctx.accel.dense_flops_per_s or ctx.suspect("gemm", key):
            continue
        rows, version = found[table_fmt]
        shapes = _min_latency(rows[np.minimum(rows["n"], rows["k"]) >= GEMM_MIN_NK], ["m", "n", "k"])
        if len(shapes) < MIN_ROWS:
            continue
        b = bytes_per_value(precision)
        fits[key] = fit_gemm(*_columns(shapes, ("m", "n", "k")), shapes["latency"].to_numpy() * MS,
                             ctx.accel.dense_flops_per_s[flops_fmt], ctx.accel.hbm_bandwidth_bytes_per_s, b, b)
        versions.add(version)
    return {"gemm": fits}, versions


# Routing skews of the measured MoE tables besides "balanced": aiconfigurator's collector draws
# tokens-per-expert from a power law of exponent alpha and puts the most loaded expert-parallel rank
# on the measured GPU (collector/helper.py, _generate_power_law_distribution).
MOE_ROUTINGS = ("power_law_1.01", "power_law_1.2")


def _gated(distribution: str) -> Callable[[pd.DataFrame], pd.DataFrame]:
    return lambda rows: rows[(rows["distribution"] == distribution) & ~rows["kernel_source"].astype(str).str.contains("nongated")]


MOE_KEYS = ["num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size"]


def _moe_fits(ctx: _Context, distribution: str) -> tuple[dict, set[str]]:
    fits, versions = {}, set()
    found = ctx.tables.newest_by_format("moe", ctx.engine, "moe_perf.parquet", "moe_dtype", _gated(distribution))
    for table_fmt, (key, flops_fmt, precision) in MOE_FORMATS.items():
        if table_fmt not in found or flops_fmt not in ctx.accel.dense_flops_per_s or ctx.suspect("moe", key):
            continue
        rows, version = found[table_fmt]
        shapes = _min_latency(rows, MOE_KEYS)
        if len(shapes) < MIN_ROWS:
            continue
        fits[key] = fit_moe(*_columns(shapes, MOE_KEYS), shapes["latency"].to_numpy() * MS,
                            ctx.accel.dense_flops_per_s[flops_fmt], ctx.accel.hbm_bandwidth_bytes_per_s,
                            bytes_per_value(precision))
        versions.add(version)
    return fits, versions


def _moe(ctx: _Context) -> tuple[dict, set[str]]:
    """Grouped expert GEMMs under balanced routing (`moe`) and under each measured skew (`moe_routing`)."""
    fits, versions = _moe_fits(ctx, "balanced")
    routed = {}
    for distribution in MOE_ROUTINGS:
        skewed, used = _moe_fits(ctx, distribution)
        if skewed:
            routed[distribution] = skewed
            versions |= used
    return {"moe": fits, "moe_routing": routed}, versions


def _kv_groups(ctx: _Context, kernel_class: str, rows: pd.DataFrame) -> Iterable[tuple[str, Precision, pd.DataFrame]]:
    """(key, KV precision, rows) per KV format of a table, suspect formats skipped."""
    for table_fmt, group in rows.groupby("kv_cache_dtype"):
        if table_fmt in KV_FORMATS and not ctx.suspect(kernel_class, KV_FORMATS[table_fmt][0]):
            key, precision = KV_FORMATS[table_fmt]
            yield key, precision, group


DECODE_KEYS = ["batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim"]
PREFILL_KEYS = ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim"]


def _attention(ctx: _Context) -> tuple[dict, set[str]]:
    decode, prefill, versions = {}, {}, set()
    bandwidth, peak_bf16 = ctx.accel.hbm_bandwidth_bytes_per_s, ctx.accel.dense_flops_per_s[FlopsFormat.BF16]
    if table := ctx.tables.newest("attention", ctx.engine, "generation_attention_perf.parquet"):
        for key, precision, group in _kv_groups(ctx, "attention_decode", _window_zero(table[0])):
            shapes = _min_latency(group, DECODE_KEYS)
            if len(shapes) >= MIN_ROWS:
                batch, isl, step, heads, kv_heads, head_dim = _columns(shapes, DECODE_KEYS)
                decode[key] = fit_attention_decode(batch, isl + step, heads, kv_heads, head_dim,
                                                   shapes["latency"].to_numpy() * MS, bandwidth, bytes_per_value(precision))
                versions.add(table[1])
    if table := ctx.tables.newest("attention", ctx.engine, "context_attention_perf.parquet"):
        rows = _window_zero(table[0])
        for key, _, group in _kv_groups(ctx, "attention_prefill", rows[rows["attn_dtype"] == "bfloat16"]):
            shapes = _min_latency(group, PREFILL_KEYS)
            if len(shapes) >= MIN_ROWS:
                batch, isl, heads, _, head_dim = _columns(shapes, PREFILL_KEYS)
                prefill[key] = fit_attention_prefill(batch, isl, heads, head_dim, shapes["latency"].to_numpy() * MS, peak_bf16)
                versions.add(table[1])
    return {"attention_decode": decode, "attention_prefill": prefill}, versions


def _mla(ctx: _Context) -> tuple[dict, set[str]]:
    decode, prefill, versions = {}, {}, set()
    if table := ctx.tables.newest("mla", ctx.engine, "generation_mla_perf.parquet"):
        for key, precision, group in _kv_groups(ctx, "mla_decode", table[0]):
            shapes = _min_latency(group, ["batch_size", "isl", "step", "num_heads"])
            if len(shapes) >= MIN_ROWS:
                batch, isl, step = _columns(shapes, ("batch_size", "isl", "step"))
                decode[key] = fit_mla_decode(batch, isl + step, shapes["latency"].to_numpy() * MS,
                                             ctx.accel.hbm_bandwidth_bytes_per_s, bytes_per_value(precision))
                versions.add(table[1])
    if table := ctx.tables.newest("mla", ctx.engine, "context_mla_perf.parquet"):
        rows = table[0][table[0]["mla_dtype"] == "bfloat16"]
        for key, _, group in _kv_groups(ctx, "mla_prefill", rows):
            shapes = _min_latency(group, ["batch_size", "isl", "num_heads"])
            if len(shapes) >= MIN_ROWS:
                fit_args = _columns(shapes, ("batch_size", "isl", "num_heads"))
                prefill[key] = fit_mla_prefill(*fit_args, shapes["latency"].to_numpy() * MS,
                                               ctx.accel.dense_flops_per_s[FlopsFormat.BF16])
                versions.add(table[1])
    return {"mla_decode": decode, "mla_prefill": prefill}, versions


def _collectives(rows: pd.DataFrame, op: str) -> dict[str, dict]:
    """alpha + ring bytes / bus bandwidth per group size of one collective (message_size in elements)."""
    fits = {}
    for n, group in rows.groupby("num_gpus"):
        sizes = _min_latency(group, ["message_size"])
        if len(sizes) >= MIN_ROWS // 2:
            ring_bytes = sizes["message_size"].to_numpy(dtype=float) * HALF_BYTES * ring_factor(op, int(n))
            fits[str(int(n))] = fit_alpha_rate(ring_bytes, sizes["latency"].to_numpy() * MS, "bus_bytes_per_s")
    return fits


def _all_reduce(ctx: _Context) -> tuple[dict, set[str]]:
    table = ctx.tables.newest("comm", ctx.engine, "custom_allreduce_perf.parquet")
    if table is None:
        return {}, set()
    rows = table[0]
    graph = rows["kernel_source"].astype(str).str.contains("graph")
    rows = rows[graph] if graph.any() else rows  # CUDA-graph timings, as an engine runs decode steps
    fits = _collectives(rows, "all_reduce")
    return {"all_reduce": fits}, {table[1]} if fits else set()


def _all_to_all(ctx: _Context) -> tuple[dict, set[str]]:
    rows, versions = all_to_all_rows(ctx.tables, ctx.engine)
    fits: dict[str, dict] = {}
    for (mode, phase), group in sorted(rows.groupby(["mode", "phase"]), key=lambda item: A2A_ORDER.index(item[0])):
        shapes = _min_latency(group, ["tokens", "topk", "hidden", "experts", "nodes"], "latency_s")
        if len(shapes) >= MIN_ROWS // 2:
            tokens, topk, hidden = _columns(shapes, ("tokens", "topk", "hidden"))
            fit = fit_alpha_rate(tokens * topk * hidden * HALF_BYTES, shapes["latency_s"].to_numpy(), "bytes_per_s")
            fits.setdefault(str(mode), {})[str(phase)] = fit | {"nodes": int(shapes["nodes"].max())}
    return {"all_to_all": fits}, versions if fits else set()


CLASS_FAMILIES: tuple[tuple[str, Callable[[_Context], tuple[dict, set[str]]]], ...] = (
    ("gemm", _gemm), ("moe", _moe), ("attention", _attention), ("mla", _mla), ("comm", _all_reduce), ("comm", _all_to_all),
)


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


def _nccl(tables: Tables) -> dict:
    """NCCL collectives (nccl-tests, fp16 buffers) of the newest NCCL version measured on the system."""
    table = tables.newest("comm", "nccl", "nccl_perf.parquet")
    if table is None:
        return {}
    rows = table[0][table[0]["nccl_dtype"] == "half"]
    fits = {op: _collectives(rows[rows["op_name"] == op], op) for op in NCCL_OPS}
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


def calibrate(tables_dir: Path, systems: Iterable[str] = tuple(SYSTEM_ACCELERATORS), engines: Iterable[str] = ENGINES,
              catalog: HardwareCatalog | None = None, version: str | None = None) -> dict:
    """Fit every kernel class of `systems` x `engines` found under `tables_dir` (an unpacked
    `aiconfigurator_core/systems/data`). Returns the kernels.yaml record: source and accelerators."""
    catalog = catalog or load_hardware_catalog()
    root = Path(tables_dir)
    accelerators: dict[str, dict] = {}
    for system in _system_names(systems):
        if not (root / system).is_dir():
            continue
        tables = Tables(root, system)
        accel = catalog.accelerators[SYSTEM_ACCELERATORS[system]]
        entry: dict = {"system": system}
        if nccl := _nccl(tables):
            entry["nccl"] = nccl
        fitted = {e: _engine_record(_Context(tables, e, accel)) for e in engines}
        entry["engines"] = {e: r for e, r in fitted.items() if r}
        if "nccl" in entry or entry["engines"]:
            accelerators[accel.id] = entry
    source = {"package": SOURCE["package"], "version": version or package_version(root), **SOURCE}
    return {"source": source, "accelerators": accelerators}
