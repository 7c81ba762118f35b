"""Roofline terms of docs/physics.md as small pure functions (numbers or numpy arrays in, seconds out).

The combination rule lives in one place, `StepTime.total_s`. Closed forms of the lecture's claims
(critical batch, HBM drain time, KV/compute crossover) are here too, next to the terms they
summarise, so that tests can check the composed roofline against them.
"""

import math
from typing import NamedTuple

import numpy as np

from planner.model.architecture import expert_touch_fraction
from planner.modes import OverlapPolicy, StepModel, StepTerm

__all__ = [
    "FLOPS_PER_PARAM_PER_TOKEN",
    "StepTime",
    "all_reduce_time_s",
    "all_to_all_time_s",
    "causal_attention_pairs",
    "chunked_attention_pairs",
    "compute_time_s",
    "critical_batch_size",
    "domains_per_token",
    "expert_touch_fraction",
    "hbm_drain_time_s",
    "kv_compute_crossover_context_tokens",
    "matmul_flops",
    "memory_time_s",
    "point_to_point_time_s",
    "step_total_s",
    "verified_attention_factor",
]

FLOPS_PER_PARAM_PER_TOKEN = 2  # one multiply and one add per weight per token (forward pass)
RING_ALL_REDUCE_PASSES = 2  # reduce-scatter then all-gather, each moving (n-1)/n of the message


class StepTime(NamedTuple):
    """Time of one step split into the roofline terms, seconds."""

    compute_s: float
    weights_s: float
    kv_s: float
    comm_s: float
    overlap: OverlapPolicy = OverlapPolicy.SERIAL
    overhead_s: float = 0.0  # calibrated model: kernel floors and elementwise work (0 under the roofline)
    model: StepModel = StepModel.ROOFLINE
    low_ratio: float = 1.0  # range of the total as ratios to it (p10, p90 of the kernel fits)
    high_ratio: float = 1.0

    @property
    def memory_s(self) -> float:
        return self.weights_s + self.kv_s

    @property
    def total_s(self) -> float:
        return float(step_total_s(self.compute_s, self.weights_s, self.kv_s, self.comm_s, self.overlap, self.overhead_s, self.model))

    @property
    def range_s(self) -> tuple[float, float]:
        return self.total_s * self.low_ratio, self.total_s * self.high_ratio

    @property
    def dominant_term(self) -> StepTerm:
        """The single largest term: compute, weights, kv, comm or (calibrated) overhead."""
        terms = {StepTerm.COMPUTE: self.compute_s, StepTerm.WEIGHTS: self.weights_s, StepTerm.KV: self.kv_s,
                 StepTerm.COMM: self.comm_s, StepTerm.OVERHEAD: self.overhead_s}
        return max(terms, key=terms.__getitem__)

    @property
    def bound(self) -> str:
        """Which side of the roofline the step is on: compute-bound or memory-bound."""
        return "compute" if self.compute_s >= self.memory_s else "memory"

    def scaled(self, factor: float) -> "StepTime":
        return self._replace(compute_s=self.compute_s * factor, weights_s=self.weights_s * factor, kv_s=self.kv_s * factor,
                             comm_s=self.comm_s * factor, overhead_s=self.overhead_s * factor)


def step_total_s(compute_s, weights_s, kv_s, comm_s, overlap: OverlapPolicy = OverlapPolicy.SERIAL, overhead_s=0.0,
                 model: StepModel = StepModel.ROOFLINE):
    """The one combination rule of step terms. Roofline (docs/physics.md): max(t_compute, t_weights +
    t_kv) + t_comm, or the max of all three when communication is overlapped. Calibrated: every
    kernel's time was already attributed to one term, so the terms add up (compute + weights + kv +
    overhead) + comm; with two micro-batches overlapping communication and compute, max(W, C) +
    min(W, C) / 2 where W is that sum. Works on floats and numpy arrays alike."""
    if model is StepModel.CALIBRATED:
        work = compute_s + weights_s + kv_s + overhead_s
        if overlap is not OverlapPolicy.OVERLAPPED:
            return work + comm_s
        # two micro-batches take turns: per layer, half of the shorter side cannot hide behind the
        # other micro-batch's work (the kernels' fixed times, paid by both halves, are not doubled here)
        return np.maximum(work, comm_s) + np.minimum(work, comm_s) / 2
    memory_s = weights_s + kv_s
    if overlap is OverlapPolicy.OVERLAPPED:
        return np.maximum(np.maximum(compute_s, memory_s), comm_s)
    return np.maximum(compute_s, memory_s) + comm_s


def matmul_flops(params: float | np.ndarray, tokens: float) -> float | np.ndarray:
    """2 * N * T: the forward-pass FLOPs of `tokens` tokens through `params` weights."""
    return FLOPS_PER_PARAM_PER_TOKEN * params * tokens


def compute_time_s(flops: float | np.ndarray, flops_per_s: float) -> float | np.ndarray:
    """t_compute = FLOPs / achievable FLOP/s."""
    return flops / flops_per_s


def memory_time_s(n_bytes: float | np.ndarray, bandwidth_bytes_per_s: float) -> float | np.ndarray:
    """t = bytes / achievable bandwidth (weight fetch, KV fetch, any HBM stream)."""
    return n_bytes / bandwidth_bytes_per_s


def all_reduce_time_s(message_bytes: float | np.ndarray, n_members: int, bandwidth_bytes_per_s: float, latency_s: float) -> float | np.ndarray:
    """Ring all-reduce of a `message_bytes` tensor over `n_members`:
    2 * (n-1)/n * message / per-member bandwidth, plus one fixed latency."""
    if n_members <= 1:
        return 0.0 * message_bytes
    volume = RING_ALL_REDUCE_PASSES * (n_members - 1) / n_members * message_bytes
    return volume / bandwidth_bytes_per_s + latency_s


