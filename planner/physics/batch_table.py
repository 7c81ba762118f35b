"""One layout evaluated at many batch sizes at once (numpy): step terms of the decode and prefill
passes on every stage (`physics.step`, `physics.prefill`), TPOT and TTFT in the replica's serving
role, HBM use and the prompt cache. The candidate enumeration and `estimate` both read this table.

A batch is the sequences a replica decodes at once, or for a prefill replica the prompts one
prefill pass holds over all its attention ranks and micro-batches.

Step 1 builds the step context (stages, links, rates of the chosen step model).
Step 2 evaluates the decode step, the prefill passes and, for an aggregated replica, the mixed step
where prefill tokens ride along and the step that carries a new request's prompt.
Step 3 takes the slowest stage, then derives latencies (TTFT from the queueing model of
`physics.first_token`), throughputs, memory and the prompt cache.
"""

import functools
from dataclasses import dataclass, replace

import numpy as np

from planner.hardware.kernels import kernel_rates
from planner.model.architecture import kv_bytes_per_request
from planner.modes import Engine, ServingRole, StepModel
from planner.physics.draft import draft_memory, prefill_with_draft
from planner.physics.first_token import (
    FirstToken,
    aggregated_first_token,
    decode_first_token,
    prefill_first_token,
)
from planner.physics.inputs import DeploymentInputs
from planner.physics.kv_cache import cached_bytes
from planner.physics.links import ReplicaLinks, default_replica_links, effective_links
from planner.physics.memory import (
    activation_bytes_per_accelerator,
    engine_kv_margin_bytes,
    held_kv_bytes_per_layer,
    kv_bytes_per_accelerator,
    kv_shard_fraction,
    weight_bytes_per_accelerator,
)
from planner.physics.prefill import PrefillPass, packed_prompts
from planner.physics.roofline import StepTime, step_total_s
from planner.physics.serving_steps import DecodeSteps, RoleStep, decode_steps, role_step
from planner.physics.stages import Stages, stages
from planner.physics.step_parts import StepContext, StepTerms
from planner.physics.table_columns import DecodeColumns, MemoryColumns, joined, rows_of
from planner.physics.uncertainty import FIRST_TOKEN, decode_regime, widen

__all__ = ["PAGED_KV_HEADROOM", "BatchTable", "FixedParts", "FullPass", "evaluate_batches", "fixed_parts", "kv_reservation", "shares_prefill", "step_context"]

# Engines page the KV cache and hold each sequence at its current length; in steady in-flight
# batching a sequence is on average half way through its output. HBM keeps this much above that
# mean for the spread of lengths in flight (a planner margin, not a measured constant).
PAGED_KV_HEADROOM = 0.10


def kv_reservation(inp: DeploymentInputs) -> tuple[float, str]:
    """Tokens of KV held per sequence, and how the engine's scheduler decides it.

    A prefill replica holds whole prompts. TensorRT-LLM's default capacity scheduler, GUARANTEED_NO_EVICT,
    admits a request only when blocks for its prompt plus its whole output are free (TensorRT-LLM docs,
    "Useful Runtime Options": a started request is never paused), so each sequence holds prompt + output.
    vLLM and SGLang admit on the current length and preempt or retract when the pool runs out: sequences
    are paged at their actual length, on average the prompt + half the output, plus the headroom. The
    ideal roofline pages like them."""
    full = float(inp.input_tokens + inp.output_tokens)
    if inp.role is ServingRole.PREFILL:
        return float(inp.input_tokens), "a prefill replica holds whole prompts"
    if inp.engine is Engine.TRTLLM and inp.step_model is StepModel.CALIBRATED:
        return full, (f"HBM reserves KV for the whole {full:g}-token sequence (TensorRT-LLM's default scheduler, "
                      "GUARANTEED_NO_EVICT, admits a request only when its prompt + output fit)")
    paged = min(full, (inp.input_tokens + inp.output_tokens / 2) * (1 + PAGED_KV_HEADROOM))
    return paged, (f"HBM holds paged KV at that mean + {PAGED_KV_HEADROOM:.0%} headroom ({paged:g} tokens, at most {full:g}; "
                   f"{inp.engine.value} admits on current length and preempts)")


