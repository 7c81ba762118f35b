"""The parametric latency forms of the kernel classes, written once: `planner calibrate` fits them to
the measured tables (and stores the tables' departures from them as correction grids,
`kernel_grids.py`), and the calibrated step model evaluates them at a deployment's shapes.

All functions take numpy arrays or floats in SI units (seconds, bytes, FLOP/s) and broadcast.
A form's fixed time t0 is added by the caller.
"""

import numpy as np

from planner.model.architecture import expert_touch_fraction

__all__ = [
    "ACTIVATION_OUT_BYTES",
    "MLA_KV_VALUES_PER_TOKEN",
    "MLA_PREFILL_HEAD_DIM_SUM",
    "MOE_GATED_MATMULS",
    "alpha_rate_s",
    "decode_attention_s",
    "gemm_work",
    "gqa_decode_kv_bytes",
    "gqa_prefill_flops",
    "mla_decode_kv_bytes",
    "mla_prefill_flops",
    "moe_work",
    "prefill_attention_s",
    "ramp_parts",
    "ring_factor",
]

ACTIVATION_OUT_BYTES = 2.0  # GEMM outputs are written in bf16 whatever the input format
MOE_GATED_MATMULS = 3.0  # gate, up and down projections of a gated expert MLP
MLA_KV_VALUES_PER_TOKEN = 576.0  # DeepSeek MLA latent cache: 512 compressed KV + 64 RoPE key values (the tables' shape)
MLA_PREFILL_HEAD_DIM_SUM = 192.0 + 128.0  # q.k head dim (128 nope + 64 rope) plus v head dim


def gemm_work(m, n, k, weight_bytes: float, activation_bytes: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dense GEMM of m rows, n output and k input features: FLOPs 2mnk; bytes n k b_w + m k b_a + 2 m n;
    and the weight bytes alone n k b_w."""
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    weights = n * k * weight_bytes
    return 2.0 * m * n * k, weights + m * k * activation_bytes + m * n * ACTIVATION_OUT_BYTES, weights


def moe_work(tokens, hidden, inter, topk, experts, tp, ep, weight_bytes: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Grouped expert GEMM of one gated MoE layer on one GPU with T tokens entering the layer:
    FLOPs 2 x 3 T topk H I / (tp ep); bytes of the experts the tokens touch, E (1 - (1 - k/E)^T) / ep x
    3 H I / tp x b_w; and the rows per expert, T topk / E."""
    tokens, hidden, inter, topk, experts, tp, ep = (np.asarray(x, dtype=float) for x in (tokens, hidden, inter, topk, experts, tp, ep))
    flops = 2.0 * MOE_GATED_MATMULS * tokens * topk * hidden * inter / (tp * ep)
    touched = experts * expert_touch_fraction(tokens, topk, experts) / ep
    return flops, touched * MOE_GATED_MATMULS * hidden * inter / tp * weight_bytes, tokens * topk / experts


def ramp_parts(flops, n_bytes, rows, eta_max: float, m_half: float, eta_m: float, peak_flops_per_s: float,
               hbm_bytes_per_s: float) -> tuple[np.ndarray, np.ndarray]:
    """The two bounds of a GEMM-like kernel, FLOPs / (F eta_max m/(m + m_half)) and bytes / (BW eta_m);
    its time is t0 + the larger."""
    rows = np.maximum(np.asarray(rows, dtype=float), 1e-9)
    compute = np.asarray(flops, dtype=float) / (peak_flops_per_s * eta_max * rows / (rows + m_half))
    return compute, np.asarray(n_bytes, dtype=float) / (hbm_bytes_per_s * eta_m)


def gqa_decode_kv_bytes(batch, kv_len, kv_heads, head_dim, kv_bytes: float) -> np.ndarray:
    """KV bytes one decode-attention layer reads: batch x len x 2 x kv_heads x head_dim x b_kv."""
    return np.asarray(batch, dtype=float) * kv_len * 2.0 * kv_heads * head_dim * kv_bytes


def mla_decode_kv_bytes(batch, kv_len, kv_bytes: float, values_per_token: float | None = None) -> np.ndarray:
    """Latent-cache bytes one MLA decode layer reads: batch x len x values per token (the tables' 576
    unless given) x b_kv."""
    return np.asarray(batch, dtype=float) * kv_len * (values_per_token or MLA_KV_VALUES_PER_TOKEN) * kv_bytes


def decode_attention_s(kv_bytes, batch_heads, eta_kv: float, c_s: float, hbm_bytes_per_s: float) -> np.ndarray:
    """Decode attention beyond its fixed time: KV bytes / (BW eta_kv) + c x sequences x query heads."""
    return np.asarray(kv_bytes, dtype=float) / (hbm_bytes_per_s * eta_kv) + c_s * np.asarray(batch_heads, dtype=float)


def gqa_prefill_flops(batch, seq, heads, head_dim) -> np.ndarray:
    """Causal prefill attention of one layer: 2 b n h s^2 (half of the full 4 b n h s^2)."""
    seq = np.asarray(seq, dtype=float)
    return 2.0 * np.asarray(batch, dtype=float) * heads * head_dim * seq * seq


def mla_prefill_flops(batch, seq, heads) -> np.ndarray:
    """Causal MLA prefill of one layer: b n s^2 (192 + 128)."""
    seq = np.asarray(seq, dtype=float)
    return np.asarray(batch, dtype=float) * heads * seq * seq * MLA_PREFILL_HEAD_DIM_SUM


def prefill_attention_s(flops, seq, eta_max: float, s_half: float, peak_flops_per_s: float) -> np.ndarray:
    """Prefill attention beyond its fixed time: FLOPs / (F eta_max s/(s + s_half))."""
    seq = np.maximum(np.asarray(seq, dtype=float), 1.0)
    return np.asarray(flops, dtype=float) / (peak_flops_per_s * eta_max * seq / (seq + s_half))


def ring_factor(op: str, n) -> np.ndarray:
    """Bytes each rank sends per byte of buffer in a ring: 2(n-1)/n for all-reduce, (n-1)/n otherwise."""
    n = np.asarray(n, dtype=float)
    return (2.0 if op == "all_reduce" else 1.0) * (n - 1) / n


def alpha_rate_s(n_bytes, rate_bytes_per_s: float) -> np.ndarray:
    """A collective beyond its fixed time alpha: bytes / rate."""
    return np.asarray(n_bytes, dtype=float) / rate_bytes_per_s
