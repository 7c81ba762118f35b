"""The kernel classes of one engine for `planner calibrate`: each reads its measured table, fits its
parametric form (`calibrate_fits.py`), keeps the table's departures from the form as a correction grid
(`calibrate_grids.py`) and scores what the step model will use by leave-one-out.

Every producer takes the calibration context of one (system, engine) (planner/hardware/calibrate.py,
`_Context`), adds its grids to `ctx.grids` and returns ({class: {format: record}}, versions used).
"""

from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from planner.hardware.calibrate_fits import (
    Fit,
    fit_alpha_rate,
    fit_attention_decode,
    fit_attention_prefill,
    fit_gemm,
    fit_mla_decode,
    fit_mla_prefill,
    fit_moe,
    round_sig,
)
from planner.hardware.calibrate_grids import AxisSpec, build_grid, loo_error, thin_nodes
from planner.hardware.calibrate_io import all_to_all_rows
from planner.hardware.kernel_forms import gemm_work, moe_work, ring_factor
from planner.hardware.kernel_grids import Grid, GridSet
from planner.precision import FlopsFormat, Precision, bytes_per_value
from planner.units import MS

__all__ = ["CLASS_FAMILIES", "HALF_BYTES", "collectives", "min_latency"]

MIN_ROWS = 8
HALF_BYTES = bytes_per_value(Precision.BF16)  # collectives and DeepEP tables move bf16/half elements
GEMM_M_NODE_RATIO = 1.4  # GEMM rows (m) kept as grid nodes at least this far apart; the rows between are held out
STREAM_MAX_ROWS = 16  # GEMMs of at most this many rows are bound by their weight reads...
STREAM_L2_MULTIPLE = 4.0  # ...and those whose weights exceed the L2 cache this many times stream them from HBM
MOE_TOKEN_NODE_RATIO = 1.5  # expert GEMMs: token counts kept as grid nodes at least this far apart

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
    # MXFP4 experts on Blackwell: TensorRT-LLM's CUTLASS backend (its default) runs them with MXFP8
    # activations (`ModelConfig.get_mxfp4_quant_algo`: SM >= 100 and backend not TRITON ->
    # W4A8_MXFP4_MXFP8; Hopper -> W4A16_MXFP4), so where that table exists it is the mxfp4 curve
    "w4a8_mxfp4_mxfp8": ("mxfp4", FlopsFormat.FP8, Precision.MXFP4),
}
KV_FORMATS = {"bfloat16": ("bf16", Precision.BF16), "fp8": ("fp8", Precision.FP8)}
MOE_KEYS = ["num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size"]
MOE_GRID_KEYS = ("hidden", "inter_per_gpu", "experts_per_gpu", "topk", "experts")
# Routing skews of the measured MoE tables besides "balanced": aiconfigurator's collector draws
# tokens-per-expert from a power law of exponent alpha and puts the most loaded expert-parallel rank
# on the measured GPU (collector/helper.py, _generate_power_law_distribution).
MOE_ROUTINGS = ("power_law_1.01", "power_law_1.2")
HEAD_KEYS = ("heads", "kv_heads", "head_dim")  # an attention grid per measured head configuration (per GPU)
DECODE_KEYS = ["batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim"]
PREFILL_KEYS = ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim"]


def min_latency(rows: pd.DataFrame, keys: list[str], column: str = "latency") -> pd.DataFrame:
    """One row per shape: the fastest of the kernels measured for it."""
    return rows.groupby(keys, as_index=False)[column].min()


def _columns(frame: pd.DataFrame, names: Iterable[str]) -> list[np.ndarray]:
    return [frame[name].to_numpy(dtype=float) for name in names]


def _record(fit: Fit, name: str, latency_s: np.ndarray, predicted_s: np.ndarray) -> dict:
    """The fit's record with its grid's name and the leave-one-out error of grid x form (the spread
    the step model quotes comes from the same residuals)."""
    error, ratio, scored = loo_error(latency_s, predicted_s)
    return fit.record | {"grid": name, "loo_error": [round_sig(e) for e in error], "spread": [round_sig(r) for r in ratio],
                         "rows": len(latency_s), "loo_rows": scored}


