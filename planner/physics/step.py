"""The terms of one decode micro-batch step and of one prefill pass on every pipeline stage, under
either step model (`modes.StepModel`).

roofline: FLOPs at one achievable fraction of peak, bytes at one fraction of HBM bandwidth,
  collectives over the graph's links; combined as max(compute, weights + KV) + comm.
calibrated: kernel classes at their measured rates (`physics.kernels`): dense GEMMs, grouped expert
  GEMMs, attention, elementwise work, the engine's collectives; each kernel's time is attributed to
  the term that bounds it, fixed times go to `overhead`, and the classes add up.

Arrays have shape (n_batches, pp); token counts come in as (n, 1).
"""

from dataclasses import dataclass

import numpy as np

from planner.hardware.kernels import KernelRates, Spread
from planner.model.architecture import (
    AttentionKind,
    ModelArch,
    attention_flops_per_context_token,
    kv_bytes_per_sequence,
    kv_bytes_per_token_per_layer,
    layer_windows,
)
from planner.modes import Engine, StepModel
from planner.physics.inputs import DeploymentInputs
from planner.physics.kernels import (
    KernelTime,
    all_reduce_kernel,
    all_to_all_kernel,
    decode_attention_kernel,
    elementwise_kernel,
    prefill_attention_kernel,
    ramp_kernel,
)
from planner.physics.links import EffectiveLinks, ReplicaLinks
from planner.physics.memory import (
    kv_bytes_per_accelerator,
    kv_shard_fraction,
    weight_bytes_per_accelerator,
)
from planner.physics.roofline import (
    all_reduce_time_s,
    all_to_all_time_s,
    causal_attention_pairs,
    compute_time_s,
    domains_per_token,
    expert_touch_fraction,
    matmul_flops,
    memory_time_s,
    point_to_point_time_s,
)
from planner.physics.stages import (
    ELEMENTWISE_OPS_PER_LAYER,
    Stages,
    elementwise_bytes_per_token,
)
from planner.precision import Precision

__all__ = ["ALL_REDUCES_PER_LAYER", "DISPATCH_AND_COMBINE", "PrefillPass", "StepContext", "StepTerms", "decode_terms", "prefill_pass"]

ALL_REDUCES_PER_LAYER = 2  # after attention and after the MLP (Megatron-style tensor parallelism)
DISPATCH_AND_COMBINE = 2  # an expert all-to-all goes out (dispatch) and comes back (combine)
LOGITS_BYTES_PER_VALUE = 4  # fp32 logits, written by the head and read by softmax and sampling
SAMPLING_OPS = 2  # softmax, then top-k/top-p sampling
FP8_DISPATCH_ENGINES = (Engine.SGLANG, Engine.TRTLLM)  # DeepEP-style dispatch in fp8, combine in bf16


@dataclass(frozen=True)
class StepContext:
    """What every term of one deployment needs, computed once."""

    inp: DeploymentInputs
    st: Stages
    links: ReplicaLinks
    eff: EffectiveLinks
    flops_per_s: float  # roofline: achievable FLOP/s at the compute format
    hbm_bytes_per_s: float  # roofline: achievable HBM bandwidth
    rates: KernelRates | None  # calibrated curves (None: the roofline is used)

    @property
    def calibrated(self) -> bool:
        return self.inp.step_model is StepModel.CALIBRATED and self.rates is not None


@dataclass(frozen=True)
class StepTerms:
    """Per-stage step terms (n, pp) and the range of their sum as ratios to it (p10, p90)."""

    compute: np.ndarray
    weights: np.ndarray
    kv: np.ndarray
    comm: np.ndarray
    overhead: np.ndarray
    low_ratio: np.ndarray
    high_ratio: np.ndarray

    def as_tuple(self) -> tuple[np.ndarray, ...]:
        return self.compute, self.weights, self.kv, self.comm, self.overhead


