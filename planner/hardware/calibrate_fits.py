"""The parametric latency forms `planner calibrate` fits to measured kernel tables (numpy and scipy only).

Every function takes one kernel class's measured rows as arrays (SI units: seconds, bytes, FLOP/s)
and returns a small record: the fitted parameters with the unit in their names, `spread` (the 10th,
50th and 90th percentile of measured over fitted time) and `rows`. Fits are least squares on
log(latency), with every parameter fitted as its logarithm inside positive bounds, so that a 10 us
kernel counts as much as a 10 ms one.
"""

from collections.abc import Callable, Sequence

import numpy as np
from scipy.optimize import least_squares

from planner.units import GB, US

__all__ = [
    "SIGNIFICANT_DIGITS",
    "fit_alpha_rate",
    "fit_attention_decode",
    "fit_attention_prefill",
    "fit_gemm",
    "fit_log",
    "fit_mla_decode",
    "fit_mla_prefill",
    "fit_moe",
    "ring_factor",
    "round_sig",
    "spread",
]

SIGNIFICANT_DIGITS = 4
ACTIVATION_OUT_BYTES = 2.0  # GEMM outputs are written in bf16 whatever the input format
MOE_GATED_MATMULS = 3.0  # gate, up and down projections of a gated expert MLP
MLA_KV_VALUES_PER_TOKEN = 576.0  # DeepSeek MLA latent cache: 512 compressed KV + 64 RoPE key values
MLA_PREFILL_HEAD_DIM_SUM = 192.0 + 128.0  # q.k head dim (128 nope + 64 rope) plus v head dim

# Expert GEMMs keep gaining efficiency up to about a thousand tokens per expert (aiconfigurator's
# tables: 0.26-0.29 of fp8 peak measured at >= 1024 tokens per expert on Hopper). A free fit of the
# ramp settles on a half-point of a few tokens and caps the efficiency at 0.1-0.2, wrong by 2x for
# prefill-sized batches; the half-point is held at the dense GEMM's scale instead.
MOE_M_HALF_MIN = 64.0

# Parameter bounds shared by the forms (lower, upper).
T0_BOUNDS_S = (0.1 * US, 5000.0 * US)
ETA_BOUNDS = (1e-3, 2.0)
HALF_BOUNDS = (1e-2, 1e7)  # m_half (rows) and s_half (tokens)
PER_HEAD_BOUNDS_S = (1e-7 * US, 10.0 * US)
RATE_BOUNDS_BYTES_PER_S = (0.1 * GB, 1e5 * GB)
ALPHA_BOUNDS_S = (0.01 * US, 10000.0 * US)

Model = Callable[[np.ndarray], np.ndarray]