def _chosen(latency_s: np.ndarray, candidates: list[np.ndarray]) -> int:
    """Index of the candidate leave-one-out predictions with the smallest mean absolute log error over
    the rows every candidate scores (ties, or no row scored: the first, the raw grid)."""
    scored = np.logical_and.reduce([np.isfinite(p) & (p > 0) for p in candidates])
    if not scored.any():
        return 0
    loss = [float(np.mean(np.abs(np.log(p[scored] / latency_s[scored])))) for p in candidates]
    return int(np.argmin(loss))


def _floored(predicted_s: np.ndarray, floor_s) -> np.ndarray:
    return predicted_s if floor_s is None else np.maximum(predicted_s, floor_s)


def scored_grid(ctx, name: str, fit: Fit, latency_s: np.ndarray, axes: list[AxisSpec], floor_s=None) -> dict:
    """Build the correction grids of `fit` over `axes` (raw and smoothed, calibrate_grids.py), store the
    one that predicts its held-out rows better as `name`, and score it."""
    builds = build_grid(axes, np.log(latency_s / fit.fitted_s))
    predicted = [_floored(fit.fitted_s * np.exp(b.predicted_log), floor_s) for b in builds]
    best = _chosen(latency_s, predicted)
    ctx.grids[name] = Grid(tuple(a.nodes for a in axes), builds[best].values)
    return _record(fit, name, latency_s, predicted[best]) | ({"smoothed": True} if best else {})


def scored_grid_set(ctx, name: str, fit: Fit, latency_s: np.ndarray, keys: np.ndarray, key_names: tuple[str, ...],
                    coords: list[np.ndarray], nodes: list[np.ndarray], floor_s=None) -> dict:
    """One correction grid per distinct row of `keys` (rows of equal keys pooled) over shared axes; the
    set raw or smoothed as a whole, whichever predicts its held-out rows better."""
    distinct, which = np.unique(np.round(keys, 9), axis=0, return_inverse=True)
    values = [[], []]
    predicted_log = np.full((2, len(latency_s)), np.nan)
    log_correction = np.log(latency_s / fit.fitted_s)
    for i in range(len(distinct)):
        rows = which.ravel() == i
        builds = build_grid([AxisSpec(c[rows], n) for c, n in zip(coords, nodes, strict=True)], log_correction[rows])
        for j, build in enumerate(builds):
            values[j].append(build.values)
            predicted_log[j, rows] = build.predicted_log
    predicted = [_floored(fit.fitted_s * np.exp(p), floor_s) for p in predicted_log]
    best = _chosen(latency_s, predicted)
    ctx.grids[name] = GridSet(key_names, distinct, tuple(nodes), np.stack(values[best]))
    return _record(fit, name, latency_s, predicted[best]) | ({"smoothed": True} if best else {})


# ---------------------------------------------------------------------------------------------
# GEMMs


def _stream_fraction(m, n, k, latency_s, t0_s: float, weight_bytes: float, hbm_bytes_per_s: float, l2_bytes: float) -> tuple[float, int]:
    """The HBM streaming rate of weight-bound GEMMs as a fraction of the catalog peak: the median of
    weight bytes / (latency - t0) over the shapes of at most STREAM_MAX_ROWS rows whose weights exceed
    the L2 cache STREAM_L2_MULTIPLE times (timed with warm caches, these still come from HBM)."""
    weights = n * k * weight_bytes
    rows = (m <= STREAM_MAX_ROWS) & (weights >= STREAM_L2_MULTIPLE * l2_bytes) & (latency_s > t0_s)
    if rows.sum() < MIN_ROWS:
        return 0.0, 0
    return float(np.median(weights[rows] / (latency_s[rows] - t0_s)) / hbm_bytes_per_s), int(rows.sum())