def _touch(arch: ModelArch, tokens: np.ndarray) -> np.ndarray:
    if not arch.is_moe:
        return np.zeros_like(tokens)
    return expert_touch_fraction(tokens, arch.moe.experts_per_token, arch.moe.n_routed_experts)


def _moe_exchange(ctx: StepContext) -> bool:
    lay, arch = ctx.inp.layout, ctx.inp.arch
    return arch.is_moe and (lay.ep > 1 or lay.dp_attn > 1)


def _roofline_comm(ctx: StepContext, tokens_per_rank: np.ndarray, tokens_per_stage: np.ndarray) -> np.ndarray:
    """Per-stage communication of one forward pass over the graph's links: TP all-reduces, the MoE
    token exchange, the hand-off to the next stage.

    The MoE exchange is needed whenever a MoE layer mixes tokens of several attention ranks or
    spreads experts over ranks (ep > 1 or dp_attn > 1). Each token goes to its k experts' ranks
    (docs/physics.md: B * k * d * b_a per layer), or with ep = 1 once to every rank, and reaches all
    `expert_tp` accelerators of each; (n-1)/n of the copies leave their sender. It replaces the MoE
    layer's MLP all-reduce."""
    comm = _roofline_all_reduces(ctx, tokens_per_rank)
    if _moe_exchange(ctx):
        comm = comm + _roofline_exchange(ctx, tokens_per_stage)
    return comm + _pp_send(ctx, tokens_per_stage)


def _all_reduces_per_stage(ctx: StepContext) -> np.ndarray:
    """Tensor-parallel all-reduces of a stage's forward pass (the MoE exchange replaces a MoE layer's second)."""
    st = ctx.st
    return ALL_REDUCES_PER_LAYER * st.n_layers - (st.n_moe_layers if _moe_exchange(ctx) else 0)


def _roofline_all_reduces(ctx: StepContext, tokens_per_rank: np.ndarray) -> np.ndarray:
    inp, eff = ctx.inp, ctx.eff
    message = tokens_per_rank * inp.arch.hidden_size * inp.precisions.activation_bytes
    return _all_reduces_per_stage(ctx) * all_reduce_time_s(message, inp.layout.tp, eff.tp_bytes_per_s, eff.latency_s)


def _roofline_exchange(ctx: StepContext, tokens_per_stage: np.ndarray) -> np.ndarray:
    """Dispatch and combine of every MoE layer over the graph's links (bisection and injection bound)."""
    inp, eff, lay, arch = ctx.inp, ctx.eff, ctx.inp.layout, ctx.inp.arch
    copies = arch.moe.experts_per_token if lay.ep > 1 else 1
    remote = (lay.stage_size - 1) / lay.stage_size
    hidden_bytes = arch.hidden_size * inp.precisions.activation_bytes
    per_member = tokens_per_stage / lay.stage_size * copies * lay.expert_tp * hidden_bytes * remote * inp.expert_imbalance
    one_way = all_to_all_time_s(per_member, lay.stage_size, eff.stage_injection_bytes_per_s, eff.stage_bisection_bytes_per_s, eff.latency_s)
    return ctx.st.n_moe_layers * DISPATCH_AND_COMBINE * one_way


def _pp_send(ctx: StepContext, tokens_per_stage: np.ndarray) -> np.ndarray:
    lay = ctx.inp.layout
    if lay.pp == 1:
        return 0.0 * tokens_per_stage * np.ones((1, 1))
    hidden_bytes = ctx.inp.arch.hidden_size * ctx.inp.precisions.activation_bytes
    send = point_to_point_time_s(tokens_per_stage * hidden_bytes, ctx.eff.pp_bytes_per_s, ctx.eff.latency_s)
    return np.where(np.arange(lay.pp) == lay.pp - 1, 0.0, send)


def _decode_kv_bytes(ctx: StepContext, per_rank: np.ndarray) -> np.ndarray:
    inp = ctx.inp
    mean_context = inp.input_tokens + inp.output_tokens / 2
    per_sequence = ctx.st.per_stage(kv_bytes_per_sequence(inp.arch, mean_context, inp.precisions.kv_bytes))
    return kv_bytes_per_accelerator(per_rank, per_sequence, kv_shard_fraction(inp.arch, inp.layout.tp))


