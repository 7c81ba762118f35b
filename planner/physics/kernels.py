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


@dataclass(frozen=True)
class KernelTime:
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


def _timed(t0_s: float, compute, memory, correction, count, spread: Spread, cold_s=None) -> KernelTime:
    """count x (t0 + max(compute, memory)) x correction, at least count x cold_s; the first min(t0, t)
    of each kernel is fixed, the rest goes to the larger bound (memory where the cold floor binds)."""
    compute, memory = np.asarray(compute, dtype=float), np.asarray(memory, dtype=float)
    total = (t0_s + np.maximum(compute, memory)) * correction
    by_compute = compute > memory
    if cold_s is not None:
        by_compute = by_compute & (total >= cold_s)
        total = np.maximum(total, cold_s)
    fixed = np.minimum(t0_s, total)
    scale = count * spread.p50
    rest = (total - fixed) * scale
    on_compute = rest * by_compute
    return KernelTime(on_compute, rest - on_compute, fixed * scale + 0.0 * rest, spread)


def gemm_kernel(curve: Ramp, m, n, k, count, peak_flops_per_s: float, hbm_bytes_per_s: float, weight_bytes: float,
                activation_bytes: float, key: tuple | None = None) -> KernelTime:
    """Dense GEMMs of one format at their measured rates, summed over shapes: `count` launches of each
    (n, k) (arrays of S shapes, count (S, pp); or one shape, count (pp,)) at m rows, each at least its
    weights streamed from HBM at the measured streaming rate. `key`: the shapes' ((n, k), ...) when
    the caller keeps it (the grid caches its lines by it)."""
    n, k = np.asarray(n, dtype=float).reshape(-1, 1, 1), np.asarray(k, dtype=float).reshape(-1, 1, 1)
    count = np.asarray(count, dtype=float).reshape(len(n), 1, -1)
    rows = np.asarray(m, dtype=float)[None]
    flops, n_bytes, weights = gemm_work(rows, n, k, weight_bytes, activation_bytes)
    compute, memory = ramp_parts(flops, n_bytes, rows, curve.eta_max, curve.m_half, curve.eta_m, peak_flops_per_s, hbm_bytes_per_s)
    grid = grid_of(curve)
    if grid is not None:
        key = key or tuple(zip(n.ravel().tolist(), k.ravel().tolist(), strict=True))
        correction = grid.along(0, np.maximum(rows[0], 1e-9), key)
    else:
        correction = 1.0
    cold = curve.t0_s + weights / (hbm_bytes_per_s * curve.eta_stream) if curve.eta_stream else None
    t = _timed(curve.t0_s, compute, memory, correction, count, curve.spread, cold)
    return KernelTime(t.compute_s.sum(axis=0), t.memory_s.sum(axis=0), t.fixed_s.sum(axis=0), t.spread)


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


def elementwise_kernel(n_bytes, n_ops, hbm_bytes_per_s: float) -> KernelTime:
    """Norms, activations, embedding, sampling: bytes / (0.8 BW) + 3 us per op (aiconfigurator's rule)."""
    memory = np.asarray(n_bytes, dtype=float) / (hbm_bytes_per_s * ELEMENTWISE_HBM_FRACTION)
    fixed = np.asarray(n_ops * ELEMENTWISE_FIXED_S, dtype=float) + 0.0 * memory
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


def all_to_all_kernel(curve: AllToAll, tokens, key: tuple[float, float, float], in_domain_bytes, cross_domain_bytes,
                      cross_domain_bytes_per_s: float, n_calls) -> np.ndarray:
    """n_calls expert all-to-all phases of `tokens` per rank: the in-domain part at the measured rate
    (alpha + bytes / rate, times the grid of the (hidden, topk, experts) measured nearest to `key`)
    or the part crossing scale-up domains (alpha + bytes over the NICs), whichever is slower."""
    grid = grid_of(curve, key)
    correction = grid.correction(np.maximum(tokens, 1e-9)) if grid is not None else 1.0
    in_domain = (curve.alpha_s + alpha_rate_s(in_domain_bytes, curve.bytes_per_s)) * correction
    cross = curve.alpha_s + alpha_rate_s(cross_domain_bytes, cross_domain_bytes_per_s)
    return n_calls * np.maximum(in_domain, cross) * curve.spread.p50
