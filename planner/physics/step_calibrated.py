"""The calibrated step model: every kernel of a forward pass at the rate measured for its own shape
(`physics.kernels` over the `hardware.kernels` curves and grids): each dense GEMM at its (n, k) per
rank (`stages.gemm_shapes`), the grouped expert GEMMs at the model's expert shape, attention at its
head configuration and KV length, elementwise work, and the engine's collectives at their exact
message sizes. Each kernel's time is attributed to the term that bounds it, fixed times go to
`overhead`, and the classes add up.

Arrays have shape (n_batches, pp); token counts come in as (n, 1).
"""

from typing import NamedTuple

import numpy as np

from planner.hardware.kernels import AllToAll, Ramp, Spread
from planner.model.architecture import (
    AttentionKind,
    attention_flops_per_context_token,
    kv_bytes_per_token_per_layer,
)
from planner.modes import Engine
from planner.physics.kernels import (
    DenseGemms,
    ExpertShape,
    GemmPart,
    KernelTime,
    all_reduce_kernel,
    all_to_all_factor,
    all_to_all_kernel,
    decode_attention_kernel,
    dense_gemm_time,
    dense_gemms,
    elementwise_kernel,
    moe_kernel,
    total_kernel_time,
)
from planner.physics.memory import kv_shard_fraction
from planner.physics.roofline import (
    all_reduce_time_s,
    verified_attention_factor,
)
from planner.physics.stages import (
    ELEMENTWISE_OPS_PER_LAYER,
    attention_heads_per_rank,
    elementwise_bytes_per_token,
    gemm_groups,
    gemm_shapes,
    window_groups,
)
from planner.physics.step_parts import (
    StepContext,
    StepTerms,
    all_reduces_per_stage,
    exchange_copies,
    moe_exchange,
    pp_send,
    roofline_exchange,
    touch_fraction,
)
from planner.precision import (
    FlopsFormat,
    Precision,
    bytes_per_value,
    flops_format,
    matmul_format,
)

__all__ = ["calibrated_comm", "calibrated_decode", "combine", "decode_attention", "elementwise", "gemm_classes"]

LOGITS_BYTES_PER_VALUE = 4  # fp32 logits, written by the head and read by softmax and sampling
SAMPLING_OPS = 2  # softmax, then top-k/top-p sampling
FP8_DISPATCH_ENGINES = (Engine.SGLANG, Engine.TRTLLM)  # DeepEP-style dispatch in fp8, combine in bf16


def _gemm_format(ctx: StepContext, fmt: str) -> str:
    """The measured GEMM table a format runs as: fp8 checkpoints quantised in blocks use fp8_block."""
    if fmt == "fp8" and ctx.inp.arch.fp8_block_size:
        return "fp8_block"
    return fmt


def _expert_format(ctx: StepContext) -> str:
    prec = ctx.inp.precisions.expert_weights or ctx.inp.precisions.weights
    return {Precision.MXFP4: "mxfp4", Precision.NVFP4: "fp4", Precision.FP4: "fp4", Precision.FP8: _gemm_format(ctx, "fp8"),
            Precision.INT8: "fp8"}.get(prec, "bf16")


def _peak(ctx: StepContext, fmt) -> float:
    accel = ctx.inp.rack.accelerator
    return accel.dense_flops_per_s.get(fmt, max(accel.dense_flops_per_s.values()))


def _dense_gemms(ctx: StepContext, head_rows_apart: bool) -> DenseGemms:
    """Every dense GEMM of a stage, the weights' format then bf16 (routers, the LM head), with the LM
    head as a part of its own when it runs at its own rows."""
    inp, rates = ctx.inp, ctx.rates
    arch, lay, prec = inp.arch, inp.layout, inp.precisions
    bw, fmt = inp.rack.accelerator.hbm_bandwidth_bytes_per_s, matmul_format(prec.compute, prec.weights)
    curve, bf16 = rates.gemm_curve(_gemm_format(ctx, str(fmt))), rates.gemm_curve("bf16")
    peak, peak_bf16, b_bf16 = _peak(ctx, fmt), _peak(ctx, FlopsFormat.BF16), bytes_per_value(Precision.BF16)
    parts = []
    for bf16_shapes in (False, True):
        group = gemm_groups(arch, lay.pp, lay.tp, bf16_shapes, not head_rows_apart)
        if group is not None:
            args = (bf16, peak_bf16, b_bf16) if bf16_shapes else (curve, peak, prec.weight_bytes)
            parts.append(GemmPart(args[0], group.n, group.k, group.count, args[1], args[2], args[2], group.key))
    if head_rows_apart:  # the LM head at one row per sequence that emits a token
        head = next(g for g in gemm_shapes(arch, lay.pp, lay.tp) if g.name == "lm head")
        parts.append(GemmPart(bf16, head.n, head.k, head.count, peak_bf16, b_bf16, b_bf16))
    return dense_gemms(parts, bw, last_apart=head_rows_apart)


