"""`planner calibrate` fits the parametric forms of `kernel_forms.py` to measured kernel tables (numpy
and scipy only).

Every fit takes one kernel class's measured rows as arrays (SI units: seconds, bytes, FLOP/s) and
returns a small record and the fitted time of every row. The record holds the parameters with the
unit in their names and `fit_spread` (the 10th, 50th and 90th percentile of measured over fitted
time). A form's fixed time t0 is not fitted: it is the measured latency of the class's smallest
shapes (`least_work_floor`), where a kernel is a launch and synchronisation floor. The remaining
parameters are least squares on log(latency), each fitted as its logarithm inside positive bounds, so
that a 10 us kernel counts as much as a 10 ms one.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from planner.hardware.kernel_forms import (
    decode_attention_s,
    gemm_work,
    gqa_decode_kv_bytes,
    gqa_prefill_flops,
    mla_decode_kv_bytes,
    mla_prefill_flops,
    moe_work,
    prefill_attention_s,
    ramp_parts,
)
from planner.units import GB, US

__all__ = [
    "SIGNIFICANT_DIGITS",
    "Fit",
    "fit_alpha_rate",
    "fit_attention_decode",
    "fit_attention_prefill",
    "fit_gemm",
    "fit_log",
    "fit_mla_decode",
    "fit_mla_prefill",
    "fit_moe",
    "least_work_floor",
    "round_sig",
    "spread",
]

SIGNIFICANT_DIGITS = 4
FLOOR_QUANTILE = 0.01  # the floor is the median latency of the least-work 1% of a table's shapes...
FLOOR_MIN_ROWS = 3  # ...and of at least this many shapes

# Expert GEMMs keep gaining efficiency up to about a thousand tokens per expert (aiconfigurator's
# tables: 0.26-0.29 of fp8 peak measured at >= 1024 tokens per expert on Hopper). A free fit of the
# ramp settles on a half-point of a few tokens and caps the efficiency at 0.1-0.2, wrong by 2x for
# prefill-sized batches; the half-point is held at the dense GEMM's scale instead.
MOE_M_HALF_MIN = 64.0

# Parameter bounds shared by the forms (lower, upper).
ETA_BOUNDS = (1e-3, 2.0)
HALF_BOUNDS = (1e-2, 1e7)  # m_half (rows) and s_half (tokens)
PER_HEAD_BOUNDS_S = (1e-7 * US, 10.0 * US)
RATE_BOUNDS_BYTES_PER_S = (0.1 * GB, 1e5 * GB)

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


@dataclass(frozen=True)
class Fit:
    """A fitted form: its record (parameters with units in their names, `fit_spread`) and the fitted
    time of every row it was fitted on."""

    record: dict
    fitted_s: np.ndarray


def least_work_floor(latency_s: np.ndarray, work: np.ndarray) -> float:
    """The fixed time of a kernel class: the median latency of its least-work shapes (the lowest
    FLOOR_QUANTILE of `work`, at least FLOOR_MIN_ROWS shapes), where a kernel is all launch and
    synchronisation. Measured, not fitted."""
    order = np.argsort(np.asarray(work, dtype=float), kind="stable")
    n = max(FLOOR_MIN_ROWS, int(np.ceil(FLOOR_QUANTILE * len(order))))
    return float(np.median(np.asarray(latency_s, dtype=float)[order[:n]]))


def _fit(names: Sequence[str], t0_s: float, model: Model, start, lower, upper, latency_s: np.ndarray) -> Fit:
    t0_s = round_sig(t0_s)
    params, _ = fit_log(lambda p: t0_s + model(p), start, lower, upper, latency_s)
    params = np.array([round_sig(p) for p in params])  # the record's rounded values are what the step model evaluates
    fitted = t0_s + model(params)
    record: dict = {"t0_s": t0_s} | {name: float(p) for name, p in zip(names, params, strict=True)}
    record["fit_spread"] = spread(latency_s, fitted)
    return Fit(record, fitted)


RAMP_NAMES = ("eta_max", "m_half", "eta_m")
RAMP_START = (0.7, 64.0, 0.7)
RAMP_LOWER = (ETA_BOUNDS[0], 1e-3, ETA_BOUNDS[0])
RAMP_UPPER = (ETA_BOUNDS[1], HALF_BOUNDS[1], ETA_BOUNDS[1])


def _ramp_model(flops, n_bytes, rows, peak_flops_per_s: float, hbm_bytes_per_s: float) -> Model:
    """max(FLOPs / (F eta_max m/(m + m_half)), bytes / (BW eta_m)); p = (eta_max, m_half, eta_m)."""
    return lambda p: np.maximum(*ramp_parts(flops, n_bytes, rows, p[0], p[1], p[2], peak_flops_per_s, hbm_bytes_per_s))


def _ramp_floor(flops, n_bytes, latency_s, peak_flops_per_s: float, hbm_bytes_per_s: float) -> float:
    return least_work_floor(latency_s, np.maximum(flops / peak_flops_per_s, n_bytes / hbm_bytes_per_s))


def fit_gemm(m, n, k, latency_s: np.ndarray, peak_flops_per_s: float, hbm_bytes_per_s: float, weight_bytes: float,
             activation_bytes: float) -> Fit:
    """Dense GEMM: t = t0 + max(2mnk / (F eta_max m/(m + m_half)), (n k b_w + m k b_a + 2 m n) / (BW eta_m))."""
    flops, n_bytes, _ = gemm_work(m, n, k, weight_bytes, activation_bytes)
    t0_s = _ramp_floor(flops, n_bytes, latency_s, peak_flops_per_s, hbm_bytes_per_s)
    model = _ramp_model(flops, n_bytes, m, peak_flops_per_s, hbm_bytes_per_s)
    return _fit(RAMP_NAMES, t0_s, model, RAMP_START, RAMP_LOWER, RAMP_UPPER, latency_s)


def fit_moe(tokens, hidden, inter, topk, experts, tp, ep, latency_s: np.ndarray, peak_flops_per_s: float,
            hbm_bytes_per_s: float, weight_bytes: float) -> Fit:
    """Grouped expert GEMM of one gated MoE layer on one GPU: the ramp on `moe_work`'s FLOPs, touched
    expert bytes and rows per expert."""
    flops, n_bytes, rows = moe_work(tokens, hidden, inter, topk, experts, tp, ep, weight_bytes)
    t0_s = _ramp_floor(flops, n_bytes, latency_s, peak_flops_per_s, hbm_bytes_per_s)
    model = _ramp_model(flops, n_bytes, rows, peak_flops_per_s, hbm_bytes_per_s)
    lower = (RAMP_LOWER[0], MOE_M_HALF_MIN, RAMP_LOWER[2])
    return _fit(RAMP_NAMES, t0_s, model, (0.3, 128.0, 0.5), lower, RAMP_UPPER, latency_s)


def _decode(kv_bytes_read, batch_heads, latency_s: np.ndarray, hbm_bytes_per_s: float) -> Fit:
    t0_s = least_work_floor(latency_s, kv_bytes_read)
    model = lambda p: decode_attention_s(kv_bytes_read, batch_heads, p[0], p[1], hbm_bytes_per_s)
    lower, upper = (ETA_BOUNDS[0], PER_HEAD_BOUNDS_S[0]), (ETA_BOUNDS[1], PER_HEAD_BOUNDS_S[1])
    return _fit(("eta_kv", "c_s"), t0_s, model, (0.7, 0.005 * US), lower, upper, latency_s)


def fit_attention_decode(batch, kv_len, heads, kv_heads, head_dim, latency_s: np.ndarray, hbm_bytes_per_s: float,
                         kv_bytes: float) -> Fit:
    """Decode attention of one layer (per-GPU heads): t = t0 + KV bytes / (BW eta_kv) + c x batch x heads."""
    return _decode(gqa_decode_kv_bytes(batch, kv_len, kv_heads, head_dim, kv_bytes), batch * heads, latency_s, hbm_bytes_per_s)


def fit_mla_decode(batch, kv_len, heads, latency_s: np.ndarray, hbm_bytes_per_s: float, kv_bytes: float) -> Fit:
    """MLA decode of one layer: t = t0 + batch x len x 576 x b_kv / (BW eta_kv) + c x batch x heads."""
    return _decode(mla_decode_kv_bytes(batch, kv_len, kv_bytes), batch * heads, latency_s, hbm_bytes_per_s)


def _prefill(flops, seq, latency_s: np.ndarray, peak_flops_per_s: float) -> Fit:
    """t = t0 + FLOPs / (F eta_max s/(s + s_half))."""
    t0_s = least_work_floor(latency_s, flops)
    model = lambda p: prefill_attention_s(flops, seq, p[0], p[1], peak_flops_per_s)
    lower, upper = (ETA_BOUNDS[0], HALF_BOUNDS[0]), (ETA_BOUNDS[1], HALF_BOUNDS[1])
    return _fit(("eta_max", "s_half"), t0_s, model, (0.5, 512.0), lower, upper, latency_s)


def fit_attention_prefill(batch, seq, heads, head_dim, latency_s: np.ndarray, peak_flops_per_s: float) -> Fit:
    """Causal prefill attention of one layer: FLOPs 2 b n h s^2."""
    return _prefill(gqa_prefill_flops(batch, seq, heads, head_dim), seq, latency_s, peak_flops_per_s)


def fit_mla_prefill(batch, seq, heads, latency_s: np.ndarray, peak_flops_per_s: float) -> Fit:
    """Causal MLA prefill of one layer (per-GPU heads): FLOPs b n s^2 (192 + 128)."""
    return _prefill(mla_prefill_flops(batch, seq, heads), seq, latency_s, peak_flops_per_s)


def fit_alpha_rate(bytes_moved: np.ndarray, latency_s: np.ndarray, rate_key: str) -> Fit:
    """t = alpha + bytes / rate; alpha the smallest messages' latency, the rate stored under `rate_key`."""
    alpha_s = least_work_floor(latency_s, bytes_moved)
    fit = _fit((rate_key,), alpha_s, lambda p: bytes_moved / p[0], (100.0 * GB,), (RATE_BOUNDS_BYTES_PER_S[0],),
               (RATE_BOUNDS_BYTES_PER_S[1],), latency_s)
    record = {"alpha_s": fit.record.pop("t0_s")} | fit.record
    return Fit(record, fit.fitted_s)