def _expert_weight_bytes(ctx: StepContext, touch: np.ndarray) -> np.ndarray:
    inp, st, lay = ctx.inp, ctx.st, ctx.inp.layout
    return weight_bytes_per_accelerator(0.0 * st.dense_params, st.routed_total_params * touch * inp.expert_slot_factor,
                                        lay.tp, lay.stage_size, inp.precisions.weight_bytes, inp.precisions.expert_weight_bytes)


def _roofline_decode(ctx: StepContext, micro_batch: np.ndarray, per_rank: np.ndarray, extra: np.ndarray) -> tuple[StepTerms, np.ndarray]:
    inp, st = ctx.inp, ctx.st
    arch, lay, prec = inp.arch, inp.layout, inp.precisions
    mean_context = inp.input_tokens + inp.output_tokens / 2
    attention = st.per_stage(attention_flops_per_context_token(arch, absorbed=True) * np.minimum(mean_context, layer_windows(arch)))
    flops = (matmul_flops(st.dense_params + st.head_params, per_rank) + attention * per_rank) / lay.tp
    flops = flops + matmul_flops(st.routed_active_params, micro_batch) / lay.stage_size * inp.expert_imbalance
    touch = _touch(arch, micro_batch + extra)
    weights = weight_bytes_per_accelerator(st.dense_params + st.head_params, st.routed_total_params * touch * inp.expert_slot_factor,
                                           lay.tp, lay.stage_size, prec.weight_bytes, prec.expert_weight_bytes)
    comm = _roofline_comm(ctx, per_rank + extra / lay.dp_attn, micro_batch + extra)
    compute, weights, kv = (compute_time_s(flops, ctx.flops_per_s), memory_time_s(weights, ctx.hbm_bytes_per_s),
                            memory_time_s(_decode_kv_bytes(ctx, per_rank), ctx.hbm_bytes_per_s))
    one = np.ones_like(compute)
    return StepTerms(compute, weights * one, kv, comm * one, 0.0 * one, one, one), touch[:, 0]


def decode_terms(ctx: StepContext, batches: np.ndarray, riders: np.ndarray | None = None) -> tuple[StepTerms, np.ndarray]:
    """Terms of one decode micro-batch step, (n_batches, pp), and the expert touch fraction (n,).
    `riders` (n,): prefill tokens travelling in the same step on each stage. Under the roofline they
    widen the experts touched and the collectives (their FLOPs and KV reads are added by the caller);
    under the calibrated model their GEMM rows ride in the same kernels (only their attention is
    added by the caller)."""
    lay = ctx.inp.layout
    micro_batch = (batches / lay.pp)[:, None]
    per_rank = micro_batch / lay.dp_attn
    extra = np.zeros_like(micro_batch) if riders is None else riders[:, None]
    if ctx.calibrated:
        return _calibrated_decode(ctx, micro_batch, per_rank, extra)
    return _roofline_decode(ctx, micro_batch, per_rank, extra)


# ---------------------------------------------------------------------------------------------
# calibrated model


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


def _gemm_classes(ctx: StepContext, tokens_rank: np.ndarray, tokens_stage: np.ndarray) -> tuple[list[KernelTime], np.ndarray]:
    """Dense GEMMs of a stage at `tokens_rank` rows and the grouped expert GEMMs at the tokens per
    expert of `tokens_stage`; and the expert touch fraction."""
    inp, st, rates = ctx.inp, ctx.st, ctx.rates
    arch, lay, prec = inp.arch, inp.layout, inp.precisions
    bw, fmt = inp.rack.accelerator.hbm_bandwidth_bytes_per_s, prec.compute
    dense = st.dense_params + st.head_params
    classes = [ramp_kernel(rates.gemm_curve(_gemm_format(ctx, str(fmt))), matmul_flops(dense, tokens_rank) / lay.tp,
                           dense * prec.weight_bytes / lay.tp, tokens_rank, st.gemm_kernels, _peak(ctx, fmt), bw)]
    touch = _touch(arch, tokens_stage)
    if arch.is_moe:
        flops = matmul_flops(st.routed_active_params, tokens_stage) / lay.stage_size * inp.expert_imbalance
        per_expert = tokens_stage * arch.moe.experts_per_token / arch.moe.n_routed_experts
        classes.append(ramp_kernel(rates.moe_curve(_expert_format(ctx), inp.routing), flops, _expert_weight_bytes(ctx, touch), per_expert,
                                   st.n_moe_layers, _peak(ctx, fmt), bw))
    return classes, touch