def all_to_all_time_s(
    bytes_per_member: float | np.ndarray,
    n_members: int,
    injection_bytes_per_s: float,
    bisection_bytes_per_s: float,
    latency_s: float,
) -> float | np.ndarray:
    """All-to-all where each member sends `bytes_per_member` spread evenly over the others.

    Bound by the slower of each member's injection bandwidth and the bisection: the |A||B| pairs
    across a halving each carry bytes_per_member / (n-1), over `bisection_bytes_per_s`.
    """
    if n_members <= 1:
        return 0.0 * bytes_per_member
    injection_s = bytes_per_member / injection_bytes_per_s
    half = n_members // 2
    crossing_bytes = half * (n_members - half) * bytes_per_member / (n_members - 1)
    bisection_s = crossing_bytes / bisection_bytes_per_s
    return np.maximum(injection_s, bisection_s) + latency_s


def domains_per_token(experts_per_token: int, domains: int, expert_groups: int = 1, groups_per_token: int = 1) -> float:
    """Expected scale-up domains holding at least one of a token's experts, the experts spread evenly
    over `domains` and routed uniformly: d (1 - (1 - 1/d)^k). With group-limited routing (DeepSeek-V3
    picks groups_per_token of expert_groups groups, then its experts inside them) and whole groups per
    domain (expert_groups a multiple of domains), only the domains of the chosen groups can be hit:
    d (1 - C(G - G/d, m) / C(G, m)), at most m."""
    if domains <= 1:
        return 1.0
    if 1 < expert_groups and groups_per_token < expert_groups and expert_groups % domains == 0:
        missed = math.comb(expert_groups - expert_groups // domains, groups_per_token) / math.comb(expert_groups, groups_per_token)
        return domains * (1.0 - missed)
    return domains * (1.0 - (1.0 - 1.0 / domains) ** experts_per_token)


def point_to_point_time_s(message_bytes: float | np.ndarray, bandwidth_bytes_per_s: float, latency_s: float) -> float | np.ndarray:
    """One send of `message_bytes` over a path of `bandwidth_bytes_per_s` (pipeline stage hand-off)."""
    return message_bytes / bandwidth_bytes_per_s + latency_s


def causal_attention_pairs(prompt_tokens: float, window_tokens: float | np.ndarray) -> float | np.ndarray:
    """Query-key pairs of causal attention over a prompt of T tokens with a window W:
    sum_{i=1..T} min(i, W) = T(T+1)/2 if W >= T, else W(W+1)/2 + (T - W) W."""
    t = float(prompt_tokens)
    w = np.minimum(window_tokens, t)
    return w * (w + 1) / 2 + (t - w) * w


def chunked_attention_pairs(prompt_tokens: float, chunk_tokens: float | np.ndarray) -> float | np.ndarray:
    """Query-key pairs of causal attention inside fixed chunks of C tokens over a prompt of T tokens
    (Llama 4's chunked local attention): token i attends to the (i - 1) mod C + 1 tokens of its chunk so far,
    sum_{i=1..T} ((i - 1) mod C + 1) = q C (C + 1) / 2 + r (r + 1) / 2 with T = q C + r."""
    t = float(prompt_tokens)
    c = np.asarray(chunk_tokens, dtype=float)
    q = np.floor(t / c)
    r = t - q * c
    return q * c * (c + 1) / 2 + r * (r + 1) / 2


def critical_batch_size(
    flops_per_s: float, hbm_bandwidth_bytes_per_s: float, weight_bytes_per_param: float, total_params: float, active_params: float
) -> float:
    """Claim 2: the batch where compute time equals weight-fetch time,
    B* = (F / BW_hbm) * (b_w / 2) * (N_total / N_active)."""
    return (flops_per_s / hbm_bandwidth_bytes_per_s) * (weight_bytes_per_param / FLOPS_PER_PARAM_PER_TOKEN) * (total_params / active_params)


def hbm_drain_time_s(hbm_capacity_bytes: float, hbm_bandwidth_bytes_per_s: float) -> float:
    """Claim 3: the time to read all of HBM once, C_hbm / BW_hbm."""
    return hbm_capacity_bytes / hbm_bandwidth_bytes_per_s


def kv_compute_crossover_context_tokens(
    active_params: float, hbm_bandwidth_bytes_per_s: float, flops_per_s: float, kv_bytes_per_token: float
) -> float:
    """Claim 7: context length where KV-fetch time overtakes compute time, independent of batch:
    S* = 2 * N_active * BW_hbm / (F * kv)."""
    return FLOPS_PER_PARAM_PER_TOKEN * active_params * hbm_bandwidth_bytes_per_s / (flops_per_s * kv_bytes_per_token)


def verified_attention_factor(flops_per_context_token: float, kv_bytes_per_context_token: float, flops_per_s: float,
                              hbm_bytes_per_s: float, queries: float) -> float:
    """How much longer decode attention takes when each sequence scores `queries` tokens against its
    cached context instead of one (a speculative step verifying draft tokens): the roofline time
    max(KV bytes / BW, queries x FLOPs / F) at `queries` over the same at one query. The cache is read
    once whatever the queries; the math grows with them. Per context token: `flops_per_context_token`
    (one query, the heads on the rank) and `kv_bytes_per_context_token`. A kernel bound by its math at
    one query (MLA's absorbed attention, where every head reads one shared latent) takes `queries` times
    as long; a memory-bound one (GQA at a few heads per KV head) about as long."""
    memory = kv_bytes_per_context_token / hbm_bytes_per_s
    one = flops_per_context_token / flops_per_s
    return max(memory, queries * one) / max(memory, one)