class _Experts(NamedTuple):
    """The grouped expert GEMMs' curve and shape, the compute peak and the streaming rate."""

    curve: Ramp
    shape: ExpertShape
    peak_flops_per_s: float
    eta_stream: float


def _experts(ctx: StepContext, mode: str) -> _Experts:
    inp, rates = ctx.inp, ctx.rates
    arch, lay = inp.arch, inp.layout
    moe, expert_fmt = arch.moe, _expert_format(ctx)
    shape = ExpertShape(arch.hidden_size, moe.expert_intermediate_size, moe.experts_per_token, moe.n_routed_experts, lay.expert_tp, lay.ep,
                        inp.expert_slot_factor)
    dispatched = lay.ep > 1 and lay.dp_attn > 1  # tokens go out to the experts' ranks over DeepEP (see calibrated_comm)
    curve = rates.moe_curve(expert_fmt, inp.routing, mode if dispatched else None)
    return _Experts(curve, shape, _peak(ctx, curve.flops_format or inp.precisions.compute), rates.gemm_curve(expert_fmt).eta_stream)


def gemm_classes(ctx: StepContext, tokens_rank: np.ndarray, tokens_stage: np.ndarray, head_rows: np.ndarray | None = None,
                 mode: str = "normal") -> list[KernelTime]:
    """Every dense GEMM of a stage at its own (n, k) and `tokens_rank` rows (the LM head at `head_rows`,
    the sequences that emit a token, when given), as one class; the grouped expert GEMMs at the model's
    expert shape and `tokens_stage` entering each MoE layer (behind DeepEP in `mode`, low_latency for
    decode or normal for prefill, when tokens are dispatched)."""
    inp, st = ctx.inp, ctx.st
    arch, lay, prec = inp.arch, inp.layout, inp.precisions
    apart = head_rows is not None
    dense = lambda: dense_gemm_time(ctx.shared(("dense gemms", apart), lambda: (lay.pp, lay.tp), lambda: _dense_gemms(ctx, apart)),
                                    tokens_rank, head_rows)
    classes = [ctx.reused(("dense gemms", apart, lay.pp, lay.tp), (tokens_rank, head_rows), dense)]
    if arch.is_moe:
        x = ctx.shared(("experts", mode), lambda: (lay, inp.expert_slot_factor, inp.routing), lambda: _experts(ctx, mode))
        classes.append(moe_kernel(x.curve, tokens_stage, x.shape, st.n_moe_layers, x.peak_flops_per_s, inp.rack.accelerator.hbm_bandwidth_bytes_per_s,
                                  prec.expert_weight_bytes, inp.expert_imbalance, x.eta_stream))
    return classes


def _attention(ctx: StepContext) -> tuple:
    """Decode attention's curve, heads per rank, KV bytes per token and layer on a rank, and (KV length,
    layers per stage) of each window at the mean context (input + output / 2)."""
    inp = ctx.inp
    arch, prec = inp.arch, inp.precisions
    curve = ctx.rates.decode_attention_curve(str(prec.kv_cache if prec.kv_cache is not Precision.FP16 else "bf16"),
                                             arch.attention.kind is AttentionKind.MLA)
    heads = attention_heads_per_rank(arch, inp.layout.tp)
    per_token = kv_bytes_per_token_per_layer(arch, prec.kv_bytes) * kv_shard_fraction(arch, inp.layout.tp)
    return curve, heads, per_token, window_groups(arch, inp.layout.pp, float(inp.input_tokens), float(inp.output_tokens))