def _elementwise(ctx: StepContext, tokens_rank: np.ndarray) -> KernelTime:
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
        return _roofline_exchange(ctx, tokens_rank * lay.dp_attn), Spread()
    tokens = tokens_rank * inp.expert_imbalance * lay.expert_tp
    total = sum(all_to_all_kernel(curve, tokens * local * per_copy, tokens * remote * per_copy, nic, ctx.st.n_moe_layers)
                for curve, per_copy in zip(curves, (dispatch_bytes, combine_bytes), strict=True))
    return total, curves[-1].spread


def _calibrated_comm(ctx: StepContext, tokens_rank: np.ndarray, tokens_stage: np.ndarray, mode: str) -> tuple[np.ndarray, Spread]:
    inp, rates = ctx.inp, ctx.rates
    lay = inp.layout
    hidden_bytes = inp.arch.hidden_size * inp.precisions.activation_bytes
    spread = Spread()
    ideal = _roofline_all_reduces(ctx, tokens_rank)
    if lay.tp > 1 and not ctx.links.tp.spans_domains:
        curve = rates.all_reduce_curve(lay.tp)
        measured = all_reduce_kernel(curve, tokens_rank * hidden_bytes, lay.tp, _all_reduces_per_stage(ctx))
        # a curve measured on another part's links (derived rates) never beats this part's own links
        comm, spread = np.maximum(measured, ideal), curve.spread
    else:
        comm = ideal
    if _moe_exchange(ctx):
        exchange, spread = _expert_exchange(ctx, tokens_rank, mode)
        comm = comm + exchange
    return comm + _pp_send(ctx, tokens_stage), spread


def _combine(classes: list[KernelTime], comm: np.ndarray, comm_spread: Spread) -> StepTerms:
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


def _calibrated_decode(ctx: StepContext, micro_batch: np.ndarray, per_rank: np.ndarray, extra: np.ndarray) -> tuple[StepTerms, np.ndarray]:
    inp, st = ctx.inp, ctx.st
    arch, lay = inp.arch, inp.layout
    tokens_rank = per_rank + extra / lay.dp_attn
    classes, touch = _gemm_classes(ctx, tokens_rank, micro_batch + extra)
    mla = arch.attention.kind is AttentionKind.MLA
    curve = ctx.rates.decode_attention_curve(str(inp.precisions.kv_cache if inp.precisions.kv_cache is not Precision.FP16 else "bf16"), mla)
    heads = arch.attention.n_heads / lay.tp
    classes.append(decode_attention_kernel(curve, _decode_kv_bytes(ctx, per_rank), per_rank * heads, st.n_layers,
                                           inp.rack.accelerator.hbm_bandwidth_bytes_per_s))
    classes.append(_elementwise(ctx, tokens_rank))
    comm, spread = _calibrated_comm(ctx, tokens_rank, micro_batch + extra, "low_latency")
    return _combine(classes, comm * np.ones_like(classes[0].total_s), spread), touch[:, 0]


# ---------------------------------------------------------------------------------------------
# prefill


@dataclass(frozen=True)
class PrefillPass:
    """One prefill forward pass per attention rank on every stage (arrays of shape (pp,))."""

    terms: StepTerms
    attention_s: np.ndarray  # the attention part (what a prefill token adds to a mixed decode step)
    tokens: int  # prompt tokens per attention rank in the pass
    prompts: float  # whole prompts packed in the pass (1 / chunks when a prompt needs several)
    passes_per_prompt: int