def _memory_per_stage(inp: DeploymentInputs, st: Stages) -> tuple[np.ndarray, np.ndarray]:
    """Weight bytes per accelerator and KV bytes a sequence holds, on each stage (pp,)."""
    arch, lay, prec = inp.arch, inp.layout, inp.precisions
    weights = weight_bytes_per_accelerator(st.dense_params + st.vocab_params_stored, st.routed_total_params * inp.expert_slot_factor,
                                           lay.tp, lay.stage_size, prec.weight_bytes, prec.expert_weight_bytes)
    max_context, _ = kv_reservation(inp)
    kv = st.per_stage(held_kv_bytes_per_layer(arch, inp.engine, max_context, inp.step_model, prec.kv_bytes))
    draft_weights, draft_kv = draft_memory(inp, max_context)  # the MTP module sits on the last stage
    return weights + np.where(st.is_last, draft_weights, 0.0), kv + np.where(st.is_last, draft_kv, 0.0)


def _kept_memory(ctx: StepContext) -> tuple[np.ndarray, np.ndarray]:
    """`_memory_per_stage`, kept for contexts on the same model, accelerator, formats and layout that
    reserve as much KV per sequence and hold the draft module alike."""
    inp = ctx.inp
    return ctx.shared(("memory",), lambda: (inp.layout, inp.expert_slot_factor, kv_reservation(inp)[0], inp.speculative is None, inp.engine),
                      lambda: _memory_per_stage(inp, ctx.st))


def _memory(inp: DeploymentInputs, per_stage: tuple[np.ndarray, np.ndarray], chunk: np.ndarray, batches: np.ndarray) -> tuple[np.ndarray, ...]:
    """HBM use of the fullest stage's accelerators for each batch: weights, KV, activations (n,).
    A prefill replica's batch is the prompts it holds (being computed or awaiting their hand-off).
    `per_stage`: its _memory_per_stage; `chunk`: prompt tokens per attention rank in a pass (n,)."""
    arch, lay, prec = inp.arch, inp.layout, inp.precisions
    per_rank = (batches / lay.dp_attn)[:, None]
    weights = per_stage[0] * np.ones_like(per_rank)
    kv = kv_bytes_per_accelerator(per_rank, per_stage[1], kv_shard_fraction(arch, lay.tp))
    micro_per_rank = per_rank / lay.pp * inp.step_queries  # a speculative step runs 1 + k tokens per sequence
    tokens = np.maximum(micro_per_rank, np.asarray(chunk, dtype=float)[:, None])
    mlp_width = arch.dense_intermediate_size
    dispatch = 0.0 * tokens
    if arch.is_moe:
        moe = arch.moe
        mlp_width = max(mlp_width, moe.experts_per_token * moe.expert_intermediate_size
                        + moe.n_shared_experts * moe.shared_expert_intermediate_size)
        if lay.ep > 1:  # tokens an expert rank receives for the largest forward pass
            dispatch = tokens * lay.dp_attn * moe.experts_per_token / lay.ep
    logits_tokens = np.where(np.arange(lay.pp) == lay.pp - 1, micro_per_rank, 0.0)
    activations = activation_bytes_per_accelerator(tokens, arch.hidden_size, mlp_width / lay.tp, prec.activation_bytes,
                                                   logits_tokens, arch.vocab_size / lay.tp, dispatch)
    activations = activations + inp.overheads.runtime_reserved_bytes + inp.overheads.communication_buffer_bytes(max(lay.tp, lay.stage_size if lay.ep > 1 else 1))
    activations = activations + engine_kv_margin_bytes(inp, weights, activations)  # what the engine keeps out of its KV pool
    if lay.pp == 1:  # its one stage is the fullest
        return weights[:, 0], kv[:, 0], activations[:, 0]
    fullest = np.argmax(weights + kv + activations, axis=1)
    rows = np.arange(len(batches))
    return weights[rows, fullest], kv[rows, fullest], activations[rows, fullest]