def _gemm(ctx) -> tuple[dict, set[str]]:
    fits, versions = {}, set()
    found = ctx.tables.newest_by_format("gemm", ctx.engine, "gemm_perf.parquet", "gemm_dtype", lambda d: d)
    bandwidth = ctx.accel.hbm_bandwidth_bytes_per_s
    for table_fmt, (key, flops_fmt, precision) in GEMM_FORMATS.items():
        if table_fmt not in found or flops_fmt not in ctx.accel.dense_flops_per_s or ctx.suspect("gemm", key):
            continue
        rows, version = found[table_fmt]
        shapes = min_latency(rows, ["m", "n", "k"])
        if len(shapes) < MIN_ROWS:
            continue
        m, n, k = _columns(shapes, "mnk")
        latency_s, b = shapes["latency"].to_numpy() * MS, bytes_per_value(precision)
        fit = fit_gemm(m, n, k, latency_s, ctx.accel.dense_flops_per_s[flops_fmt], bandwidth, b, b)
        t0_s = fit.record["t0_s"]
        eta_stream, stream_rows = _stream_fraction(m, n, k, latency_s, t0_s, b, bandwidth, ctx.l2_bytes)
        floor_s = t0_s + gemm_work(m, n, k, b, b)[2] / (bandwidth * eta_stream) if eta_stream else None
        axes = [AxisSpec(m, thin_nodes(m, GEMM_M_NODE_RATIO)), AxisSpec(n, np.unique(n)), AxisSpec(k, np.unique(k))]
        fits[key] = scored_grid(ctx, f"{ctx.engine}/gemm/{key}", fit, latency_s, axes, floor_s)
        if eta_stream:
            fits[key] |= {"eta_stream": round_sig(eta_stream), "stream_rows": stream_rows}
            ctx.stream_fraction[key] = fits[key]["eta_stream"]
        versions.add(version)
    return {"gemm": fits}, versions


def _gated(distribution: str) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """Gated experts under `distribution`, as the engine's default MoE backend runs them: TensorRT-LLM's
    default backend is CUTLASS (`MoeConfig.backend`), so its TRTLLM-gen kernels, measured as
    `moe_torch_flow_min_latency` and run only when a deployment asks for backend TRTLLM (its
    min-latency recipes), are left out (calibration keeps the fastest kernel per shape)."""
    def usable(rows: pd.DataFrame) -> pd.DataFrame:
        source = rows["kernel_source"].astype(str)
        return rows[(rows["distribution"] == distribution) & ~source.str.contains("nongated") & ~source.str.contains("min_latency")]
    return usable


def _moe_fits(ctx, distribution: str) -> tuple[dict, set[str]]:
    fits, versions = {}, set()
    found = ctx.tables.newest_by_format("moe", ctx.engine, "moe_perf.parquet", "moe_dtype", _gated(distribution))
    bandwidth = ctx.accel.hbm_bandwidth_bytes_per_s
    for table_fmt, (key, flops_fmt, precision) in MOE_FORMATS.items():
        if table_fmt not in found or flops_fmt not in ctx.accel.dense_flops_per_s or ctx.suspect("moe", key):
            continue
        rows, version = found[table_fmt]
        shapes = min_latency(rows, MOE_KEYS)
        if len(shapes) < MIN_ROWS:
            continue
        tokens, hidden, inter, topk, experts, tp, ep = _columns(shapes, MOE_KEYS)
        latency_s, b = shapes["latency"].to_numpy() * MS, bytes_per_value(precision)
        fit = fit_moe(tokens, hidden, inter, topk, experts, tp, ep, latency_s, ctx.accel.dense_flops_per_s[flops_fmt], bandwidth, b)
        eta_stream = ctx.stream_fraction.get(key)
        touched_bytes = moe_work(tokens, hidden, inter, topk, experts, tp, ep, b)[1]
        floor_s = fit.record["t0_s"] + touched_bytes / (bandwidth * eta_stream) if eta_stream else None
        keys = np.column_stack([hidden, inter / tp, experts / ep, topk, experts])
        fit.record["flops_format"] = str(flops_fmt)  # the table's activation format: the kernel's math rate
        name = f"{ctx.engine}/moe/{distribution}/{key}"
        fits[key] = scored_grid_set(ctx, name, fit, latency_s, keys, MOE_GRID_KEYS, [tokens], [thin_nodes(tokens, MOE_TOKEN_NODE_RATIO)], floor_s)
        versions.add(version)
    return fits, versions