def _pass_shape(inp: DeploymentInputs) -> tuple[int, float, int]:
    """Tokens per pass, prompts per pass and passes per prompt: prompts shorter than the budget are
    packed whole into one pass, longer ones are cut into chunks of the budget."""
    prompt, budget = inp.input_tokens, inp.prefill_chunk_tokens
    if prompt <= budget:
        packed = budget // prompt
        return packed * prompt, float(packed), 1
    n_chunks = -(-prompt // budget)
    return budget, 1.0 / n_chunks, n_chunks


def prefill_pass(ctx: StepContext) -> PrefillPass:
    inp, st = ctx.inp, ctx.st
    arch, lay, prec = inp.arch, inp.layout, inp.precisions
    tokens, prompts, n_chunks = _pass_shape(inp)
    windows = layer_windows(arch)
    pairs = st.per_stage(attention_flops_per_context_token(arch, absorbed=False) * causal_attention_pairs(inp.input_tokens, windows))
    attention_flops = (prompts * pairs / lay.tp)[None, :]
    tokens_rank, tokens_stage = np.array([[float(tokens)]]), np.array([[float(tokens * lay.dp_attn)]])
    if ctx.calibrated:
        classes, _ = _gemm_classes(ctx, tokens_rank, tokens_stage)
        curve = ctx.rates.prefill_attention_curve(str(prec.kv_cache), arch.attention.kind is AttentionKind.MLA)
        accel = inp.rack.accelerator
        bf16 = accel.dense_flops_per_s.get("bf16", max(accel.dense_flops_per_s.values()))
        attention = prefill_attention_kernel(curve, attention_flops, inp.input_tokens, st.n_layers, bf16)
        classes += [attention, _elementwise(ctx, tokens_rank)]
        comm, spread = _calibrated_comm(ctx, tokens_rank, tokens_stage, "normal")
        terms = _combine(classes, comm * np.ones((1, lay.pp)), spread)
        return PrefillPass(_row(terms), attention.total_s[0], tokens, prompts, n_chunks)
    flops = (matmul_flops(st.dense_params, tokens) + matmul_flops(st.head_params, max(prompts, 1.0)))[None, :] / lay.tp + attention_flops
    flops = flops + matmul_flops(st.routed_active_params, tokens_stage) / lay.stage_size * inp.expert_imbalance
    touch = _touch(arch, tokens_stage)
    weights = weight_bytes_per_accelerator(st.dense_params + st.head_params, st.routed_total_params * touch * inp.expert_slot_factor,
                                           lay.tp, lay.stage_size, prec.weight_bytes, prec.expert_weight_bytes)
    prior = (inp.input_tokens - tokens) / 2 if n_chunks > 1 else 0.0  # a chunk reads the cache of the chunks before it
    kv_tokens = tokens + np.minimum(prior, windows)
    kv = st.per_stage(kv_bytes_per_token_per_layer(arch, prec.kv_bytes) * kv_tokens) * kv_shard_fraction(arch, lay.tp)
    comm = _roofline_comm(ctx, tokens_rank, tokens_stage)
    one = np.ones((1, lay.pp))
    terms = StepTerms(compute_time_s(flops, ctx.flops_per_s) * one, memory_time_s(weights, ctx.hbm_bytes_per_s) * one,
                      memory_time_s(kv, ctx.hbm_bytes_per_s) * one, comm * one, 0.0 * one, one, one)
    return PrefillPass(_row(terms), compute_time_s(attention_flops, ctx.flops_per_s)[0], tokens, prompts, n_chunks)


def _row(terms: StepTerms) -> StepTerms:
    return StepTerms(*(np.asarray(a, dtype=float)[0] for a in (terms.compute, terms.weights, terms.kv, terms.comm, terms.overhead,
                                                                terms.low_ratio, terms.high_ratio)))