@dataclass(frozen=True)
class BatchTable:
    """One layout evaluated at several batch sizes; arrays of shape (n_batches,).

    Step-time terms are those of the slowest pipeline stage, times the stages, over the tokens a step
    emits per sequence (they sum to `mean_step_per_token_s`: TPOT but for an aggregated replica, whose
    users do not wait on their own prompts); a prefill replica's `serving_step` is one prefill pass
    through its slowest stage. `stage_time_s` is the whole mean step (the cycle requests wait for)."""

    batches: np.ndarray
    decode: DecodeColumns  # the pure decode step's terms and range
    memory: MemoryColumns  # HBM use and the prompt cache's bytes
    stage_time_s: np.ndarray  # the role's step on the slowest stage: mixed (aggregated), decode, or a prefill pass
    tpot_s: np.ndarray  # what a user waits per output token: pp x the step between its tokens
    mean_step_per_token_s: np.ndarray  # pp x the replica's mean step per token emitted: batch / it is the output rate
    ttft_s: np.ndarray  # mean TTFT at the replica's load (physics.first_token)
    ttft_p90_s: np.ndarray  # its 90th percentile (what TTFT limits hold at)
    queue_s: np.ndarray  # the mean wait for the step or pass in progress (part of ttft_s)
    miss_service_s: np.ndarray  # admission to first token of a request that prefills its whole prompt
    hit_service_s: np.ndarray  # ... of a prompt-cache hit: reload its prefix, prefill the rest (0 without a cache)
    ttft_low_ratio: np.ndarray  # p10 and p90 of TTFT from the kernel fits' spreads, as ratios to it
    ttft_high_ratio: np.ndarray
    decode_tokens_per_s: np.ndarray  # batch / pure decode TPOT
    tpot_low_s: np.ndarray  # p10 and p90 of TPOT from the kernel fits' spreads (= tpot_s under the roofline)
    tpot_high_s: np.ndarray
    serving_step: tuple[np.ndarray, ...]  # the role's step terms (compute, weights, kv, comm, overhead), see above
    prefill_riders: np.ndarray  # prefill tokens per micro-batch step and stage (aggregated), else 0
    pass_tokens: np.ndarray  # prompt tokens per attention rank in one of the role's prefill passes
    own_pass_input_tokens_per_s: np.ndarray | None  # a prefill replica's: see pass_input_tokens_per_s (None: the other roles)
    storage_usd_per_s: np.ndarray  # holding the prompt cache outside HBM, per replica
    touch: np.ndarray
    full_pass: "FullPass"  # prefill_step and prefill_tokens_per_s
    flops_per_s: float
    hbm_bandwidth_bytes_per_s: float
    step_model: StepModel
    kernel_source: str  # where the calibrated rates come from ("" under the roofline)

    @property
    def ttft_high_s(self) -> np.ndarray:
        """The 90th percentile of TTFT with every kernel at the p90 of its rate (`--confidence high`)."""
        return self.ttft_p90_s * self.ttft_high_ratio

    @property
    def prefill_step(self) -> StepTime:
        """One full prefill pass (the budget's packed prompts) through the slowest stage."""
        return self.full_pass.step

    @property
    def prefill_tokens_per_s(self) -> float:
        """Such passes back to back: the replica's prefill rate alone."""
        return self.full_pass.tokens_per_s

    @property
    def pass_input_tokens_per_s(self) -> np.ndarray:
        """Prompt tokens/s the role's prefill passes take in, per replica, back to back (full passes but
        for a prefill replica)."""
        own = self.own_pass_input_tokens_per_s
        return own if own is not None else np.full_like(self.batches, self.prefill_tokens_per_s)

    @property
    def used_bytes(self) -> np.ndarray:
        return self.memory.used_bytes

    @property
    def fits(self) -> np.ndarray:
        return self.memory.fits

    input_tokens: int
    output_tokens: int
    role: ServingRole = ServingRole.AGGREGATED
    tokens_per_step: float = 1.0  # output tokens a decode step emits per sequence (speculative decoding's accepted length)

    def rows(self, index: np.ndarray | slice) -> "BatchTable":
        """The table at the batches `index` picks (a slice: views of this table's arrays): each batch's
        row depends on that batch alone."""
        return rows_of(self, index)

    def followed_by(self, other: "BatchTable") -> "BatchTable":
        """This table's rows, then `other`'s (the same inputs at further batches)."""
        return joined(self, other)

    @property
    def sustained_output_tokens_per_s(self) -> np.ndarray:
        """Output tokens per second per replica: batch / TPOT, prefill included for an aggregated
        replica (its mean step carries the prompts); a prefill replica emits none."""
        if self.role is ServingRole.PREFILL:
            return np.zeros_like(self.batches)
        return self.batches / self.mean_step_per_token_s

    @property
    def sustained_input_tokens_per_s(self) -> np.ndarray:
        """Prompt tokens per second per replica the role handles (prefilled, or for a decode replica
        received with their KV cache)."""
        if self.role is ServingRole.PREFILL:
            return self.pass_input_tokens_per_s
        return self.sustained_output_tokens_per_s * self.input_tokens / self.output_tokens


