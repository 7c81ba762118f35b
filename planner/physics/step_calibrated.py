"""The calibrated step model: every kernel class of a forward pass at the rate measured for its
shape (`physics.kernels` over the `hardware.kernels` curves): dense GEMMs, grouped expert GEMMs,
attention, elementwise work and the engine's collectives. Each kernel's time is attributed to the
term that bounds it, fixed times go to `overhead`, and the classes add up.

Arrays have shape (n_batches, pp); token counts come in as (n, 1).
"""

import numpy as np

from planner.hardware.kernels import Spread
from planner.model.architecture import AttentionKind
from planner.modes import Engine
from planner.physics.kernels import (
    KernelTime,
    all_reduce_kernel,
    all_to_all_kernel,
    decode_attention_kernel,
    elementwise_kernel,
    ramp_kernel,
)
from planner.physics.roofline import domains_per_token, matmul_flops
from planner.physics.stages import (
    ELEMENTWISE_OPS_PER_LAYER,
    elementwise_bytes_per_token,
)
from planner.physics.step_parts import (
    StepContext,
    StepTerms,
    all_reduces_per_stage,
    decode_kv_bytes,
    expert_weight_bytes,
    moe_exchange,
    pp_send,
    roofline_all_reduces,
    roofline_exchange,
    touch_fraction,
)
from planner.precision import Precision

__all__ = ["calibrated_comm", "calibrated_decode", "combine", "elementwise", "gemm_classes"]

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


def gemm_classes(ctx: StepContext, tokens_rank: np.ndarray, tokens_stage: np.ndarray) -> tuple[list[KernelTime], np.ndarray]:
    """Dense GEMMs of a stage at `tokens_rank` rows and the grouped expert GEMMs at the tokens per
    expert of `tokens_stage`; and the expert touch fraction."""
    inp, st, rates = ctx.inp, ctx.st, ctx.rates
    arch, lay, prec = inp.arch, inp.layout, inp.precisions
    bw, fmt = inp.rack.accelerator.hbm_bandwidth_bytes_per_s, prec.compute
    dense = st.dense_params + st.head_params
    classes = [ramp_kernel(rates.gemm_curve(_gemm_format(ctx, str(fmt))), matmul_flops(dense, tokens_rank) / lay.tp,
                           dense * prec.weight_bytes / lay.tp, tokens_rank, st.gemm_kernels, _peak(ctx, fmt), bw)]
    touch = touch_fraction(arch, tokens_stage)
    if arch.is_moe:
        flops = matmul_flops(st.routed_active_params, tokens_stage) / lay.stage_size * inp.expert_imbalance
        per_expert = tokens_stage * arch.moe.experts_per_token / arch.moe.n_routed_experts
        classes.append(ramp_kernel(rates.moe_curve(_expert_format(ctx), inp.routing), flops, expert_weight_bytes(ctx, touch), per_expert,
                                   st.n_moe_layers, _peak(ctx, fmt), bw))
    return classes, touch


def elementwise(ctx: StepContext, tokens_rank: np.ndarray) -> KernelTime:
    """Norms and activations of every layer, the embedding on the first stage and the logits
    softmax and sampling on the last."""
    inp, st = ctx.inp, ctx.st
    arch, lay, act = inp.arch, inp.layout, inp.precisions.activation_bytes
    layers = elementwise_bytes_per_token(arch, st, lay.tp, act) * tokens_rank
    embedding = np.where(st.is_first, 2 * arch.hidden_size * act, 0.0) * tokens_rank
    sampling = np.where(st.is_last, SAMPLING_OPS * LOGITS_BYTES_PER_VALUE * arch.vocab_size / lay.tp, 0.0) * tokens_rank
    ops = ELEMENTWISE_OPS_PER_LAYER * st.n_layers + np.where(st.is_first, 1, 0) + np.where(st.is_last, SAMPLING_OPS, 0)
    return elementwise_kernel(layers + embedding + sampling, ops, inp.rack.accelerator.hbm_bandwidth_bytes_per_s)


