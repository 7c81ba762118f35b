"""Kernel-class times of the calibrated step model: each kernel at the rate measured for its own shape
(`hardware.kernels` curves: a parametric form from `hardware.kernel_forms` times the correction grid
measured around it), split into the part that is compute, the part that is memory traffic and the
fixed part, so that a step can say which roofline term each microsecond belongs to.

A kernel's time is t = (t0 + max(compute, memory)) x correction: t0 is its class's measured floor,
the larger bound says what the rest is bound by, and the correction is the grid's factor at the shape
(1 without a grid). GEMMs are charged at least t0 + weight bytes / (BW eta_stream): in a step every
layer's weights come from HBM, while the tables timed a matrix that fits in L2 over and over.

All functions take numpy arrays (or floats) and return arrays of the broadcast shape, in seconds.
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from planner.hardware.kernel_forms import (
    alpha_rate_s,
    decode_attention_s,
    gemm_work,
    gqa_prefill_flops,
    mla_prefill_flops,
    moe_work,
    prefill_attention_s,
    ramp_parts,
    ring_factor,
)
from planner.hardware.kernel_grids import Cells, cell, log_of, on_lines
from planner.hardware.kernels import (
    AllToAll,
    Collective,
    DecodeAttention,
    HeadShape,
    PrefillAttention,
    Ramp,
    Spread,
    grid_of,
)

__all__ = [
    "ELEMENTWISE_FIXED_S",
    "ELEMENTWISE_HBM_FRACTION",
    "ExpertShape",
    "KernelTime",
    "all_reduce_kernel",
    "all_to_all_factor",
    "all_to_all_kernel",
    "decode_attention_kernel",
    "elementwise_kernel",
    "gemm_kernel",
    "moe_kernel",
    "prefill_attention_kernel",
    "total_kernel_time",
]

# aiconfigurator prices every elementwise op (add + norm, activation, embedding) as
# bytes / (0.8 x HBM peak) + 3 us (its system files: mem_bw_empirical_scaling_factor 0.8,
# mem_empirical_constant_latency 3e-6). The planner does the same for norms, activations,
# embedding and sampling.
ELEMENTWISE_HBM_FRACTION = 0.8
ELEMENTWISE_FIXED_S = 3e-6


class KernelTime(NamedTuple):  # a tuple: made a few dozen times per table, for speed
    """One kernel class's time split by what bounds it; arrays of one shape. `spread` is the
    class's measured/predicted percentiles (the median is already applied to the times)."""

    compute_s: np.ndarray  # time of kernels that are compute-bound
    memory_s: np.ndarray  # time of kernels that are bound by HBM traffic
    fixed_s: np.ndarray  # launch and synchronisation floors
    spread: Spread

    @property
    def total_s(self) -> np.ndarray:
        return self.compute_s + self.memory_s + self.fixed_s

    def range_s(self) -> tuple[np.ndarray, np.ndarray]:
        """p10 and p90 of the class's time."""
        scale = self.total_s / self.spread.p50
        return scale * self.spread.p10, scale * self.spread.p90


def total_kernel_time(parts: list[KernelTime]) -> KernelTime:
    """Several kernels of one class (one spread) as one."""
    return KernelTime(sum(p.compute_s for p in parts), sum(p.memory_s for p in parts), sum(p.fixed_s for p in parts), parts[0].spread)