def _prompt_cache(inp: DeploymentInputs, requests_per_s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Per-accelerator bytes of the replica's prompt cache, whether they fit the tier, the cost of
    holding them outside HBM, and whether they sit in HBM."""
    zero = np.zeros_like(requests_per_s)
    cache = inp.prefix_cache
    if cache is None or inp.role is ServingRole.DECODE:
        return zero, np.ones_like(requests_per_s, dtype=bool), zero, False
    prefix_bytes = kv_bytes_per_request(inp.arch, cache.prefix_tokens, inp.precisions.kv_bytes)
    held = cached_bytes(requests_per_s, cache.hit_rate, cache.retention_s, prefix_bytes)
    per_accelerator = held / inp.layout.n_accelerators
    if cache.tier.in_hbm:
        return per_accelerator, np.ones_like(requests_per_s, dtype=bool), zero, True
    # the tier must hold the entries and stream the hits back: hit_rate x requests/s x prefix bytes
    reload_rate = requests_per_s * cache.hit_rate * prefix_bytes / inp.layout.n_accelerators
    fits = (per_accelerator <= cache.tier.capacity_bytes_per_accelerator) & (reload_rate <= cache.tier.read_bytes_per_s_per_accelerator)
    return per_accelerator, fits, held * cache.tier.usd_per_byte_s, False


def step_context(inp: DeploymentInputs, links: ReplicaLinks, reuse: dict | None = None) -> StepContext:
    """`inp`'s step context over `links`; `reuse`: kernel times shared with the other contexts of one
    enumeration (`StepContext.reused`)."""
    accel = inp.rack.accelerator
    fmt = inp.precisions.compute
    rates = kernel_rates(accel.id, inp.engine, accel.kernels_dir) if inp.step_model is StepModel.CALIBRATED else None
    return StepContext(inp, stages(inp.arch, inp.layout.pp), links, effective_links(links, accel),
                       accel.achievable_flops_per_s(fmt),
                       accel.achievable_hbm_bytes_per_s, rates, reuse)


def _totals(terms: StepTerms, inp: DeploymentInputs, model: StepModel) -> np.ndarray:
    return step_total_s(terms.compute, terms.weights, terms.kv, terms.comm, inp.overlap, terms.overhead, model)


def _stated(model: StepModel, low, high, regime: str) -> tuple[np.ndarray, np.ndarray]:
    """A calibrated prediction's stated range (physics.uncertainty); the ideal roofline has none."""
    if model is not StepModel.CALIBRATED:
        return np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    return widen(low, high, regime)


@dataclass(frozen=True)
class FixedParts:
    """What a layout's table needs that does not depend on the batch: the step context and a full
    prefill pass (evaluate once, then at any batches)."""

    ctx: StepContext
    model: StepModel
    pf: PrefillPass  # one full pass: the budget's packed prompts, or one chunk (one row)
    full_pass: "FullPass"  # that pass through the slowest stage, and its rate
    memory_per_stage: tuple[np.ndarray, np.ndarray]  # weight bytes per accelerator, KV bytes per sequence (pp,)


class FullPass:
    """A full prefill pass through the slowest stage (its range stated) and the prefill rate of such
    passes back to back, evaluated on first use: an estimate reports them, the enumeration's tables
    never read them. Pickled as the two values."""

    def __init__(self, pf: PrefillPass, inp: DeploymentInputs, model: StepModel) -> None:
        self._parts = (pf, inp, model)

    @functools.cached_property
    def step(self) -> StepTime:
        pf, inp, model = self._parts
        step = _slowest_step(pf.terms, inp, model)
        low, high = _stated(model, step.low_ratio, step.high_ratio, FIRST_TOKEN)
        return step._replace(low_ratio=float(low), high_ratio=float(high))

    @functools.cached_property
    def tokens_per_s(self) -> float:
        pf, inp, _ = self._parts
        return float(pf.tokens[0]) * inp.layout.dp_attn / self.step.total_s

    def __getstate__(self) -> dict:
        return {"step": self.step, "tokens_per_s": self.tokens_per_s}


def _slowest_step(terms: StepTerms, inp: DeploymentInputs, model: StepModel, row: int = 0) -> StepTime:
    totals = _totals(terms, inp, model)
    k = int(np.argmax(totals[row]))
    return StepTime(*(float(a[row, k]) for a in (terms.compute, terms.weights, terms.kv, terms.comm)), inp.overlap,
                    float(terms.overhead[row, k]), model, float(terms.low_ratio[row, k]), float(terms.high_ratio[row, k]))


def shares_prefill(a: DeploymentInputs, b: DeploymentInputs) -> bool:
    """Whether two inputs' prefill passes are the same: they differ at most in serving role, prompt
    cache and draft tokens per step (with or without the draft module alike)."""
    plain = {"role": ServingRole.AGGREGATED, "prefix_cache": None, "speculative": None, "batch_per_replica": 0}
    return (a.speculative is None) == (b.speculative is None) and replace(a, **plain) == replace(b, **plain)


def fixed_parts(inp: DeploymentInputs, links: ReplicaLinks | None = None, like: FixedParts | None = None,
                reuse: dict | None = None) -> FixedParts:
    """`inp`'s fixed parts; `like`: those of inputs that share its prefill pass (`shares_prefill`),
    whose pass is taken as it is; `reuse`: see `step_context`."""
    lay = inp.layout
    ctx = step_context(inp, like.ctx.links if like else links or default_replica_links(inp.rack, lay, inp.overheads.collective_latency_s),
                       reuse)
    if like is not None:
        return replace(like, ctx=ctx, memory_per_stage=_kept_memory(ctx))
    model = StepModel.CALIBRATED if ctx.calibrated else StepModel.ROOFLINE
    pf = prefill_with_draft(ctx, np.array([float(max(packed_prompts(inp.input_tokens, inp.prefill_chunk_tokens), 1))]))
    return FixedParts(ctx, model, pf, FullPass(pf, inp, model), _kept_memory(ctx))


def _first_token_of_role(inp: DeploymentInputs, role: RoleStep, steps: DecodeSteps, stage_s: np.ndarray,
                         model: StepModel) -> tuple[FirstToken, np.ndarray, np.ndarray | None]:
    if inp.role is ServingRole.PREFILL:
        return prefill_first_token(inp, stage_s, role.passes_per_prompt)
    if inp.role is ServingRole.DECODE:
        return decode_first_token(inp, stage_s)
    carrying = _totals(role.carrying, inp, model)
    carrying_s = carrying[:, 0] if carrying.shape[1] == 1 else np.max(carrying, axis=1)  # the slowest stage's
    return aggregated_first_token(inp, stage_s, carrying_s, steps.own_tokens)


def _slowest(totals: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Each row's slowest stage, as the (rows, stages) index of an (n, pp) array; None with one stage
    (every row's only one)."""
    return None if totals.shape[1] == 1 else (np.arange(len(totals)), np.argmax(totals, axis=1))


def _at(a: np.ndarray, slowest: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """Each row of `a` (n, pp) at its stage in `slowest` (see `_slowest`)."""
    return a[:, 0] if slowest is None else a[slowest]


def _times(a: np.ndarray, factor: float) -> np.ndarray:
    return a if factor == 1 else factor * a  # x 1 is the same numbers


def evaluate_batches(inp: DeploymentInputs, batches, links: ReplicaLinks | None = None, fixed: FixedParts | None = None) -> BatchTable:
    """Evaluate `inp`'s layout at every batch in `batches` (inp.batch_per_replica is ignored);
    `fixed`: its fixed_parts(inp, links), when the caller has them already."""
    accel, lay = inp.rack.accelerator, inp.layout
    fixed = fixed or fixed_parts(inp, links)
    ctx, model = fixed.ctx, fixed.model
    batches = np.asarray(batches, dtype=float)

    steps = decode_steps(ctx, batches)
    decode_totals = _totals(steps.pure, inp, model)
    decode_slowest = _slowest(decode_totals)
    per_token = lay.pp / inp.tokens_per_step  # a round of every stage emits tokens_per_step tokens per sequence
    decode_tpot = _times(_at(decode_totals, decode_slowest), per_token)
    role = role_step(ctx, fixed.pf, steps, batches)
    totals = _totals(role.serving, inp, model)
    slowest = _slowest(totals)
    stage_time = _at(totals, slowest)
    low, high = _at(role.serving.low_ratio, slowest), _at(role.serving.high_ratio, slowest)
    prefill = inp.role is ServingRole.PREFILL
    decode_low, decode_high = _stated(model, _at(steps.pure.low_ratio, decode_slowest), _at(steps.pure.high_ratio, decode_slowest),
                                      decode_regime(inp.arch.is_moe))
    user = _totals(role.per_user, inp, model)
    at_user = lambda a: _at(a, _slowest(user))  # the step between a user's tokens, on its slowest stage
    tpot, tpot_low, tpot_high = ((decode_tpot, decode_low, decode_high) if prefill else (_times(at_user(user), per_token), *_stated(
        model, at_user(role.per_user.low_ratio), at_user(role.per_user.high_ratio), decode_regime(inp.arch.is_moe))))
    mean_per_token = decode_tpot if prefill else _times(stage_time, per_token)
    ttft_low, ttft_high = _stated(model, low, high, FIRST_TOKEN)
    ttft, miss, hit = _first_token_of_role(inp, role, steps, stage_time, model)
    pass_rate = role.pass_tokens * lay.dp_attn / stage_time if prefill else None
    requests_per_s = pass_rate / inp.prefilled_tokens if prefill else batches / mean_per_token / inp.output_tokens
    weights_bytes, kv_bytes, activations_bytes = _memory(inp, fixed.memory_per_stage, role.pass_tokens, batches)
    cache_bytes, cache_fits, storage, cache_in_hbm = _prompt_cache(inp, requests_per_s)
    decode_at = lambda a: _times(_at(a, decode_slowest), per_token)  # per output token: they sum to TPOT
    serving_at = lambda a: _times(_at(a, slowest), 1 if prefill else per_token)  # a prefill replica's step: one pass
    decode = DecodeColumns(*(decode_at(term) for term in steps.pure.as_tuple()), decode_low, decode_high)
    memory = MemoryColumns(weights_bytes, kv_bytes, activations_bytes, accel.hbm_capacity_bytes, cache_bytes, cache_in_hbm, cache_fits)
    return BatchTable(
        batches=batches, decode=decode, memory=memory, tpot_low_s=tpot * tpot_low, tpot_high_s=tpot * tpot_high,
        stage_time_s=stage_time, tpot_s=tpot, mean_step_per_token_s=mean_per_token, ttft_s=ttft.mean_s, ttft_p90_s=ttft.quantile_s, queue_s=ttft.wait_s,
        miss_service_s=miss, hit_service_s=np.zeros_like(batches) if hit is None else hit, ttft_low_ratio=ttft_low, ttft_high_ratio=ttft_high,
        decode_tokens_per_s=batches / decode_tpot,
        serving_step=tuple(serving_at(term) for term in role.serving.as_tuple()), prefill_riders=steps.riders,
        pass_tokens=role.pass_tokens, own_pass_input_tokens_per_s=pass_rate,
        storage_usd_per_s=storage, touch=steps.touch, full_pass=fixed.full_pass, flops_per_s=ctx.flops_per_s,
        hbm_bandwidth_bytes_per_s=ctx.hbm_bytes_per_s, step_model=model, kernel_source=ctx.rates.source if ctx.calibrated else "",
        input_tokens=inp.input_tokens, output_tokens=inp.output_tokens, role=inp.role, tokens_per_step=inp.tokens_per_step,
    )
