"""The edges of `planner calibrate`: the DeepEP all-to-all tables brought to one shape, and the
writer of kernels.yaml (a commented header with the forms, then one flow-style line per fit) and of
the grid files next to it."""

from pathlib import Path

import pandas as pd
import yaml

from planner.hardware.kernel_grids import write_grid_file
from planner.units import US

__all__ = ["KERNELS_HEADER", "all_to_all_rows", "kernel_catalog_text", "write_kernel_catalog"]

A2A_COLUMNS = ["mode", "phase", "tokens", "topk", "hidden", "experts", "nodes", "latency_s"]
A2A_MODES = {  # comm_backend of moe_a2a_perf -> kernels.yaml mode (DeepEP high-throughput = normal)
    "trtllm_deepep_ll": "low_latency", "deepep_ll": "low_latency",
    "trtllm_deepep_ht": "normal", "deepep_ht": "normal",
}
A2A_HALF_DTYPES = ("bfloat16", "default")  # rows that move bf16 tokens
PHASES = ("dispatch", "combine")

KERNELS_HEADER = """\
# Kernel rates from `planner calibrate` on measured kernel tables. Generated: do not edit by hand.
# Each fit is a parametric form (SI units; F = catalog dense peak of the format, BW = catalog HBM bandwidth) times a
# correction grid: log(measured / form) at log-spaced nodes of the class's shape axes, stored as `grid` in the
# accelerator's `grids` file, interpolated multilinearly in log space, held at its edge beyond the measured range.
#   gemm:              t = t0 + max(2MNK / (F eta_max M/(M + m_half)), (N K b_w + M K b_a + 2 M N) / (BW eta_m)); grid over M, N, K
#                      eta_stream: HBM streaming rate / BW of the <= 16-row shapes whose weights exceed 4x L2 (stream_rows of them);
#                      the step model charges every GEMM at least t0 + N K b_w / (BW eta_stream) (weights cold in L2)
#   moe:               the gemm form with M = T topk / E tokens per expert, FLOPs = 2 x 3 T topk H I / (tp ep),
#                      bytes = E (1 - (1 - topk/E)^T) / ep x 3 H I / tp x b_w (gated experts, T = tokens entering the layer);
#                      one grid over T per measured (hidden, inter / tp, experts / ep, topk, experts)
#   moe_routing:       the same, measured under a skewed router (power_law_<alpha>: tokens per expert drawn from a power law,
#                      the most loaded expert-parallel rank measured)
#   moe_wide_ep:       the same, behind DeepEP (SGLang's wide-EP tables), per DeepEP mode (low_latency: decode, normal: prefill)
#   attention_decode:  t = t0 + kv_bytes / (BW eta_kv) + c x batch x heads; kv_bytes = batch x len x 2 x kv_heads x head_dim x b_kv;
#                      one grid over (batch, len) per measured (heads, kv_heads, head_dim)
#   attention_prefill: t = t0 + 2 b n h s^2 / (F_bf16 eta_max s/(s + s_half)) (bf16 fmha, causal; keyed by KV format);
#                      grid over (s, width = FLOPs / s^2), the width binned to nodes a factor 2 apart
#   mla_decode:        t = t0 + batch x len x 576 x b_kv / (BW eta_kv) + c x batch x heads; one grid over (batch, len) per heads
#   mla_prefill:       t = t0 + b n s^2 (192 + 128) / (F_bf16 eta_max s/(s + s_half)) (causal; keyed by KV format); grid as prefill
#   all_reduce, nccl:  t = alpha + ring x bytes / bus_bytes_per_s; ring 2(n-1)/n for all_reduce, (n-1)/n otherwise; bytes = elements x 2;
#                      grid over the message bytes per group size
#   all_to_all:        t = alpha + tokens x topk x hidden x 2 / bytes_per_s per phase (DeepEP; tokens per rank; rows within `nodes` nodes);
#                      one grid over tokens per measured (hidden, topk, experts)
# Attention, GEMM and MoE are per layer and GPU, heads per GPU; b_w, b_a, b_kv are the planner's bytes per value
# (nvfp4 0.5625, mxfp4 0.53125). t0 (alpha) is measured, not fitted: the median latency of the least-work 1% of the table's shapes.
# fit_spread = [p10, p50, p90] of measured / form. loo_error = [median, p90] of |predicted / measured - 1| when each measured row
# is predicted with itself (its grid node) left out (loo_rows scored of `rows`); spread = [p10, p50, p90] of measured / predicted over
# the same rows: the range a prediction quotes. smoothed: the grid is a running median of five nodes along its first axis, kept
# because its leave-one-out mean |log error| was below the raw grid's (calibrate_grids.py). suspect: tables left out because their
# measurement looks wrong.
"""