def _stage_domains(ctx: StepContext) -> int:
    """Scale-up domains one pipeline stage spans."""
    return -(-ctx.inp.layout.stage_size // ctx.inp.rack.n_accelerators) if ctx.links.stage.spans_domains else 1


def _expert_exchange(ctx: StepContext, tokens_rank: np.ndarray, mode: str) -> tuple[np.ndarray, Spread]:
    """Dispatch and combine of every MoE layer of a stage with the engine's all-to-all kernels: copies for another domain
    cross the NICs ('normal' mode: once per domain hit, DeepEP forwards in the node; group-limited routing caps the domains)."""
    inp, rates = ctx.inp, ctx.rates
    arch, lay = inp.arch, inp.layout
    copies = arch.moe.experts_per_token if lay.ep > 1 else 1
    domains = _stage_domains(ctx)
    remote = copies * (domains - 1) / domains
    if mode == "normal" and domains > 1:  # one copy per remote domain hit
        groups = (arch.moe.expert_groups, arch.moe.groups_per_token) if inp.expert_groups_local else (1, 1)
        remote = domains_per_token(copies, domains, *groups) * (domains - 1) / domains
    local = copies * (lay.stage_size - 1) / lay.stage_size - copies * (domains - 1) / domains
    dispatch_bytes = arch.hidden_size * (1.0 if inp.engine in FP8_DISPATCH_ENGINES and inp.precisions.compute != "bf16"
                                         else inp.precisions.activation_bytes)
    combine_bytes = arch.hidden_size * inp.precisions.activation_bytes
    accel = inp.rack.accelerator
    nic = accel.scale_out_bandwidth_bytes_per_s * accel.scale_out_bandwidth_fraction
    curves = [rates.all_to_all_curve(mode, phase) or rates.all_to_all_curve("normal", phase) for phase in ("dispatch", "combine")]
    if None in curves:  # the engine has no all-to-all table here: the exchange over the graph's links
        return roofline_exchange(ctx, tokens_rank * lay.dp_attn), Spread()
    tokens = tokens_rank * inp.expert_imbalance * lay.expert_tp
    total = sum(all_to_all_kernel(curve, tokens * local * per_copy, tokens * remote * per_copy, nic, ctx.st.n_moe_layers)
                for curve, per_copy in zip(curves, (dispatch_bytes, combine_bytes), strict=True))
    return total, curves[-1].spread


def calibrated_comm(ctx: StepContext, tokens_rank: np.ndarray, tokens_stage: np.ndarray, mode: str) -> tuple[np.ndarray, Spread]:
    inp, rates = ctx.inp, ctx.rates
    lay = inp.layout
    hidden_bytes = inp.arch.hidden_size * inp.precisions.activation_bytes
    spread = Spread()
    ideal = roofline_all_reduces(ctx, tokens_rank)
    if lay.tp > 1 and not ctx.links.tp.spans_domains:
        curve = rates.all_reduce_curve(lay.tp)
        measured = all_reduce_kernel(curve, tokens_rank * hidden_bytes, lay.tp, all_reduces_per_stage(ctx))
        # a curve measured on another part's links (derived rates) never beats this part's own links
        comm, spread = np.maximum(measured, ideal), curve.spread
    else:
        comm = ideal
    if moe_exchange(ctx):
        exchange, spread = _expert_exchange(ctx, tokens_rank, mode)
        comm = comm + exchange
    return comm + pp_send(ctx, tokens_stage), spread


def combine(classes: list[KernelTime], comm: np.ndarray, comm_spread: Spread) -> StepTerms:
    """Attribute each class's time to its bound (GEMM memory -> weights, attention memory -> kv,
    fixed times and elementwise work -> overhead) and the range of the sum."""
    gemm, attention, elementwise = classes[:-2], classes[-2], classes[-1]
    compute = sum(c.compute_s for c in gemm) + attention.compute_s
    weights = sum(c.memory_s for c in gemm)
    kv = attention.memory_s
    overhead = sum(c.fixed_s for c in gemm) + attention.fixed_s + elementwise.total_s
    total = compute + weights + kv + overhead + comm
    ranges = [c.range_s() for c in classes]
    low = sum(r[0] for r in ranges) + comm * comm_spread.p10 / comm_spread.p50
    high = sum(r[1] for r in ranges) + comm * comm_spread.p90 / comm_spread.p50
    safe = np.where(total > 0, total, 1.0)
    return StepTerms(compute, weights, kv, comm, overhead, low / safe, high / safe)


def calibrated_decode(ctx: StepContext, micro_batch: np.ndarray, per_rank: np.ndarray, extra: np.ndarray,
                      rank_extra: np.ndarray, queries: float = 1.0) -> tuple[StepTerms, np.ndarray]:
    """A decode micro-batch step: `per_rank` sequences on each attention rank, `extra` prompt tokens
    riding on the stage, `rank_extra` of them on the slowest attention rank (all (n, 1)); each
    sequence runs `queries` tokens (1 + the draft tokens a speculative step verifies)."""
    inp, st = ctx.inp, ctx.st
    arch, lay = inp.arch, inp.layout
    tokens_rank = per_rank * queries + rank_extra
    classes, touch = gemm_classes(ctx, tokens_rank, micro_batch * queries + extra)
    mla = arch.attention.kind is AttentionKind.MLA
    curve = ctx.rates.decode_attention_curve(str(inp.precisions.kv_cache if inp.precisions.kv_cache is not Precision.FP16 else "bf16"), mla)
    heads = arch.attention.n_heads / lay.tp
    classes.append(decode_attention_kernel(curve, decode_kv_bytes(ctx, per_rank), per_rank * heads * queries, st.n_layers,
                                           inp.rack.accelerator.hbm_bandwidth_bytes_per_s))
    classes.append(elementwise(ctx, tokens_rank))
    comm, spread = calibrated_comm(ctx, tokens_rank, micro_batch * queries + extra, "low_latency")
    return combine(classes, comm * np.ones_like(classes[0].total_s), spread), touch[:, 0]
