"""Kernel-class times of the calibrated step model: each kernel class at the rate measured for its
shape (`hardware.kernels` curves), split into the part that is compute, the part that is memory
traffic and the fixed part, so that a step can say which roofline term each microsecond belongs to.

All functions take numpy arrays (or floats) and return arrays of the same shape, in seconds.
"""

from dataclasses import dataclass

import numpy as np

from planner.hardware.kernels import (
    AllToAll,
    Collective,
    DecodeAttention,
    PrefillAttention,
    Ramp,
    Spread,
)

__all__ = [
    "ELEMENTWISE_FIXED_S",
    "ELEMENTWISE_HBM_FRACTION",
    "KernelTime",
    "all_reduce_kernel",
    "all_to_all_kernel",
    "decode_attention_kernel",
    "elementwise_kernel",
    "prefill_attention_kernel",
    "ramp_kernel",
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
    class's measured/fitted percentiles (the median is already applied to the times)."""

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


def _split(compute: np.ndarray, memory: np.ndarray, fixed: np.ndarray, spread: Spread) -> KernelTime:
    compute, memory = np.asarray(compute, dtype=float), np.asarray(memory, dtype=float)
    bound_by_compute = compute > memory
    return KernelTime(np.where(bound_by_compute, compute, 0.0) * spread.p50, np.where(bound_by_compute, 0.0, memory) * spread.p50,
                      np.asarray(fixed, dtype=float) * spread.p50 + 0.0 * compute, spread)


def ramp_kernel(curve: Ramp, flops, n_bytes, rows, n_kernels, peak_flops_per_s: float, hbm_bytes_per_s: float) -> KernelTime:
    """GEMM-like kernels (dense GEMM: rows = tokens; grouped expert GEMM: rows = tokens per expert):
    n_kernels x t0 + max(FLOPs / (F eta_max rows/(rows + m_half)), bytes / (BW eta_m))."""
    rows = np.maximum(np.asarray(rows, dtype=float), 1e-9)
    eta_c = curve.eta_max * rows / (rows + curve.m_half)
    return _split(flops / (peak_flops_per_s * eta_c), n_bytes / (hbm_bytes_per_s * curve.eta_m), n_kernels * curve.t0_s, curve.spread)


def decode_attention_kernel(curve: DecodeAttention, kv_bytes, sequence_heads, n_layers, hbm_bytes_per_s: float) -> KernelTime:
    """Decode attention over a stage's layers: KV bytes / (BW eta_kv) + c x sequences x query heads per
    layer (the per-(sequence, head) work that dominates at short contexts), + t0 per layer."""
    memory = kv_bytes / (hbm_bytes_per_s * curve.eta_kv) + curve.c_s * sequence_heads * n_layers
    return _split(0.0 * memory, memory, n_layers * curve.t0_s, curve.spread)


def prefill_attention_kernel(curve: PrefillAttention, flops, context_tokens, n_layers, bf16_flops_per_s: float) -> KernelTime:
    """Prefill attention: causal FLOPs / (F_bf16 eta_max s/(s + s_half)), + t0 per layer."""
    s = np.maximum(np.asarray(context_tokens, dtype=float), 1.0)
    compute = flops / (bf16_flops_per_s * curve.eta_max * s / (s + curve.s_half))
    return _split(compute, 0.0 * compute, n_layers * curve.t0_s, curve.spread)


def elementwise_kernel(n_bytes, n_ops, hbm_bytes_per_s: float) -> KernelTime:
    """Norms, activations, embedding, sampling: bytes / (0.8 BW) + 3 us per op (aiconfigurator's rule)."""
    memory = np.asarray(n_bytes, dtype=float) / (hbm_bytes_per_s * ELEMENTWISE_HBM_FRACTION)
    return _split(0.0 * memory, memory, n_ops * ELEMENTWISE_FIXED_S, Spread())


def all_reduce_kernel(curve: Collective, message_bytes, n_members: int, n_calls) -> np.ndarray:
    """n_calls all-reduces of `message_bytes` over `n_members` in one scale-up domain:
    alpha + 2 (n-1)/n x bytes / bus bandwidth each, median-corrected."""
    if n_members <= 1:
        return 0.0 * np.asarray(message_bytes, dtype=float)
    per_call = curve.alpha_s + 2 * (n_members - 1) / n_members * message_bytes / curve.bus_bytes_per_s
    return n_calls * per_call * curve.spread.p50


def all_to_all_kernel(curve: AllToAll, in_domain_bytes, cross_domain_bytes, cross_domain_bytes_per_s: float, n_calls) -> np.ndarray:
    """n_calls expert all-to-all phases: alpha + the slower of the in-domain part (at the measured
    in-node rate) and the part crossing scale-up domains (over the NICs), which run side by side."""
    in_domain = np.asarray(in_domain_bytes, dtype=float) / curve.bytes_per_s
    cross = np.asarray(cross_domain_bytes, dtype=float) / cross_domain_bytes_per_s
    return n_calls * (curve.alpha_s + np.maximum(in_domain, cross)) * curve.spread.p50
