"""The steps a replica's users wait on, for a table of batches (`batch_table`): the pure decode step,
and for an aggregated replica the mean step with the prompts it prefills and the step that carries a
new request's prompt; for a prefill replica, its passes. The decode-side steps come from one stacked
evaluation of the step model (the rows do not interact).

How an aggregated replica's prompts share its steps. They arrive at the pace of the output: B x
(prompt tokens) / (output tokens) per step on average. The ideal roofline spreads them evenly over
the steps, the cheapest schedule (their FLOPs hide under a memory-bound step). Engines do not: a
waiting prompt is admitted as soon as the step's token budget allows, whole or in budget-sized
chunks (vLLM's chunked-prefill scheduler, TensorRT-LLM's max_num_tokens, SGLang's
chunked_prefill_size), so under the calibrated model a step carries a prompt chunk or none. With r
prompt tokens per step, chunks of c tokens and d attention ranks, each rank carries a chunk in a
fraction r / (d c) of the steps. The model takes the ranks' chunks in the same steps, as TensorRT-LLM's
attention-DP balance schedules them (its tech blog 10: the expert layers wait for the slowest rank
every layer, so a chunk on one rank stalls the others); it is an assumption, the one TensorRT-LLM's
published attention-DP rows agree with (ranks taking their chunks independently put them at 0.4-0.6 of
their measured throughput). The mean step is the pure decode step plus r / (d c) times the extra time
of a step with a chunk on every rank. Once r / d reaches c every step is full and the prompts ride at their mean rate
as in the roofline.

What a user waits per token is not that mean: a request's own prompt was prefilled before its first
output token, so the steps between its tokens carry the other B - 1 requests' prompts only, a
fraction (B - 1) / B of the prompt-carrying share (at one request, the pure decode step). The mean
step sets the replica's output rate, the user's step its TPOT.

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
    mixed: StepTerms | None  # the step that carries prompt tokens: a chunk on every rank, or the mean riders
    carrying: StepTerms | None
    riders: np.ndarray  # prompt tokens per micro-batch step and stage at the mean rate
    own_tokens: float  # the carried prompt's tokens in its step on its rank
    mixed_rank_tokens: np.ndarray  # prompt tokens of `mixed` on its slowest attention rank (n,)
    mixed_share: np.ndarray  # the fraction of steps that are `mixed` (n,): 1 when the prompts ride evenly


def decode_steps(ctx: StepContext, batches: np.ndarray) -> DecodeSteps:
    """All the role's decode-side steps from one evaluation of stacked rows."""
    inp, lay = ctx.inp, ctx.inp.layout
    zero = np.zeros_like(batches)
    if inp.role is not ServingRole.AGGREGATED:
        decode, touch = speculative_decode_terms(ctx, batches)
        return DecodeSteps(decode, touch, None, None, zero, 0.0, zero, zero)
    # prompts arrive at the pace of the output: a step emits tokens_per_step tokens per sequence
    riders = batches / lay.pp * inp.prefilled_tokens / inp.output_tokens * inp.tokens_per_step
    own = float(min(inp.input_tokens, inp.prefill_chunk_tokens))  # a miss: its whole prompt, or the budget's chunk of it
    chunk = float(min(inp.prefilled_tokens, inp.prefill_chunk_tokens))
    per_rank = riders / lay.dp_attn
    lumpy = (per_rank < chunk) if ctx.calibrated else np.zeros(len(batches), dtype=bool)
    share = np.where(lumpy, per_rank / max(chunk, 1.0), 1.0)
    stacked, touch = speculative_decode_terms(ctx, np.concatenate([batches] * 3),
                                              np.concatenate([zero, np.where(lumpy, chunk * lay.dp_attn, riders), riders]),
                                              np.concatenate([zero, zero, zero + own]))
    pure, mixed, carrying = _split(stacked, 3)
    return DecodeSteps(pure, touch[:len(batches)], mixed, carrying, riders, own, np.where(lumpy, chunk, per_rank), share)


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

    serving: StepTerms  # the mean step (aggregated: with every prompt's share), which sets the output rate
    carrying: StepTerms | None  # aggregated: the step that carries a new prompt
    pass_tokens: np.ndarray  # (n,)
    passes_per_prompt: int
    user: StepTerms | None = None  # aggregated: the step between a user's tokens (the other prompts' share)

    @property
    def per_user(self) -> StepTerms:
        """The step between a user's tokens (`serving` but for an aggregated replica)."""
        return self.serving if self.user is None else self.user


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
    mixed = _with_rider_attention(ctx, steps.mixed, steps.mixed_rank_tokens, pf)
    others = np.maximum(batches - 1.0, 0.0) / np.maximum(batches, 1.0)
    return RoleStep(_mean_step(steps.pure, mixed, steps.mixed_share),
                    _with_rider_attention(ctx, steps.carrying, shared + steps.own_tokens, pf), full, pf.passes_per_prompt,
                    _mean_step(steps.pure, mixed, steps.mixed_share * others))


def _mean_step(pure: StepTerms, mixed: StepTerms, share: np.ndarray) -> StepTerms:
    """The mean of a replica's steps when a fraction `share` (n,) of them is `mixed`, the rest `pure`
    (module docstring). Calibrated terms add up, so the mean of the terms is the mean step (with
    overlapped communication, nearly); its range ratios are averaged alike."""
    if np.all(share == 1.0):
        return mixed
    if not np.any(share):
        return pure
    w = share[:, None]
    return StepTerms(*(a + w * (b - a) for a, b in zip(pure, mixed)))