def decode_attention(ctx: StepContext, per_rank: np.ndarray, queries: float = 1.0) -> KernelTime:
    """Decode attention of a stage's layers over the mean context (input + output / 2), each layer at
    its window, at the head configuration per rank; KV bytes as the cache holds them. With `queries`
    tokens per sequence (speculative verification) the measured one-query time grows by the roofline's
    `verified_attention_factor`: the cache is read once, the math grows with the queries."""
    lay = ctx.inp.layout
    return ctx.reused(("decode attention", lay.pp, lay.tp, ctx.inp.input_tokens, ctx.inp.output_tokens, queries), (per_rank,),
                      lambda: _decode_attention(ctx, per_rank, queries))


def _decode_attention(ctx: StepContext, per_rank: np.ndarray, queries: float) -> KernelTime:
    inp = ctx.inp
    lay = inp.layout
    curve, heads, per_token, windows = ctx.shared(("decode attention",), lambda: (lay.pp, lay.tp, inp.input_tokens, inp.output_tokens),
                                                  lambda: _attention(ctx))
    parts = [decode_attention_kernel(curve, per_rank, length, heads, per_rank * length * per_token, layers,
                                     inp.rack.accelerator.hbm_bandwidth_bytes_per_s)
             for length, layers in windows]
    one = total_kernel_time(parts)
    if queries == 1:
        return one
    factor = _verify_factor(ctx, heads.heads, per_token, queries)
    return one._replace(compute_s=one.compute_s + (factor - 1) * (one.compute_s + one.memory_s))


def _verify_factor(ctx: StepContext, heads_per_rank: float, kv_bytes_per_token: float, queries: float) -> float:
    """`verified_attention_factor` of this deployment's decode attention: the absorbed attention FLOPs
    of one query per context token on the rank's heads, against the bytes the rank's cache holds per
    token, at the tensor-core rate of the cache's format (the format the attention kernels score in)."""
    inp = ctx.inp
    arch, accel = inp.arch, inp.rack.accelerator
    flops = attention_flops_per_context_token(arch, absorbed=True) * heads_per_rank / arch.attention.n_heads
    fmt = flops_format(inp.precisions.kv_cache)
    rate = accel.achievable_flops_per_s(fmt if accel.dense_flops_per_s.get(fmt) else FlopsFormat.BF16)
    return verified_attention_factor(flops, kv_bytes_per_token, rate, ctx.hbm_bytes_per_s, queries)