def _moe(ctx) -> tuple[dict, set[str]]:
    """Grouped expert GEMMs under balanced routing (`moe`) and under each measured skew (`moe_routing`)."""
    fits, versions = _moe_fits(ctx, "balanced")
    routed = {}
    for distribution in MOE_ROUTINGS:
        skewed, used = _moe_fits(ctx, distribution)
        if skewed:
            routed[distribution] = skewed
            versions |= used
    return {"moe": fits, "moe_routing": routed}, versions


# SGLang's wide expert parallelism (DeepEP dispatch, DeepGEMM grouped GEMMs on the tokens each rank
# receives) is measured in tables of its own, one per DeepEP mode (aiconfigurator-core uses them for
# SGLang wide-EP): its moe_perf table times the fused MoE that runs without DeepEP, whose latency
# barely drops with the expert-parallel degree (H200, DeepSeek shape, 16,384 tokens: 15.3 ms at EP1,
# 8.9 ms at EP32).
WIDE_EP_TABLES = {"low_latency": "wideep_generation_moe_perf.parquet", "normal": "wideep_context_moe_perf.parquet"}
WIDE_EP_ROUTINGS = {"uniform": "balanced", **{r: r for r in MOE_ROUTINGS}}


def _moe_wide_ep(ctx) -> tuple[dict, set[str]]:
    """Grouped expert GEMMs behind DeepEP, per DeepEP mode and routing, where the engine has the tables."""
    out, versions = {}, set()
    bandwidth = ctx.accel.hbm_bandwidth_bytes_per_s
    for mode, name in WIDE_EP_TABLES.items():
        table = ctx.tables.newest("moe", ctx.engine, name)
        if table is None:
            continue
        for (distribution, table_fmt), rows in table[0].groupby(["distribution", "moe_dtype"]):
            if distribution not in WIDE_EP_ROUTINGS or table_fmt not in MOE_FORMATS:
                continue
            key, flops_fmt, precision = MOE_FORMATS[table_fmt]
            shapes = min_latency(rows, MOE_KEYS)
            if len(shapes) < MIN_ROWS or flops_fmt not in ctx.accel.dense_flops_per_s:
                continue
            tokens, hidden, inter, topk, experts, tp, ep = _columns(shapes, MOE_KEYS)
            latency_s, b = shapes["latency"].to_numpy() * MS, bytes_per_value(precision)
            fit = fit_moe(tokens, hidden, inter, topk, experts, tp, ep, latency_s, ctx.accel.dense_flops_per_s[flops_fmt], bandwidth, b)
            routing = WIDE_EP_ROUTINGS[distribution]
            record = scored_grid_set(ctx, f"{ctx.engine}/moe_wide_ep/{mode}/{routing}/{key}", fit, latency_s,
                                     np.column_stack([hidden, inter / tp, experts / ep, topk, experts]), MOE_GRID_KEYS, [tokens],
                                     [thin_nodes(tokens, MOE_TOKEN_NODE_RATIO)])
            out.setdefault(mode, {}).setdefault(routing, {})[key] = record
            versions.add(table[1])
    return {"moe_wide_ep": out}, versions


# ---------------------------------------------------------------------------------------------
# Attention


def _kv_groups(ctx, kernel_class: str, rows: pd.DataFrame) -> Iterable[tuple[str, Precision, pd.DataFrame]]:
    """(key, KV precision, rows) per KV format of a table, suspect formats skipped."""
    for table_fmt, group in rows.groupby("kv_cache_dtype"):
        if table_fmt in KV_FORMATS and not ctx.suspect(kernel_class, KV_FORMATS[table_fmt][0]):
            key, precision = KV_FORMATS[table_fmt]
            yield key, precision, group


