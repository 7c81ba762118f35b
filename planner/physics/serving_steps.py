"""The steps a replica's users wait on, for a table of batches (`batch_table`): the pure decode step,
and for an aggregated replica the mixed step (prompt tokens riding along at their mean rate) and the
step that carries a new request's prompt; for a prefill replica, its passes. The decode-side steps
come from one stacked evaluation of the step model (the rows do not interact).

Arrays have shape (n_batches, pp), per-batch values (n,).
"""

from dataclasses import dataclass

import numpy as np

from planner.modes import ServingRole
from planner.physics.draft import prefill_with_draft, speculative_decode_terms
from planner.physics.prefill import PrefillPass
from planner.physics.step_parts import StepContext, StepTerms

__all__ = ["DecodeSteps", "RoleStep", "decode_steps", "role_step"]


def _split(terms: StepTerms, parts: int) -> list[StepTerms]:
    """Stacked rows of `parts` equal blocks, cut back into one StepTerms per block."""
    n = len(terms.compute) // parts
    fields = (terms.compute, terms.weights, terms.kv, terms.comm, terms.overhead, terms.low_ratio, terms.high_ratio)
    return [StepTerms(*(a[k * n:(k + 1) * n] for a in fields)) for k in range(parts)]


@dataclass(frozen=True)
class DecodeSteps:
    """The decode-side steps of one table (n rows each): the pure decode step, and for an aggregated
    replica the mixed step (prefill riders at their mean rate) and the step that also carries one new
    prompt (or its first chunk) on one attention rank."""

    pure: StepTerms
    touch: np.ndarray
    mixed: StepTerms | None
    carrying: StepTerms | None
    riders: np.ndarray  # prompt tokens per micro-batch step and stage at the mean rate
    own_tokens: float  # the carried prompt's tokens in its step on its rank


def decode_steps(ctx: StepContext, batches: np.ndarray) -> DecodeSteps:
    """All the role's decode-side steps from one evaluation of stacked rows."""
    inp, lay = ctx.inp, ctx.inp.layout
    zero = np.zeros_like(batches)
    if inp.role is not ServingRole.AGGREGATED:
        decode, touch = speculative_decode_terms(ctx, batches)
        return DecodeSteps(decode, touch, None, None, zero, 0.0)
    # prompts arrive at the pace of the output: a step emits tokens_per_step tokens per sequence
    riders = batches / lay.pp * inp.prefilled_tokens / inp.output_tokens * inp.tokens_per_step
    own = float(min(inp.input_tokens, inp.prefill_chunk_tokens))  # a miss: its whole prompt, or the budget's chunk of it
    stacked, touch = speculative_decode_terms(ctx, np.concatenate([batches] * 3), np.concatenate([zero, riders, riders]),
                                              np.concatenate([zero, zero, zero + own]))
    pure, mixed, carrying = _split(stacked, 3)
    return DecodeSteps(pure, touch[:len(batches)], mixed, carrying, riders, own)


def _with_rider_attention(ctx: StepContext, step: StepTerms, tokens_rank: np.ndarray, pf: PrefillPass) -> StepTerms:
    """A mixed step with the prompt tokens' attention (calibrated), or their FLOPs and KV reads
    (roofline), added: `tokens_rank` (n,) prompt tokens on the slowest attention rank, at the
    per-token cost of a full prefill pass."""
    per_pass = (tokens_rank / float(pf.tokens[0]))[:, None]
    if ctx.calibrated:  # the riders' GEMM rows are in the mixed kernels; add their attention
        return StepTerms(step.compute + per_pass * pf.attention_s, step.weights, step.kv, step.comm, step.overhead, step.low_ratio,
                         step.high_ratio)
    return StepTerms(step.compute + per_pass * pf.terms.compute, step.weights, step.kv + per_pass * pf.terms.kv, step.comm, step.overhead,
                     step.low_ratio, step.high_ratio)


@dataclass(frozen=True)
class RoleStep:
    """The step the role's users wait on, on every stage (n, pp), and the role's prefill passes."""

    serving: StepTerms
    carrying: StepTerms | None  # aggregated: the step that carries a new prompt
    pass_tokens: np.ndarray  # (n,)
    passes_per_prompt: int


def role_step(ctx: StepContext, pf: PrefillPass, steps: DecodeSteps, batches: np.ndarray) -> RoleStep:
    """The role's step from its decode-side steps and `pf`, one full prefill pass of the replica."""
    inp, lay = ctx.inp, ctx.inp.layout
    full = np.full_like(batches, float(pf.tokens[0]))
    if inp.role is ServingRole.PREFILL:
        passes = prefill_with_draft(ctx, batches / (lay.pp * lay.dp_attn))
        return RoleStep(passes.terms, None, passes.tokens, passes.passes_per_prompt)
    if inp.role is ServingRole.DECODE:
        return RoleStep(steps.pure, None, full, pf.passes_per_prompt)
    shared = steps.riders / lay.dp_attn
    return RoleStep(_with_rider_attention(ctx, steps.mixed, shared, pf),
                    _with_rider_attention(ctx, steps.carrying, shared + steps.own_tokens, pf), full, pf.passes_per_prompt)