def _sglang_rows(tables, name: str, mode: str) -> tuple[list[pd.DataFrame], set[str]]:
    """SGLang's DeepEP tables: low-latency rows report *_avg_t_us, normal rows *_transmit_us + *_notify_us."""
    table = tables.newest("comm", "sglang", name)
    if table is None:
        return [], set()
    rows = table[0][table[0]["node_num"] == 1]
    frames = []
    for phase in PHASES:
        if mode == "low_latency":
            latency_us = rows[f"{phase}_avg_t_us"]
        else:
            latency_us = rows[f"{phase}_transmit_us"] + rows[f"{phase}_notify_us"]
        frames.append(pd.DataFrame({
            "mode": mode, "phase": phase, "tokens": rows["num_token"], "topk": rows["num_topk"],
            "hidden": rows["hidden_size"], "experts": rows["num_experts"], "nodes": rows["node_num"],
            "latency_s": latency_us * US,
        }))
    return frames, {table[1]}


def _moe_a2a_rows(tables, engine: str) -> tuple[list[pd.DataFrame], set[str]]:
    """TensorRT-LLM's and vLLM's moe_a2a table (latency in microseconds), bf16 single-node rows."""
    table = tables.newest("comm", engine, "moe_a2a_perf.parquet")
    if table is None:
        return [], set()
    rows = table[0]
    rows = rows[rows["comm_backend"].isin(list(A2A_MODES)) & rows["comm_dtype"].isin(A2A_HALF_DTYPES) & (rows["node_num"] == 1)]
    frame = pd.DataFrame({
        "mode": rows["comm_backend"].map(A2A_MODES), "phase": rows["phase"], "tokens": rows["num_tokens"],
        "topk": rows["topk"], "hidden": rows["hidden_size"], "experts": rows["num_experts"], "nodes": rows["node_num"],
        "latency_s": rows["latency"] * US,
    })
    return [frame], {table[1]} if len(frame) else set()


def all_to_all_rows(tables, engine: str) -> tuple[pd.DataFrame, set[str]]:
    """Every DeepEP dispatch/combine row of `engine` on one system as columns A2A_COLUMNS (SI), and
    the table versions read. `tables` is a planner.hardware.calibrate.Tables."""
    frames, versions = [], set()
    if engine == "sglang":
        for name, mode in (("wideep_deepep_ll_perf.parquet", "low_latency"), ("wideep_deepep_normal_perf.parquet", "normal")):
            more, used = _sglang_rows(tables, name, mode)
            frames += more
            versions |= used
    more, used = _moe_a2a_rows(tables, engine)
    frames += more
    versions |= used
    frames = [f for f in frames if len(f)]
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=A2A_COLUMNS)
    return rows, versions


class _Dumper(yaml.SafeDumper):
    """Block style for nesting, flow style for a fit (a mapping of scalars and short lists)."""


def _represent_dict(dumper: yaml.SafeDumper, data: dict) -> yaml.Node:
    leaf = all(not isinstance(v, dict) for v in data.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", list(data.items()), flow_style=leaf)


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)


def _represent_float(dumper: yaml.SafeDumper, data: float) -> yaml.Node:
    """Four significant digits in the shortest form YAML still reads as a float (2.489e+11, 1544.0)."""
    text = f"{data:.4g}"
    mantissa, _, exponent = text.partition("e")
    if mantissa.lstrip("-").isdigit():
        mantissa += ".0"
    return dumper.represent_scalar("tag:yaml.org,2002:float", mantissa + ("e" + exponent if exponent else ""))


_Dumper.add_representer(dict, _represent_dict)
_Dumper.add_representer(float, _represent_float)
_Dumper.add_representer(list, _represent_list)


def kernel_catalog_text(record: dict) -> str:
    """kernels.yaml text of a `calibrate` record: the header, then the record in insertion order."""
    body = yaml.dump(record, Dumper=_Dumper, sort_keys=False, width=400, allow_unicode=True)
    return KERNELS_HEADER + body


def write_kernel_catalog(record: dict, path: Path, grids: dict[str, dict] | None = None) -> None:
    """Write a `calibrate` record as kernels.yaml at `path` (creating folders), and each accelerator's
    grids (`grids[accelerator id]`, by name) at the file its entry names, relative to `path`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(kernel_catalog_text(record))
    for accel_id, arrays in (grids or {}).items():
        write_grid_file(target.parent / record["accelerators"][accel_id]["grids"], arrays)