def _split(t0_s, compute, memory, correction, scale, cold_s=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t0 + max(compute, memory)) x correction, at least cold_s, times `scale` (launches x the
    spread's median): the first min(t0, t) of each kernel is fixed, the rest goes to the larger bound
    (memory where the cold floor binds). Returns the compute, memory and fixed parts."""
    compute, memory = np.asarray(compute, dtype=float), np.asarray(memory, dtype=float)
    total = (t0_s + np.maximum(compute, memory)) * correction
    by_compute = compute > memory
    if cold_s is not None:
        by_compute = by_compute & (total >= cold_s)
        total = np.maximum(total, cold_s)
    fixed = np.minimum(t0_s, total)
    rest = (total - fixed) * scale
    on_compute = rest * by_compute
    return on_compute, rest - on_compute, fixed * scale  # of rest's shape: fixed has total's, scale the rest


def _timed(t0_s: float, compute, memory, correction, count, spread: Spread, cold_s=None) -> KernelTime:
    """count x (t0 + max(compute, memory)) x correction, at least count x cold_s (`_split`)."""
    return KernelTime(*_split(t0_s, compute, memory, correction, count * spread.p50, cold_s), spread)


class GemmPart(NamedTuple):
    """Dense GEMMs of one format: `count` launches per stage of each (n, k) (arrays of S shapes, count
    (S, pp); or one shape, count (pp,)); `key` their ((n, k), ...) when the caller keeps it (the grid
    caches its lines by it)."""

    curve: Ramp
    n: np.ndarray
    k: np.ndarray
    count: np.ndarray
    peak_flops_per_s: float
    weight_bytes: float
    activation_bytes: float
    key: tuple | None = None


@dataclass(frozen=True)
class DenseGemms:
    """GemmParts side by side, priced in one evaluation: per shape, its (n, k) and its part's curve
    constants as (S, 1, 1) arrays, and launches x the curve's median (S, 1, pp); `parts` lists each
    part's (first shape, end, spread); `factors` the shapes whose grid lines are read at the same rows
    on the same nodes: (first, end, the nodes' Cells, their lines (None: no grid), at the last rows)."""

    n: np.ndarray
    k: np.ndarray
    weight_bytes: np.ndarray
    activation_bytes: np.ndarray
    peak_flops_per_s: np.ndarray
    eta_max: np.ndarray
    m_half: np.ndarray
    eta_m: np.ndarray
    t0_s: np.ndarray
    cold_s: np.ndarray | None  # t0 + weight bytes / (BW eta_stream); -inf for a curve without eta_stream
    scale: np.ndarray
    hbm_bytes_per_s: float
    parts: tuple[tuple[int, int, Spread], ...]
    factors: tuple[tuple[int, int, Cells | None, np.ndarray | None, bool], ...]


def _factor_groups(parts: list[GemmPart], sizes: list[int], last_apart: bool) -> tuple:
    """Consecutive parts whose grids share their row nodes (and rows), their lines stacked."""
    groups, start = [], 0
    for j, (p, size) in enumerate(zip(parts, sizes, strict=True)):
        grid, last = grid_of(p.curve), last_apart and j == len(parts) - 1
        cells = grid.cells[0] if grid is not None else None
        lines = grid.lines(0, p.key) if grid is not None else None
        prev = groups[-1] if groups else None
        if prev is not None and lines is not None and prev[3] is not None and prev[2] is cells and prev[4] == last:
            groups[-1] = (prev[0], start + size, cells, np.concatenate([prev[3], lines]), last)
        else:
            groups.append((start, start + size, cells, lines, last))
        start += size
    return tuple(groups)


def dense_gemms(parts: list[GemmPart], hbm_bytes_per_s: float, last_apart: bool = False) -> DenseGemms:
    """The batch-independent side of `dense_gemm_time` for `parts` (in order); `last_apart`: the last
    part runs at rows of its own."""
    columns: dict[str, list[np.ndarray]] = {}
    index, start, streamed, keyed = [], 0, False, []
    for p in parts:
        n, k = np.asarray(p.n, dtype=float).reshape(-1, 1, 1), np.asarray(p.k, dtype=float).reshape(-1, 1, 1)
        c = p.curve
        _, _, weights = gemm_work(0.0, n, k, p.weight_bytes, p.activation_bytes)
        cold = c.t0_s + weights / (hbm_bytes_per_s * c.eta_stream) if c.eta_stream else np.full(n.shape, -np.inf)
        streamed = streamed or bool(c.eta_stream)
        per_shape = {"n": n, "k": k, "cold_s": cold, "scale": np.asarray(p.count, dtype=float).reshape(len(n), 1, -1) * c.spread.p50}
        for name, value in (("weight_bytes", p.weight_bytes), ("activation_bytes", p.activation_bytes), ("eta_max", c.eta_max),
                            ("m_half", c.m_half), ("eta_m", c.eta_m), ("peak_flops_per_s", p.peak_flops_per_s), ("t0_s", c.t0_s)):
            per_shape[name] = np.full(n.shape, float(value))
        for name, value in per_shape.items():
            columns.setdefault(name, []).append(value)
        keyed.append(p._replace(key=p.key or tuple(zip(n.ravel().tolist(), k.ravel().tolist(), strict=True))))
        index.append((start, start + len(n), c.spread))
        start += len(n)
    arrays = {name: np.concatenate(values) if len(values) > 1 else values[0] for name, values in columns.items()}
    arrays["cold_s"] = arrays["cold_s"] if streamed else None
    factors = _factor_groups(keyed, [end - first for first, end, _ in index], last_apart)
    return DenseGemms(**arrays, hbm_bytes_per_s=hbm_bytes_per_s, parts=tuple(index), factors=factors)


def _grid_factors(g: DenseGemms, m, last_m) -> np.ndarray:
    """Every shape's grid factor at its rows: one interpolation per group of `g.factors`, the cells
    found once per row nodes and rows."""
    found, out = {}, []
    for first, end, cells, lines, last in g.factors:
        rows = np.maximum(np.asarray(last_m if last else m, dtype=float), 1e-9)
        if lines is None:
            out.append(np.ones((end - first, *np.shape(rows))))
        elif cells is None:
            out.append(np.exp(lines[:, np.zeros(np.shape(rows), dtype=int)] * 1.0))
        else:
            if (id(cells), last) not in found:
                found[(id(cells), last)] = cell(cells, log_of(rows))
            out.append(on_lines(lines, *found[(id(cells), last)]))
    return np.concatenate(out) if len(out) > 1 else out[0]


def dense_gemm_time(g: DenseGemms, m, last_m=None) -> KernelTime:
    """The GEMMs of `g` at m rows ((n, 1) or a float), the last part at `last_m` when it runs apart:
    each at its measured rate and grid factor, at least its weights streamed from HBM; summed over
    each part's shapes, then over the parts (the first part's spread)."""
    rows = np.asarray(m, dtype=float)[None]
    if last_m is not None:  # rows per shape, in C order like every array here (the sums over shapes below add in memory order)
        first, end = g.parts[-1][:2]
        rows = np.empty((end, *np.broadcast_shapes(rows.shape[1:], np.shape(last_m))))
        rows[:first], rows[first:] = m, last_m
    flops, n_bytes, _ = gemm_work(rows, g.n, g.k, g.weight_bytes, g.activation_bytes)
    compute, memory = ramp_parts(flops, n_bytes, rows, g.eta_max, g.m_half, g.eta_m, g.peak_flops_per_s, g.hbm_bytes_per_s)
    terms = _split(g.t0_s, compute, memory, _grid_factors(g, m, last_m), g.scale, g.cold_s)
    total = None
    for first, end, _ in g.parts:  # one shape's sum over shapes is that shape's time
        part = [term[first] if end - first == 1 else term[first:end].sum(axis=0) for term in terms]
        total = part if total is None else [a + b for a, b in zip(total, part, strict=True)]
    return KernelTime(*total, g.parts[0][2])


def gemm_kernel(curve: Ramp, m, n, k, count, peak_flops_per_s: float, hbm_bytes_per_s: float, weight_bytes: float,
                activation_bytes: float, key: tuple | None = None) -> KernelTime:
    """Dense GEMMs of one format at their measured rates, summed over shapes (`dense_gemm_time` of one
    GemmPart)."""
    return dense_gemm_time(dense_gemms([GemmPart(curve, n, k, count, peak_flops_per_s, weight_bytes, activation_bytes, key)],
                                       hbm_bytes_per_s), m)


@dataclass(frozen=True)
class ExpertShape:
    """A MoE layer's routed experts as one GPU holds them."""

    hidden: float
    inter: float  # expert width (whole expert; split by tp)
    topk: float
    experts: float
    tp: float  # tensor parallelism inside an expert
    ep: float
    slot_factor: float = 1.0  # expert slots held over experts (redundant copies of hot experts)


def moe_kernel(curve: Ramp, tokens, shape: ExpertShape, count, peak_flops_per_s: float, hbm_bytes_per_s: float, weight_bytes: float,
               imbalance: float, eta_stream: float = 0.0) -> KernelTime:
    """`count` grouped expert GEMMs with `tokens` entering the layer: the form on `moe_work` with the
    hottest rank's FLOPs (x imbalance) and the slots' bytes, times the grid of the measured expert
    shape nearest to the model's; at least the touched weights streamed from HBM."""
    s = shape
    flops, n_bytes, rows = moe_work(tokens, s.hidden, s.inter, s.topk, s.experts, s.tp, s.ep, weight_bytes)
    n_bytes = n_bytes * s.slot_factor
    compute, memory = ramp_parts(flops * imbalance, n_bytes, rows, curve.eta_max, curve.m_half, curve.eta_m, peak_flops_per_s, hbm_bytes_per_s)
    grid = grid_of(curve, (s.hidden, s.inter / s.tp, s.experts * s.slot_factor / s.ep, s.topk, s.experts))
    correction = grid.correction(np.maximum(tokens, 1e-9)) if grid is not None else 1.0
    cold = curve.t0_s + n_bytes / (hbm_bytes_per_s * eta_stream) if eta_stream else None
    return _timed(curve.t0_s, compute, memory, correction, count, curve.spread, cold)


def decode_attention_kernel(curve: DecodeAttention, batch, kv_len: float, heads: HeadShape, kv_bytes_read, n_layers,
                            hbm_bytes_per_s: float) -> KernelTime:
    """Decode attention of `n_layers` layers, each reading `kv_bytes_read` for `batch` sequences per rank
    at KV length `kv_len`: KV bytes / (BW eta_kv) + c x sequences x query heads, + t0 per layer, times
    the grid of the head configuration measured nearest to the model's (MLA tables: by query heads)."""
    batch = np.maximum(np.asarray(batch, dtype=float), 1e-9)
    memory = decode_attention_s(kv_bytes_read, batch * heads.heads, curve.eta_kv, curve.c_s, hbm_bytes_per_s)
    grid = grid_of(curve, (heads.heads,) if curve.mla else (heads.heads, heads.kv_heads, heads.head_dim))
    correction = grid.correction(batch, kv_len) if grid is not None else 1.0
    return _timed(curve.t0_s, 0.0 * memory, memory, correction, n_layers, curve.spread)


def prefill_attention_kernel(curve: PrefillAttention, flops, context_tokens, n_layers, bf16_flops_per_s: float) -> KernelTime:
    """Prefill attention of `n_layers` layers doing `flops` in all: per layer, causal FLOPs / (F_bf16
    eta_max s/(s + s_half)) + t0, times the grid of the curve's head configuration (bound by
    `KernelRates.with_heads`) at the prompts per pass its FLOPs imply."""
    s = max(float(context_tokens), 1.0)
    per_layer = np.asarray(flops, dtype=float) / np.maximum(n_layers, 1)
    compute = prefill_attention_s(per_layer, s, curve.eta_max, curve.s_half, bf16_flops_per_s)
    correction = 1.0
    if curve.grid is not None and curve.shape is not None:
        h = curve.shape
        one_prompt = mla_prefill_flops(1.0, s, h.heads) if curve.mla else gqa_prefill_flops(1.0, s, h.heads, h.head_dim)
        grid = grid_of(curve, (h.heads,) if curve.mla else (h.heads, h.kv_heads, h.head_dim))
        correction = grid.correction(np.maximum(per_layer / one_prompt, 1e-9), s)
    return _timed(curve.t0_s, compute, 0.0 * compute, correction, n_layers, curve.spread)


def elementwise_kernel(n_bytes, n_ops, hbm_bytes_per_s: float, fraction: float = ELEMENTWISE_HBM_FRACTION,
                       per_op_s: float = ELEMENTWISE_FIXED_S) -> KernelTime:
    """Norms, activations, embedding, sampling: bytes / (fraction BW) + a fixed time per op; by default
    aiconfigurator's rule (0.8 BW, 3 us), else a probe's measured curve."""
    memory = np.asarray(n_bytes, dtype=float) / (hbm_bytes_per_s * fraction)
    fixed = np.asarray(n_ops * per_op_s, dtype=float) + 0.0 * memory
    return KernelTime(0.0 * memory, memory, fixed, Spread())


def all_reduce_kernel(curve: Collective, message_bytes, n_members: int, n_calls) -> np.ndarray:
    """n_calls all-reduces of `message_bytes` over `n_members` in one scale-up domain with the engine's
    algorithm as measured: alpha + 2 (n-1)/n x bytes / bus bandwidth, times the grid at the message size."""
    message_bytes = np.asarray(message_bytes, dtype=float)
    if n_members <= 1:
        return 0.0 * message_bytes
    per_call = curve.alpha_s + alpha_rate_s(ring_factor("all_reduce", n_members) * message_bytes, curve.bus_bytes_per_s)
    grid = grid_of(curve)
    correction = grid.correction(np.maximum(message_bytes, 1.0)) if grid is not None else 1.0
    return n_calls * per_call * correction * curve.spread.p50


def all_to_all_factor(curve: AllToAll, key: tuple[float, float, float], tokens, found: dict | None = None):
    """The grid factor of an all-to-all phase at `tokens` per rank: the grid of the (hidden, topk,
    experts) measured nearest to `key` (1 without a grid). `found`: `Grid.along`'s cells at these
    tokens, shared with the other phase."""
    grid = grid_of(curve, key)
    return grid.along(0, np.maximum(tokens, 1e-9), ((),), found)[0] if grid is not None else 1.0


def all_to_all_kernel(curve: AllToAll, tokens, key: tuple[float, float, float], in_domain_bytes, cross_domain_bytes,
                      cross_domain_bytes_per_s: float, n_calls, found: dict | None = None, cross_domain_latency_s: float = 0.0,
                      correction=None) -> np.ndarray:
    """n_calls expert all-to-all phases of `tokens` per rank: the in-domain part at the measured rate
    (alpha + bytes / rate, times `all_to_all_factor`, or `correction` when the caller has it) or the
    part crossing scale-up domains (alpha + the network's fixed latency + bytes over the NICs),
    whichever is slower."""
    correction = all_to_all_factor(curve, key, tokens, found) if correction is None else correction
    in_domain = (curve.alpha_s + alpha_rate_s(in_domain_bytes, curve.bytes_per_s)) * correction
    crossing = np.asarray(cross_domain_bytes) > 0
    cross = curve.alpha_s + np.where(crossing, cross_domain_latency_s, 0.0) + alpha_rate_s(cross_domain_bytes, cross_domain_bytes_per_s)
    return n_calls * np.maximum(in_domain, cross) * curve.spread.p50