def _elementwise_bytes(ctx: StepContext) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per token on each stage: bytes of the norms and activations, of the embedding and of the logits'
    softmax and sampling; and the elementwise ops of a pass."""
    inp, st = ctx.inp, ctx.st
    arch, lay, act = inp.arch, inp.layout, inp.precisions.activation_bytes
    embedding = np.where(st.is_first, 2 * arch.hidden_size * act, 0.0)
    sampling = np.where(st.is_last, SAMPLING_OPS * LOGITS_BYTES_PER_VALUE * arch.vocab_size / lay.tp, 0.0)
    ops = ELEMENTWISE_OPS_PER_LAYER * st.n_layers + np.where(st.is_first, 1, 0) + np.where(st.is_last, SAMPLING_OPS, 0)
    return elementwise_bytes_per_token(arch, st, lay.tp, act), embedding, sampling, ops


def elementwise(ctx: StepContext, tokens_rank: np.ndarray) -> KernelTime:
    """Norms and activations of every layer, the embedding on the first stage and the logits
    softmax and sampling on the last."""
    lay = ctx.inp.layout
    return ctx.reused(("elementwise", lay.pp, lay.tp), (tokens_rank,), lambda: _elementwise(ctx, tokens_rank))


def _elementwise(ctx: StepContext, tokens_rank: np.ndarray) -> KernelTime:
    lay = ctx.inp.layout
    layers, embedding, sampling, ops = ctx.shared(("elementwise",), lambda: (lay.pp, lay.tp), lambda: _elementwise_bytes(ctx))
    probed = ctx.rates.elementwise.get("bf16") if ctx.rates is not None else None
    measured = (probed.eta_bw, probed.t0_s) if probed is not None else ()
    return elementwise_kernel(layers * tokens_rank + embedding * tokens_rank + sampling * tokens_rank, ops,
                              ctx.inp.rack.accelerator.hbm_bandwidth_bytes_per_s, *measured)


class _Exchange(NamedTuple):
    """A stage's expert all-to-all: dispatch and combine curves (None: not measured for the engine),
    copies per token within and across scale-up domains, bytes per copy, NIC rate, grid key."""

    curves: tuple[AllToAll | None, AllToAll | None]
    local: float
    remote: float
    per_copy: tuple[float, float]
    nic_bytes_per_s: float
    key: tuple[float, float, float]


def _exchange(ctx: StepContext, mode: str) -> _Exchange:
    inp, rates = ctx.inp, ctx.rates
    arch = inp.arch
    local, remote = exchange_copies(ctx, once_per_domain=mode == "normal")
    dispatch_bytes = arch.hidden_size * (1.0 if inp.engine in FP8_DISPATCH_ENGINES and inp.precisions.compute != "bf16"
                                         else inp.precisions.activation_bytes)
    accel = inp.rack.accelerator
    curves = tuple(rates.all_to_all_curve(mode, phase) or rates.all_to_all_curve("normal", phase) for phase in ("dispatch", "combine"))
    return _Exchange(curves, local, remote, (dispatch_bytes, arch.hidden_size * inp.precisions.activation_bytes),
                     accel.achievable_scale_out_bytes_per_s,
                     (arch.hidden_size, arch.moe.experts_per_token, arch.moe.n_routed_experts))


def _expert_exchange(ctx: StepContext, tokens_rank: np.ndarray, mode: str) -> tuple[np.ndarray, Spread]:
    """Dispatch and combine of every MoE layer of a stage with the engine's all-to-all kernels: copies for another domain
    cross the NICs ('normal' mode: once per domain hit, DeepEP forwards in the node; group-limited routing caps the domains)."""
    inp = ctx.inp
    lay = inp.layout
    x = ctx.shared(("exchange", mode), lambda: (lay, inp.engine, inp.expert_groups_local, ctx.links.stage, inp.rack.n_accelerators),
                   lambda: _exchange(ctx, mode))
    if None in x.curves:  # the engine has no all-to-all table here: the exchange over the graph's links
        return roofline_exchange(ctx, tokens_rank * lay.dp_attn, once_per_domain=mode == "normal"), Spread()
    tokens = tokens_rank * inp.expert_imbalance * lay.expert_tp
    local, remote = tokens * x.local, tokens * x.remote
    factors = ctx.reused(("all-to-all factors", mode, x.key), (tokens_rank,), lambda: _exchange_factors(x, tokens_rank))
    total = sum(all_to_all_kernel(curve, tokens_rank, x.key, local * per_copy, remote * per_copy, x.nic_bytes_per_s, ctx.st.n_moe_layers, None,
                                  ctx.eff.latency_s, factor)
                for curve, per_copy, factor in zip(x.curves, x.per_copy, factors, strict=True))
    return total, x.curves[-1].spread


def _exchange_factors(x: _Exchange, tokens_rank: np.ndarray) -> tuple:
    """Each phase's grid factor at `tokens_rank` (they depend on the engine's curves and the model's
    expert shape alone, so layouts of other widths share them)."""
    found: dict = {}  # both phases read their grids at these tokens
    return tuple(all_to_all_factor(curve, x.key, tokens_rank, found) for curve in x.curves)


def calibrated_comm(ctx: StepContext, tokens_rank: np.ndarray, tokens_stage: np.ndarray, mode: str) -> tuple[np.ndarray, Spread]:
    """Tensor-parallel all-reduces at their exact message size with the engine's measured algorithm
    (its custom all-reduce table, NCCL's where it has none), the MoE exchange and the pipeline hand-off.
    With attention tensor-parallel over the whole stage (dp_attn = 1) every rank holds every token, and
    engines all-reduce the MoE output instead of dispatching tokens (`step_parts.moe_exchange`;
    TensorRT-LLM's Deepseekv3MoE: `if not self.use_dp and self.mapping.tp_size > 1: allreduce`);
    otherwise tokens go out and back with the engine's all-to-all kernels."""
    lay = ctx.inp.layout
    comm, spread = ctx.reused(("all-reduces", lay.pp, lay.tp, moe_exchange(ctx), ctx.links.tp.spans_domains, ctx.eff.tp_bytes_per_s,
                               ctx.eff.latency_s), (tokens_rank,), lambda: _all_reduces(ctx, tokens_rank))
    if moe_exchange(ctx):
        exchange, spread = _expert_exchange(ctx, tokens_rank, mode)
        comm = comm + exchange
    return (comm + pp_send(ctx, tokens_stage) if lay.pp > 1 else comm), spread  # one stage hands nothing on


def _all_reduces(ctx: StepContext, tokens_rank: np.ndarray) -> tuple[np.ndarray, Spread]:
    """A stage's tensor-parallel all-reduces (`calibrated_comm`) and their spread."""
    inp = ctx.inp
    lay = inp.layout
    message = tokens_rank * inp.arch.hidden_size * inp.precisions.activation_bytes
    calls = ctx.memo("all-reduces", lambda: all_reduces_per_stage(ctx))
    ideal = calls * all_reduce_time_s(message, lay.tp, ctx.eff.tp_bytes_per_s, ctx.eff.latency_s)
    curve = ctx.rates.all_reduce_curve(lay.tp) if lay.tp > 1 and not ctx.links.tp.spans_domains else None
    if curve is not None:
        # a curve measured on another part's links (derived rates) never beats this part's own links
        return np.maximum(all_reduce_kernel(curve, message, lay.tp, calls), ideal), curve.spread
    return ideal, Spread()  # across domains, or no all-reduce measured on this part: the link model


def _times(value: np.ndarray, factor: float) -> np.ndarray:
    """value x factor (value itself when the factor is 1: the same numbers)."""
    return value if factor == 1.0 else value * factor


def _over(value: np.ndarray, divisor: float) -> np.ndarray:
    """value / divisor (value itself when the divisor is 1: the same numbers)."""
    return value if divisor == 1.0 else value / divisor


def combine(classes: list[KernelTime], comm: np.ndarray, comm_spread: Spread) -> StepTerms:
    """Attribute each class's time to its bound (GEMM memory -> weights, attention memory -> kv,
    fixed times and elementwise work -> overhead) and the range of the sum (each class's time scaled
    by its spread's p10 and p90 over its median)."""
    gemm, attention = classes[:-2], classes[-2]
    totals = [c.total_s for c in classes]
    compute, weights, fixed = gemm[0].compute_s, gemm[0].memory_s, gemm[0].fixed_s
    for c in gemm[1:]:
        compute, weights, fixed = compute + c.compute_s, weights + c.memory_s, fixed + c.fixed_s
    compute = compute + attention.compute_s
    kv = attention.memory_s
    overhead = fixed + attention.fixed_s + totals[-1]
    total = compute + weights + kv + overhead + comm
    low = high = None
    for t, c in zip(totals, classes, strict=True):
        scale = _over(t, c.spread.p50)
        low = _times(scale, c.spread.p10) if low is None else low + _times(scale, c.spread.p10)
        high = _times(scale, c.spread.p90) if high is None else high + _times(scale, c.spread.p90)
    low = low + _over(_times(comm, comm_spread.p10), comm_spread.p50)
    high = high + _over(_times(comm, comm_spread.p90), comm_spread.p50)
    safe = np.where(total > 0, total, 1.0)
    return StepTerms(compute, weights, kv, comm, overhead, low / safe, high / safe)


def calibrated_decode(ctx: StepContext, micro_batch: np.ndarray, per_rank: np.ndarray, extra: np.ndarray,
                      rank_extra: np.ndarray, queries: float = 1.0) -> tuple[StepTerms, np.ndarray]:
    """A decode micro-batch step: `per_rank` sequences on each attention rank, `extra` prompt tokens
    riding on the stage, `rank_extra` of them on the slowest attention rank (all (n, 1)); each
    sequence runs `queries` tokens (1 + the draft tokens a speculative step verifies)."""
    rows = per_rank if queries == 1 else per_rank * queries  # x 1 is the same numbers
    tokens_rank = rows + rank_extra
    tokens_stage = (micro_batch if queries == 1 else micro_batch * queries) + extra
    classes = gemm_classes(ctx, tokens_rank, tokens_stage, head_rows=rows, mode="low_latency")
    classes.append(decode_attention(ctx, per_rank, queries))
    classes.append(elementwise(ctx, tokens_rank))
    comm, spread = calibrated_comm(ctx, tokens_rank, tokens_stage, "low_latency")
    shape = classes[0].compute_s.shape
    return combine(classes, comm if comm.shape == shape else comm * np.ones(shape), spread), touch_fraction(ctx.inp.arch, tokens_stage)[:, 0]