def _window_zero(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["window_size"] == 0] if "window_size" in rows else rows


def _batch_length_grids(ctx, name: str, fit: Fit, latency_s: np.ndarray, keys: np.ndarray, key_names: tuple[str, ...],
                        batch: np.ndarray, length: np.ndarray) -> dict:
    """Attention: one grid over (sequences, context length) per measured head configuration."""
    return scored_grid_set(ctx, name, fit, latency_s, keys, key_names, [batch, length], [np.unique(batch), np.unique(length)])


def _decode_attention(ctx, table: tuple[pd.DataFrame, str]) -> dict:
    out = {}
    for key, precision, group in _kv_groups(ctx, "attention_decode", _window_zero(table[0])):
        shapes = min_latency(group, DECODE_KEYS)
        if len(shapes) >= MIN_ROWS:
            batch, isl, step, heads, kv_heads, head_dim = _columns(shapes, DECODE_KEYS)
            latency_s, kv_len = shapes["latency"].to_numpy() * MS, isl + step
            fit = fit_attention_decode(batch, kv_len, heads, kv_heads, head_dim, latency_s, ctx.accel.hbm_bandwidth_bytes_per_s,
                                       bytes_per_value(precision))
            out[key] = _batch_length_grids(ctx, f"{ctx.engine}/attention_decode/{key}", fit, latency_s, np.column_stack([heads, kv_heads, head_dim]),
                                           HEAD_KEYS, batch, kv_len)
    return out


def _attention(ctx) -> tuple[dict, set[str]]:
    decode, prefill, versions = {}, {}, set()
    if table := ctx.tables.newest("attention", ctx.engine, "generation_attention_perf.parquet"):
        decode = _decode_attention(ctx, table)
        versions |= {table[1]} if decode else set()
    if table := ctx.tables.newest("attention", ctx.engine, "context_attention_perf.parquet"):
        rows = _window_zero(table[0])
        for key, _, group in _kv_groups(ctx, "attention_prefill", rows[rows["attn_dtype"] == "bfloat16"]):
            shapes = min_latency(group, PREFILL_KEYS)
            if len(shapes) >= MIN_ROWS:
                batch, isl, heads, kv_heads, head_dim = _columns(shapes, PREFILL_KEYS)
                latency_s = shapes["latency"].to_numpy() * MS
                fit = fit_attention_prefill(batch, isl, heads, head_dim, latency_s, ctx.accel.dense_flops_per_s[FlopsFormat.BF16])
                prefill[key] = _batch_length_grids(ctx, f"{ctx.engine}/attention_prefill/{key}", fit, latency_s,
                                                   np.column_stack([heads, kv_heads, head_dim]), HEAD_KEYS, batch, isl)
                versions.add(table[1])
    return {"attention_decode": decode, "attention_prefill": prefill}, versions


def _mla(ctx) -> tuple[dict, set[str]]:
    decode, prefill, versions = {}, {}, set()
    bandwidth, peak_bf16 = ctx.accel.hbm_bandwidth_bytes_per_s, ctx.accel.dense_flops_per_s[FlopsFormat.BF16]
    if table := ctx.tables.newest("mla", ctx.engine, "generation_mla_perf.parquet"):
        for key, precision, group in _kv_groups(ctx, "mla_decode", table[0]):
            shapes = min_latency(group, ["batch_size", "isl", "step", "num_heads"])
            if len(shapes) >= MIN_ROWS:
                batch, isl, step, heads = _columns(shapes, ("batch_size", "isl", "step", "num_heads"))
                latency_s, kv_len = shapes["latency"].to_numpy() * MS, isl + step
                fit = fit_mla_decode(batch, kv_len, heads, latency_s, bandwidth, bytes_per_value(precision))
                decode[key] = _batch_length_grids(ctx, f"{ctx.engine}/mla_decode/{key}", fit, latency_s, heads[:, None], ("heads",),
                                                  batch, kv_len)
                versions.add(table[1])
    if table := ctx.tables.newest("mla", ctx.engine, "context_mla_perf.parquet"):
        rows = table[0][table[0]["mla_dtype"] == "bfloat16"]
        for key, _, group in _kv_groups(ctx, "mla_prefill", rows):
            shapes = min_latency(group, ["batch_size", "isl", "num_heads"])
            if len(shapes) >= MIN_ROWS:
                batch, isl, heads = _columns(shapes, ("batch_size", "isl", "num_heads"))
                latency_s = shapes["latency"].to_numpy() * MS
                fit = fit_mla_prefill(batch, isl, heads, latency_s, peak_bf16)
                prefill[key] = _batch_length_grids(ctx, f"{ctx.engine}/mla_prefill/{key}", fit, latency_s, heads[:, None], ("heads",),
                                                   batch, isl)
                versions.add(table[1])
    return {"mla_decode": decode, "mla_prefill": prefill}, versions


