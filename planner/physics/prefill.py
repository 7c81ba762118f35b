"""One prefill forward pass per attention rank on every pipeline stage, under either step model."""

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from planner.hardware.kernels import PrefillAttention
from planner.model.architecture import (
    AttentionKind,
    attention_flops_per_context_token,
    chunked_layers,
    kv_bytes_per_token_per_layer,
    layer_windows,
)
from planner.physics.kernels import KernelTime, prefill_attention_kernel
from planner.physics.memory import kv_shard_fraction, weight_bytes_per_accelerator
from planner.physics.roofline import (
    causal_attention_pairs,
    chunked_attention_pairs,
    compute_time_s,
    matmul_flops,
    memory_time_s,
)
from planner.physics.stages import Stages
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

__all__ = ["PrefillPass", "packed_prompts", "pass_shape", "prefill_pass"]

@dataclass(frozen=True)
class PrefillPass:
    """Prefill forward passes per attention rank on every stage, one row per pass size (arrays of
    shape (n, pp), or (n,) for the per-pass counts). Their step terms are evaluated on first use: a
    decode-side table needs only the passes' shape and attention."""

    attention_s: np.ndarray  # the attention part (what a prefill token adds to a mixed decode step)
    tokens: np.ndarray  # prompt tokens per attention rank in the pass
    prompts: np.ndarray  # whole prompts in the pass (1 / chunks when a prompt needs several)
    passes_per_prompt: int
    step_terms: Callable[[], StepTerms] = field(repr=False, compare=False)  # evaluates `terms`

    @functools.cached_property
    def terms(self) -> StepTerms:
        """The passes' step terms (n, pp) on every stage."""
        return self.step_terms()


def packed_prompts(prompt_tokens: int, budget_tokens: int) -> int:
    """Whole prompts of `prompt_tokens` one pass of the engine's token budget holds (0: the prompt is
    longer than the budget and is cut into chunks)."""
    return budget_tokens // prompt_tokens