def round_sig(value: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    """`value` rounded to `digits` significant digits, as a plain float."""
    return float(f"{float(value):.{digits}g}")


def spread(measured_s: np.ndarray, fitted_s: np.ndarray) -> list[float]:
    """[p10, p50, p90] of measured over fitted time."""
    ratio = np.asarray(measured_s, dtype=float) / np.asarray(fitted_s, dtype=float)
    return [round_sig(q) for q in np.quantile(ratio, [0.1, 0.5, 0.9])]


def fit_log(model: Model, start: Sequence[float], lower: Sequence[float], upper: Sequence[float],
            latency_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares of log(model(p)) against log(latency); returns the parameters and the fitted times."""
    log_y = np.log(latency_s)
    lo, hi = np.log(np.asarray(lower, dtype=float)), np.log(np.asarray(upper, dtype=float))
    x0 = np.clip(np.log(np.asarray(start, dtype=float)), lo + 1e-9, hi - 1e-9)

    def residual(log_p: np.ndarray) -> np.ndarray:
        return np.log(model(np.exp(log_p))) - log_y

    result = least_squares(residual, x0, bounds=(lo, hi), method="trf", max_nfev=3000)
    params = np.exp(result.x)
    return params, model(params)


def _record(names: Sequence[str], params: np.ndarray, latency_s: np.ndarray, fitted_s: np.ndarray) -> dict:
    out: dict = {name: round_sig(p) for name, p in zip(names, params, strict=True)}
    out["spread"] = spread(latency_s, fitted_s)
    out["rows"] = len(latency_s)
    return out


def _ramp(flops: np.ndarray, bytes_moved: np.ndarray, m: np.ndarray, peak_flops_per_s: float,
          hbm_bytes_per_s: float) -> Model:
    """t = t0 + max(FLOPs / (F eta_max m/(m + m_half)), bytes / (BW eta_m)); p = (t0, eta_max, m_half, eta_m)."""

    def model(p: np.ndarray) -> np.ndarray:
        t0_s, eta_max, m_half, eta_m = p
        compute_s = flops / (peak_flops_per_s * eta_max * m / (m + m_half))
        return t0_s + np.maximum(compute_s, bytes_moved / (hbm_bytes_per_s * eta_m))

    return model


RAMP_NAMES = ("t0_s", "eta_max", "m_half", "eta_m")
RAMP_START = (5.0 * US, 0.7, 64.0, 0.7)
RAMP_LOWER = (T0_BOUNDS_S[0], ETA_BOUNDS[0], 1e-3, ETA_BOUNDS[0])
RAMP_UPPER = (T0_BOUNDS_S[1], ETA_BOUNDS[1], HALF_BOUNDS[1], ETA_BOUNDS[1])


def fit_gemm(m: np.ndarray, n: np.ndarray, k: np.ndarray, latency_s: np.ndarray, peak_flops_per_s: float,
             hbm_bytes_per_s: float, weight_bytes: float, activation_bytes: float) -> dict:
    """Dense GEMM (m tokens, n output and k input features): the ramp form on 2mnk FLOPs and
    n k b_w + m k b_a + 2 m n bytes."""
    flops = 2.0 * m * n * k
    bytes_moved = n * k * weight_bytes + m * k * activation_bytes + m * n * ACTIVATION_OUT_BYTES
    model = _ramp(flops, bytes_moved, m, peak_flops_per_s, hbm_bytes_per_s)
    params, fitted = fit_log(model, RAMP_START, RAMP_LOWER, RAMP_UPPER, latency_s)
    return _record(RAMP_NAMES, params, latency_s, fitted)


def fit_moe(tokens: np.ndarray, hidden: np.ndarray, inter: np.ndarray, topk: np.ndarray, experts: np.ndarray,
            tp: np.ndarray, ep: np.ndarray, latency_s: np.ndarray, peak_flops_per_s: float,
            hbm_bytes_per_s: float, weight_bytes: float) -> dict:
    """Grouped expert GEMM of one gated MoE layer on one GPU: the ramp form with m = tokens per expert
    T topk / E, FLOPs 2 x 3 T topk H I / (tp ep) and the weights of the touched experts
    min(E, T topk) / ep x 3 H I / tp x b_w (the tables' balanced router touches every expert once
    T topk >= E)."""
    flops = 2.0 * MOE_GATED_MATMULS * tokens * topk * hidden * inter / (tp * ep)
    tokens_per_expert = tokens * topk / experts
    touched_experts = np.minimum(experts, tokens * topk) / ep
    bytes_moved = touched_experts * MOE_GATED_MATMULS * hidden * inter / tp * weight_bytes
    model = _ramp(flops, bytes_moved, tokens_per_expert, peak_flops_per_s, hbm_bytes_per_s)
    start = (20.0 * US, 0.3, 128.0, 0.5)
    lower = (RAMP_LOWER[0], RAMP_LOWER[1], MOE_M_HALF_MIN, RAMP_LOWER[3])
    params, fitted = fit_log(model, start, lower, RAMP_UPPER, latency_s)
    return _record(RAMP_NAMES, params, latency_s, fitted)


def fit_attention_decode(batch: np.ndarray, kv_len: np.ndarray, heads: np.ndarray, kv_heads: np.ndarray,
                         head_dim: np.ndarray, latency_s: np.ndarray, hbm_bytes_per_s: float,
                         kv_bytes: float) -> dict:
    """Decode attention of one layer (per-GPU heads): t = t0 + KV bytes / (BW eta_kv) + c x batch x heads,
    KV bytes = batch x len x 2 x kv_heads x head_dim x b_kv."""
    kv_bytes_read = batch * kv_len * 2.0 * kv_heads * head_dim * kv_bytes
    batch_heads = batch * heads

    def model(p: np.ndarray) -> np.ndarray:
        t0_s, eta_kv, c_s = p
        return t0_s + kv_bytes_read / (hbm_bytes_per_s * eta_kv) + c_s * batch_heads

    lower = (T0_BOUNDS_S[0], ETA_BOUNDS[0], PER_HEAD_BOUNDS_S[0])
    upper = (T0_BOUNDS_S[1], ETA_BOUNDS[1], PER_HEAD_BOUNDS_S[1])
    params, fitted = fit_log(model, (10.0 * US, 0.7, 0.005 * US), lower, upper, latency_s)
    return _record(("t0_s", "eta_kv", "c_s"), params, latency_s, fitted)


def _prefill(flops: np.ndarray, seq: np.ndarray, latency_s: np.ndarray, peak_flops_per_s: float) -> dict:
    """t = t0 + FLOPs / (F eta_max s/(s + s_half))."""

    def model(p: np.ndarray) -> np.ndarray:
        t0_s, eta_max, s_half = p
        return t0_s + flops / (peak_flops_per_s * eta_max * seq / (seq + s_half))

    lower = (T0_BOUNDS_S[0], ETA_BOUNDS[0], HALF_BOUNDS[0])
    upper = (T0_BOUNDS_S[1], ETA_BOUNDS[1], HALF_BOUNDS[1])
    params, fitted = fit_log(model, (10.0 * US, 0.5, 512.0), lower, upper, latency_s)
    return _record(("t0_s", "eta_max", "s_half"), params, latency_s, fitted)


def fit_attention_prefill(batch: np.ndarray, seq: np.ndarray, heads: np.ndarray, head_dim: np.ndarray,
                          latency_s: np.ndarray, peak_flops_per_s: float) -> dict:
    """Causal prefill attention of one layer: FLOPs 2 b n h s^2 (half of the full 4 b n h s^2)."""
    return _prefill(2.0 * batch * heads * head_dim * seq * seq, seq, latency_s, peak_flops_per_s)


def fit_mla_decode(batch: np.ndarray, kv_len: np.ndarray, latency_s: np.ndarray, hbm_bytes_per_s: float,
                   kv_bytes: float) -> dict:
    """MLA decode of one layer: t = t0 + batch x len x 576 x b_kv / (BW eta_kv)."""
    kv_bytes_read = batch * kv_len * MLA_KV_VALUES_PER_TOKEN * kv_bytes

    def model(p: np.ndarray) -> np.ndarray:
        t0_s, eta_kv = p
        return t0_s + kv_bytes_read / (hbm_bytes_per_s * eta_kv)

    lower = (T0_BOUNDS_S[0], ETA_BOUNDS[0])
    upper = (T0_BOUNDS_S[1], ETA_BOUNDS[1])
    params, fitted = fit_log(model, (10.0 * US, 0.5), lower, upper, latency_s)
    return _record(("t0_s", "eta_kv"), params, latency_s, fitted)


def fit_mla_prefill(batch: np.ndarray, seq: np.ndarray, heads: np.ndarray, latency_s: np.ndarray,
                    peak_flops_per_s: float) -> dict:
    """Causal MLA prefill of one layer (per-GPU heads): FLOPs b n s^2 (192 + 128)."""
    return _prefill(batch * heads * seq * seq * MLA_PREFILL_HEAD_DIM_SUM, seq, latency_s, peak_flops_per_s)


def ring_factor(op: str, n: int) -> float:
    """Bytes each rank sends per byte of buffer in a ring: 2(n-1)/n for all-reduce, (n-1)/n otherwise."""
    return (2.0 if op == "all_reduce" else 1.0) * (n - 1) / n


def fit_alpha_rate(bytes_moved: np.ndarray, latency_s: np.ndarray, rate_key: str) -> dict:
    """t = alpha + bytes / rate; the rate is stored under `rate_key` (bus_bytes_per_s or bytes_per_s)."""

    def model(p: np.ndarray) -> np.ndarray:
        alpha_s, rate = p
        return alpha_s + bytes_moved / rate

    lower = (ALPHA_BOUNDS_S[0], RATE_BOUNDS_BYTES_PER_S[0])
    upper = (ALPHA_BOUNDS_S[1], RATE_BOUNDS_BYTES_PER_S[1])
    params, fitted = fit_log(model, (10.0 * US, 100.0 * GB), lower, upper, latency_s)
    return _record(("alpha_s", rate_key), params, latency_s, fitted)