# ---------------------------------------------------------------------------------------------
# Communication


def collectives(ctx, rows: pd.DataFrame, op: str, prefix: str) -> dict[str, dict]:
    """alpha + ring bytes / bus bandwidth per group size of one collective (message_size in elements),
    with a correction grid over the message bytes."""
    fits = {}
    for n, group in rows.groupby("num_gpus"):
        sizes = min_latency(group, ["message_size"])
        if len(sizes) >= MIN_ROWS // 2:
            message_bytes = sizes["message_size"].to_numpy(dtype=float) * HALF_BYTES
            latency_s = sizes["latency"].to_numpy() * MS
            fit = fit_alpha_rate(message_bytes * ring_factor(op, int(n)), latency_s, "bus_bytes_per_s")
            axes = [AxisSpec(message_bytes, np.unique(message_bytes))]
            fits[str(int(n))] = scored_grid(ctx, f"{prefix}/{op}/{int(n)}", fit, latency_s, axes)
    return fits


def _all_reduce(ctx) -> tuple[dict, set[str]]:
    table = ctx.tables.newest("comm", ctx.engine, "custom_allreduce_perf.parquet")
    if table is None:
        return {}, set()
    rows = table[0]
    graph = rows["kernel_source"].astype(str).str.contains("graph")
    rows = rows[graph] if graph.any() else rows  # CUDA-graph timings, as an engine runs decode steps
    fits = collectives(ctx, rows, "all_reduce", ctx.engine)
    return {"all_reduce": fits}, {table[1]} if fits else set()


A2A_ORDER = [(m, p) for m in ("low_latency", "normal") for p in ("dispatch", "combine")]


def _all_to_all(ctx) -> tuple[dict, set[str]]:
    rows, versions = all_to_all_rows(ctx.tables, ctx.engine)
    fits: dict[str, dict] = {}
    for (mode, phase), group in sorted(rows.groupby(["mode", "phase"]), key=lambda item: A2A_ORDER.index(item[0])):
        shapes = min_latency(group, ["tokens", "topk", "hidden", "experts", "nodes"], "latency_s")
        if len(shapes) >= MIN_ROWS // 2:
            tokens, topk, hidden, experts = _columns(shapes, ("tokens", "topk", "hidden", "experts"))
            latency_s = shapes["latency_s"].to_numpy()
            fit = fit_alpha_rate(tokens * topk * hidden * HALF_BYTES, latency_s, "bytes_per_s")
            name = f"{ctx.engine}/all_to_all/{mode}/{phase}"
            record = scored_grid_set(ctx, name, fit, latency_s, np.column_stack([hidden, topk, experts]), ("hidden", "topk", "experts"),
                                     [tokens], [np.unique(tokens)])
            fits.setdefault(str(mode), {})[str(phase)] = record | {"nodes": int(shapes["nodes"].max())}
    return {"all_to_all": fits}, versions if fits else set()


CLASS_FAMILIES: tuple[tuple[str, Callable], ...] = (
    ("gemm", _gemm), ("moe", _moe), ("moe", _moe_wide_ep), ("attention", _attention), ("mla", _mla), ("comm", _all_reduce),
    ("comm", _all_to_all),
)