def pass_shape(prompt_tokens: int, budget_tokens: int, prompts_per_rank) -> tuple[np.ndarray, np.ndarray, int]:
    """Tokens per pass, prompts per pass and passes per prompt, for passes that hold
    `prompts_per_rank` waiting prompts on each attention rank (n,): prompts no longer than the budget
    are packed whole, at most as many as the budget holds (the rest wait for the next pass); a
    longer prompt is cut into chunks of the budget, one prompt per pass."""
    waiting = np.maximum(np.asarray(prompts_per_rank, dtype=float), 1.0)
    packed = packed_prompts(prompt_tokens, budget_tokens)
    if packed >= 1:
        prompts = np.minimum(np.floor(waiting), packed)
        return prompts * prompt_tokens, prompts, 1
    n_chunks = -(-prompt_tokens // budget_tokens)
    return np.full_like(waiting, float(budget_tokens)), np.full_like(waiting, 1.0 / n_chunks), n_chunks


def _attention_pairs(ctx: StepContext) -> np.ndarray:
    """Causal attention FLOPs of one prompt on each stage (pp,)."""
    inp = ctx.inp
    windows = layer_windows(inp.arch)
    chunked = chunked_layers(inp.arch)
    pairs = np.where(chunked, chunked_attention_pairs(inp.input_tokens, np.where(chunked, windows, 1.0)),
                     causal_attention_pairs(inp.input_tokens, windows))
    return ctx.st.per_stage(attention_flops_per_context_token(inp.arch, absorbed=False) * pairs)


def _prefill_attention(ctx: StepContext) -> tuple[PrefillAttention, float]:
    """Prefill attention's curve (bound to the heads per rank) and the bf16 peak it runs at."""
    inp = ctx.inp
    curve = ctx.rates.prefill_attention_curve(str(inp.precisions.kv_cache), inp.arch.attention.kind is AttentionKind.MLA)
    accel = inp.rack.accelerator
    return curve, accel.dense_flops_per_s.get("bf16", max(accel.dense_flops_per_s.values()))


def _prefill_attention_time(ctx: StepContext, attention_flops: np.ndarray) -> KernelTime:
    """Prefill attention of a stage's layers doing `attention_flops` (n, pp) on a rank."""
    curve, bf16 = ctx.shared(("prefill attention",), lambda: (ctx.inp.layout.tp,), lambda: _prefill_attention(ctx))
    return prefill_attention_kernel(curve, attention_flops, ctx.inp.input_tokens, ctx.st.n_layers, bf16)


def _full(a, one: np.ndarray) -> np.ndarray:
    """`a` x ones of `one`'s shape (`a` itself when it has that shape: the same numbers)."""
    return a if np.shape(a) == one.shape else np.asarray(a, dtype=float) * one


def prefill_pass(ctx: StepContext, prompts_per_rank) -> PrefillPass:
    """Passes holding `prompts_per_rank` waiting prompts on each attention rank (n,)."""
    inp, st = ctx.inp, ctx.st
    arch, lay, prec = inp.arch, inp.layout, inp.precisions
    tokens, prompts, n_chunks = pass_shape(inp.input_tokens, inp.prefill_chunk_tokens, prompts_per_rank)
    pairs = ctx.shared(("attention pairs",), lambda: (lay.pp, inp.input_tokens), lambda: _attention_pairs(ctx))
    attention_flops = prompts[:, None] * pairs[None, :] / lay.tp
    tokens_rank, tokens_stage = tokens[:, None], tokens[:, None] * lay.dp_attn
    one = np.ones((len(tokens), lay.pp))
    if ctx.calibrated:
        attention = ctx.reused(("prefill attention", lay.pp, lay.tp, inp.input_tokens), (attention_flops,),
                               lambda: _prefill_attention_time(ctx, attention_flops))

        def terms() -> StepTerms:
            classes = [*gemm_classes(ctx, tokens_rank, tokens_stage), attention, elementwise(ctx, tokens_rank)]
            comm, spread = calibrated_comm(ctx, tokens_rank, tokens_stage, "normal")
            return _broadcast(combine(classes, _full(comm, one), spread), one)

        return PrefillPass(_full(attention.total_s, one), tokens, prompts, n_chunks, terms)
    windows = layer_windows(arch)
    flops = (matmul_flops(st.dense_params, tokens_rank) + matmul_flops(st.head_params, np.maximum(prompts, 1.0)[:, None])) / lay.tp
    flops = flops + attention_flops + matmul_flops(st.routed_active_params, tokens_stage) / lay.stage_size * inp.expert_imbalance
    touch = touch_fraction(arch, tokens_stage)
    weights = weight_bytes_per_accelerator(st.dense_params + st.head_params, st.routed_total_params * touch * inp.expert_slot_factor,
                                           lay.tp, lay.stage_size, prec.weight_bytes, prec.expert_weight_bytes)
    prior = (inp.input_tokens - tokens_rank) / 2 if n_chunks > 1 else 0.0 * tokens_rank  # a chunk reads the cache of the chunks before it
    kv_tokens = tokens_rank + np.minimum(prior, windows[None, :])  # (n, n_layers)
    kv = _per_stage_rows(st, kv_bytes_per_token_per_layer(arch, prec.kv_bytes) * kv_tokens) * kv_shard_fraction(arch, lay.tp)
    comm = roofline_comm(ctx, tokens_rank, tokens_stage, prefill=True)
    terms = StepTerms(compute_time_s(flops, ctx.flops_per_s) * one, memory_time_s(weights, ctx.hbm_bytes_per_s) * one,
                      memory_time_s(kv, ctx.hbm_bytes_per_s) * one, comm * one, 0.0 * one, one, one)
    return PrefillPass(compute_time_s(attention_flops, ctx.flops_per_s) * one, tokens, prompts, n_chunks, lambda: terms)


def _per_stage_rows(st: Stages, per_layer_rows: np.ndarray) -> np.ndarray:
    """Stages.per_stage over each row of an (n, n_layers) array: (n, pp)."""
    return np.stack([st.per_stage(row) for row in np.atleast_2d(per_layer_rows)])


def _broadcast(terms: StepTerms, one: np.ndarray) -> StepTerms:
    return StepTerms(*(_full(a, one) for a in (terms.compute, terms.weights, terms.kv, terms.comm, terms.overhead,
                                                terms.low_ratio, terms.high_ratio)))
