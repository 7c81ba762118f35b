"""One prefill forward pass per attention rank on every pipeline stage, under either step model."""

from dataclasses import dataclass

import numpy as np

from planner.model.architecture import (
    AttentionKind,
    attention_flops_per_context_token,
    kv_bytes_per_token_per_layer,
    layer_windows,
)
from planner.physics.inputs import DeploymentInputs
from planner.physics.kernels import prefill_attention_kernel
from planner.physics.memory import kv_shard_fraction, weight_bytes_per_accelerator
from planner.physics.roofline import (
    causal_attention_pairs,
    compute_time_s,
    matmul_flops,
    memory_time_s,
)
from planner.physics.step_calibrated import (
    calibrated_comm,
    combine,
    elementwise,
    gemm_classes,
)
from planner.physics.step_parts import (
    StepContext,
    StepTerms,
    roofline_comm,
    touch_fraction,
)

__all__ = ["PrefillPass", "prefill_pass"]

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
        classes, _ = gemm_classes(ctx, tokens_rank, tokens_stage)
        curve = ctx.rates.prefill_attention_curve(str(prec.kv_cache), arch.attention.kind is AttentionKind.MLA)
        accel = inp.rack.accelerator
        bf16 = accel.dense_flops_per_s.get("bf16", max(accel.dense_flops_per_s.values()))
        attention = prefill_attention_kernel(curve, attention_flops, inp.input_tokens, st.n_layers, bf16)
        classes += [attention, elementwise(ctx, tokens_rank)]
        comm, spread = calibrated_comm(ctx, tokens_rank, tokens_stage, "normal")
        terms = combine(classes, comm * np.ones((1, lay.pp)), spread)
        return PrefillPass(_row(terms), attention.total_s[0], tokens, prompts, n_chunks)
    flops = (matmul_flops(st.dense_params, tokens) + matmul_flops(st.head_params, max(prompts, 1.0)))[None, :] / lay.tp + attention_flops
    flops = flops + matmul_flops(st.routed_active_params, tokens_stage) / lay.stage_size * inp.expert_imbalance
    touch = touch_fraction(arch, tokens_stage)
    weights = weight_bytes_per_accelerator(st.dense_params + st.head_params, st.routed_total_params * touch * inp.expert_slot_factor,
                                           lay.tp, lay.stage_size, prec.weight_bytes, prec.expert_weight_bytes)
    prior = (inp.input_tokens - tokens) / 2 if n_chunks > 1 else 0.0  # a chunk reads the cache of the chunks before it
    kv_tokens = tokens + np.minimum(prior, windows)
    kv = st.per_stage(kv_bytes_per_token_per_layer(arch, prec.kv_bytes) * kv_tokens) * kv_shard_fraction(arch, lay.tp)
    comm = roofline_comm(ctx, tokens_rank, tokens_stage)
    one = np.ones((1, lay.pp))
    terms = StepTerms(compute_time_s(flops, ctx.flops_per_s) * one, memory_time_s(weights, ctx.hbm_bytes_per_s) * one,
                      memory_time_s(kv, ctx.hbm_bytes_per_s) * one, comm * one, 0.0 * one, one, one)
    return PrefillPass(_row(terms), compute_time_s(attention_flops, ctx.flops_per_s)[0], tokens, prompts, n_chunks)


def _row(terms: StepTerms) -> StepTerms:
    return StepTerms(*(np.asarray(a, dtype=float)[0] for a in (terms.compute, terms.weights, terms.kv, terms.comm, terms.overhead,
                                                                terms.low_ratio, terms.high_ratio)))
