"""One layout evaluated at many decode batch sizes at once (numpy): step terms of the decode and
prefill passes on every stage (`physics.step`), TPOT and TTFT in the replica's serving role, HBM use
and the prompt cache. The candidate enumeration and `estimate` both read this table.

Step 1 builds the step context (stages, links, rates of the chosen step model).
Step 2 evaluates the decode step, a prefill pass and, for an aggregated replica, the mixed step
where prefill tokens ride along.
Step 3 takes the slowest stage, then derives latencies, throughputs, memory and the prompt cache.
"""

from dataclasses import dataclass, replace

import numpy as np

from planner.hardware.kernels import kernel_rates
from planner.model.architecture import kv_bytes_per_sequence
from planner.modes import Engine, ServingRole, StepModel
from planner.physics.inputs import DeploymentInputs
from planner.physics.kv_cache import cached_bytes, reload_s
from planner.physics.links import ReplicaLinks, default_replica_links, effective_links
from planner.physics.memory import (
    activation_bytes_per_accelerator,
    kv_bytes_per_accelerator,
    kv_shard_fraction,
    weight_bytes_per_accelerator,
)
from planner.physics.prefill import PrefillPass, prefill_pass
from planner.physics.roofline import StepTime, step_total_s
from planner.physics.stages import Stages, stages
from planner.physics.step import decode_terms
from planner.physics.step_parts import StepContext, StepTerms

__all__ = ["PAGED_KV_HEADROOM", "WORST_CASE_QUEUE_DEPARTURES", "BatchTable", "FixedParts", "evaluate_batches", "fixed_parts",
           "kv_reservation", "step_context"]

WORST_CASE_QUEUE_DEPARTURES = 2  # claim 3: a request waits at most about two batch departures
# Engines page the KV cache and hold each sequence at its current length; in steady in-flight
# batching a sequence is on average half way through its output. HBM keeps this much above that
# mean for the spread of lengths in flight (a planner margin, not a measured constant).
PAGED_KV_HEADROOM = 0.10


def kv_reservation(inp: DeploymentInputs) -> tuple[float, str]:
    """Tokens of KV held per sequence, and how the engine's scheduler decides it.

    A prefill replica holds whole prompts. TensorRT-LLM's default capacity scheduler,
    GUARANTEED_NO_EVICT, admits a request only when blocks for its prompt plus its whole output are
    free (TensorRT-LLM docs, "Useful Runtime Options": the default policy guarantees a started
    request is never paused), so each sequence holds prompt + output. vLLM and SGLang admit on the
    current length and preempt or retract when the pool runs out: sequences are paged at their
    actual length, on average the prompt + half the output, plus the headroom. The ideal roofline
    pages like them."""
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
    return weights, st.per_stage(kv_bytes_per_sequence(arch, max_context, prec.kv_bytes))


def _memory(inp: DeploymentInputs, per_stage: tuple[np.ndarray, np.ndarray], chunk: int, batches: np.ndarray) -> tuple[np.ndarray, ...]:
    """HBM use of the fullest stage's accelerators for each batch: weights, KV, activations (n,).
    A prefill replica's batch is the prompts it holds (being computed or awaiting their hand-off).
    `per_stage`: its _memory_per_stage."""
    arch, lay, prec = inp.arch, inp.layout, inp.precisions
    per_rank = (batches / lay.dp_attn)[:, None]
    weights = per_stage[0] * np.ones_like(per_rank)
    kv = kv_bytes_per_accelerator(per_rank, per_stage[1], kv_shard_fraction(arch, lay.tp))
    micro_per_rank = per_rank / lay.pp
    tokens = np.maximum(micro_per_rank, chunk)
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
    group = max(lay.tp, lay.stage_size if lay.ep > 1 else 1)
    activations = activations + inp.overheads.runtime_reserved_bytes + inp.overheads.communication_buffer_bytes(group)
    fullest = np.argmax(weights + kv + activations, axis=1)
    rows = np.arange(len(batches))
    return weights[rows, fullest], kv[rows, fullest], activations[rows, fullest]


@dataclass(frozen=True)
class BatchTable:
    """One layout evaluated at several decode batch sizes; arrays of shape (n_batches,).

    Step-time terms are those of the slowest pipeline stage, multiplied by the number of stages
    (they sum to TPOT under the combination rule). Prefill does not depend on the decode batch."""

    batches: np.ndarray
    compute_s: np.ndarray  # pure decode step terms (what a decode token costs alone)
    weights_s: np.ndarray
    kv_s: np.ndarray
    comm_s: np.ndarray
    stage_time_s: np.ndarray  # the role's step on the slowest stage (mixed for aggregated replicas)
    tpot_s: np.ndarray  # what a user waits per output token: pp x stage_time_s
    ttft_s: np.ndarray
    queue_s: np.ndarray  # the TTFT part spent waiting: 2 departures (aggregated), the prompt ahead (prefill), next step (decode)
    decode_tokens_per_s: np.ndarray  # batch / pure decode TPOT
    overhead_s: np.ndarray  # pure decode: kernel floors and elementwise work (calibrated model; 0 under the roofline)
    tpot_low_s: np.ndarray  # p10 and p90 of TPOT from the kernel fits' spreads (= tpot_s under the roofline)
    tpot_high_s: np.ndarray
    decode_low_ratio: np.ndarray  # p10 and p90 of the pure decode step as ratios to it
    decode_high_ratio: np.ndarray
    serving_step: tuple[np.ndarray, ...]  # the role's step terms x pp (compute, weights, kv, comm, overhead)
    prefill_riders: np.ndarray  # prefill tokens per micro-batch step and stage (aggregated), else 0
    cache_bytes: np.ndarray  # prompt-cache bytes per accelerator (in HBM for the hbm tier, else in its tier)
    cache_in_hbm: bool
    cache_fits: np.ndarray  # the prompt cache fits its tier
    storage_usd_per_s: np.ndarray  # holding the prompt cache outside HBM, per replica
    touch: np.ndarray
    weights_bytes: np.ndarray
    kv_bytes: np.ndarray
    activations_bytes: np.ndarray
    capacity_bytes: float
    prefill_step: StepTime  # one prefill pass through the slowest stage
    prefill_latency_s: float
    cache_hit_latency_s: float  # a cache hit: reload its prefix, prefill the rest (0 without a prompt cache)
    prefill_tokens_per_s: float
    chunk_tokens: int  # prompt tokens per attention rank in one prefill pass (packed prompts or a chunk)
    flops_per_s: float
    hbm_bandwidth_bytes_per_s: float
    step_model: StepModel
    kernel_source: str  # where the calibrated rates come from ("" under the roofline)

    @property
    def ttft_high_s(self) -> np.ndarray:
        """p90 of TTFT: the waiting part scales with the step's range, the prefill with the pass's."""
        return self.queue_s * self.tpot_high_s / self.tpot_s + (self.ttft_s - self.queue_s) * self.prefill_step.high_ratio

    @property
    def used_bytes(self) -> np.ndarray:
        return self.weights_bytes + self.kv_bytes + self.activations_bytes + (self.cache_bytes if self.cache_in_hbm else 0.0)

    @property
    def fits(self) -> np.ndarray:
        return (self.used_bytes <= self.capacity_bytes) & self.cache_fits

    input_tokens: int
    output_tokens: int
    role: ServingRole = ServingRole.AGGREGATED

    def rows(self, index: np.ndarray) -> "BatchTable":
        """The table at the batches `index` picks: each batch's row depends on that batch alone."""
        rows = object.__new__(BatchTable)  # a copy with the arrays cut (no __init__: the fields are this table's)
        rows.__dict__.update({name: value[index] if isinstance(value, np.ndarray) else value for name, value in self.__dict__.items()},
                             serving_step=tuple(term[index] for term in self.serving_step))
        return rows

    @property
    def sustained_output_tokens_per_s(self) -> np.ndarray:
        """Output tokens per second per replica: batch / TPOT, prefill included for an aggregated
        replica (its mixed steps carry the prompts); a prefill replica emits none."""
        if self.role is ServingRole.PREFILL:
            return np.zeros_like(self.batches)
        return self.batches / self.tpot_s

    @property
    def sustained_input_tokens_per_s(self) -> np.ndarray:
        """Prompt tokens per second per replica the role handles (prefilled, or for a decode replica
        received with their KV cache)."""
        if self.role is ServingRole.PREFILL:
            return np.full_like(self.batches, self.prefill_tokens_per_s)
        return self.sustained_output_tokens_per_s * self.input_tokens / self.output_tokens


def _prompt_cache(inp: DeploymentInputs, requests_per_s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Per-accelerator bytes of the replica's prompt cache, whether they fit the tier, the cost of
    holding them outside HBM, and whether they sit in HBM."""
    zero = np.zeros_like(requests_per_s)
    cache = inp.prefix_cache
    if cache is None or inp.role is ServingRole.DECODE:
        return zero, np.ones_like(requests_per_s, dtype=bool), zero, False
    prefix_bytes = float(np.sum(kv_bytes_per_sequence(inp.arch, cache.prefix_tokens, inp.precisions.kv_bytes)))
    held = cached_bytes(requests_per_s, cache.hit_rate, cache.retention_s, prefix_bytes)
    per_accelerator = held / inp.layout.n_accelerators
    if cache.tier.in_hbm:
        return per_accelerator, np.ones_like(requests_per_s, dtype=bool), zero, True
    # the tier must hold the entries and stream the hits back: hit_rate x requests/s x prefix bytes
    reload_rate = requests_per_s * cache.hit_rate * prefix_bytes / inp.layout.n_accelerators
    fits = (per_accelerator <= cache.tier.capacity_bytes_per_accelerator) & (reload_rate <= cache.tier.read_bytes_per_s_per_accelerator)
    return per_accelerator, fits, held * cache.tier.usd_per_byte_s, False


def _cache_hit_latency(inp: DeploymentInputs, full_prompt_s: float) -> float:
    """A cache hit reloads its prefix from the tier and prefills the rest of the prompt (0 without a cache)."""
    cache = inp.prefix_cache
    if cache is None or cache.hit_rate == 0:
        return 0.0
    prefix_bytes = float(np.sum(kv_bytes_per_sequence(inp.arch, cache.prefix_tokens, inp.precisions.kv_bytes)))
    return reload_s(prefix_bytes, inp.layout.n_accelerators, cache.tier) + full_prompt_s * (1 - cache.prefix_tokens / inp.input_tokens)


def _worst_prefill_latency(inp: DeploymentInputs, full_prompt_s: float, hit_s: float) -> float:
    """A miss prefills the whole prompt (`full_prompt_s`); a hit takes `hit_s`. TTFT takes the
    slower of the two that happen."""
    cache = inp.prefix_cache
    if cache is None or cache.hit_rate == 0:
        return full_prompt_s
    return max(full_prompt_s if cache.hit_rate < 1 else 0.0, hit_s)


def step_context(inp: DeploymentInputs, links: ReplicaLinks) -> StepContext:
    accel = inp.rack.accelerator
    fmt = inp.precisions.compute
    rates = kernel_rates(accel.id, inp.engine) if inp.step_model is StepModel.CALIBRATED else None
    return StepContext(inp, stages(inp.arch, inp.layout.pp), links, effective_links(links, accel),
                       accel.dense_flops_per_s[fmt] * accel.compute_fraction_by_format[fmt],
                       accel.hbm_bandwidth_bytes_per_s * accel.hbm_bandwidth_fraction, rates)


def _totals(terms: StepTerms, inp: DeploymentInputs, model: StepModel) -> np.ndarray:
    return step_total_s(terms.compute, terms.weights, terms.kv, terms.comm, inp.overlap, terms.overhead, model)


def _decode_and_mixed(ctx: StepContext, batches: np.ndarray) -> tuple[StepTerms, np.ndarray, StepTerms | None, np.ndarray]:
    """The pure decode step (its expert touch), and for an aggregated replica the mixed step where its
    share of the prompts rides along (batch x prompt tokens computed / output tokens per replica
    step), with those riders: both from one evaluation of stacked rows (a pure row is a mixed row
    without riders; the rows do not interact)."""
    inp, lay = ctx.inp, ctx.inp.layout
    if inp.role is not ServingRole.AGGREGATED:
        decode, touch = decode_terms(ctx, batches)
        return decode, touch, None, np.zeros_like(batches)
    n = len(batches)
    riders = batches / lay.pp * inp.prefilled_tokens / inp.output_tokens
    both, touch = decode_terms(ctx, np.concatenate([batches, batches]), np.concatenate([np.zeros_like(riders), riders]))
    pure, mixed = (StepTerms(*(a[part] for a in (both.compute, both.weights, both.kv, both.comm, both.overhead, both.low_ratio,
                                                  both.high_ratio))) for part in (slice(None, n), slice(n, None)))
    return pure, touch[:n], mixed, riders


def _serving_terms(ctx: StepContext, decode: StepTerms, mixed: StepTerms | None, riders: np.ndarray, pf) -> StepTerms:
    """The step a user waits on: the decode step, or for an aggregated replica the mixed step with
    the riders' attention (calibrated) or their FLOPs and KV reads (roofline) added."""
    lay = ctx.inp.layout
    if mixed is None:
        return decode
    per_pass = (riders / (pf.tokens * lay.dp_attn))[:, None]
    if ctx.calibrated:  # the riders' GEMM rows are in the mixed kernels; add their attention
        return replace(mixed, compute=mixed.compute + per_pass * pf.attention_s)
    return replace(mixed, compute=mixed.compute + per_pass * pf.terms.compute, kv=mixed.kv + per_pass * pf.terms.kv)


def _queue_and_ttft(inp: DeploymentInputs, batches, stage_time, tpot, passes_s, prefill_rate, prefill_latency, hit_latency):
    """TTFT parts and requests per second of the role."""
    if inp.role is ServingRole.PREFILL:  # a prompt waits for the pass ahead of it, then runs its own
        queue = passes_s + 0.0 * batches
        return queue, queue + _worst_prefill_latency(inp, prefill_latency, hit_latency), np.full_like(batches, prefill_rate / inp.prefilled_tokens)
    requests_per_s = batches / tpot / inp.output_tokens
    if inp.role is ServingRole.DECODE:  # a request that arrives with its KV cache joins the next step
        return stage_time, stage_time, requests_per_s
    queue = WORST_CASE_QUEUE_DEPARTURES * stage_time
    return queue, queue + _worst_prefill_latency(inp, prefill_latency, hit_latency), requests_per_s


@dataclass(frozen=True)
class FixedParts:
    """What a layout's table needs that does not depend on the batch: the step context and the
    prefill pass (evaluate once, then at any batches)."""

    ctx: StepContext
    model: StepModel
    pf: PrefillPass
    prefill_step: StepTime  # one prefill pass through the slowest stage
    prefill_latency_s: float
    prefill_tokens_per_s: float
    cache_hit_latency_s: float
    memory_per_stage: tuple[np.ndarray, np.ndarray]  # weight bytes per accelerator, KV bytes per sequence (pp,)


def fixed_parts(inp: DeploymentInputs, links: ReplicaLinks | None = None) -> FixedParts:
    lay = inp.layout
    ctx = step_context(inp, links or default_replica_links(inp.rack, lay, inp.overheads.collective_latency_s))
    model = StepModel.CALIBRATED if ctx.calibrated else StepModel.ROOFLINE
    pf = prefill_pass(ctx)
    pass_totals = _totals(pf.terms, inp, model)
    k = int(np.argmax(pass_totals))
    prefill_step = StepTime(*(float(a[k]) for a in (pf.terms.compute, pf.terms.weights, pf.terms.kv, pf.terms.comm)), inp.overlap,
                            float(pf.terms.overhead[k]), model, float(pf.terms.low_ratio[k]), float(pf.terms.high_ratio[k]))
    prefill_latency = (pf.passes_per_prompt + lay.pp - 1) * prefill_step.total_s
    prefill_rate = pf.tokens * lay.dp_attn / prefill_step.total_s
    return FixedParts(ctx, model, pf, prefill_step, prefill_latency, prefill_rate, _cache_hit_latency(inp, prefill_latency),
                      _memory_per_stage(inp, ctx.st))


def evaluate_batches(inp: DeploymentInputs, batches, links: ReplicaLinks | None = None, fixed: FixedParts | None = None) -> BatchTable:
    """Evaluate `inp`'s layout at every batch in `batches` (inp.batch_per_replica is ignored);
    `fixed`: its fixed_parts(inp, links), when the caller has them already."""
    accel, lay = inp.rack.accelerator, inp.layout
    fixed = fixed or fixed_parts(inp, links)
    ctx, model, pf, prefill_step = fixed.ctx, fixed.model, fixed.pf, fixed.prefill_step
    prefill_latency, prefill_rate, hit_latency = fixed.prefill_latency_s, fixed.prefill_tokens_per_s, fixed.cache_hit_latency_s
    batches = np.asarray(batches, dtype=float)
    rows = np.arange(len(batches))

    decode, touch, mixed, riders = _decode_and_mixed(ctx, batches)
    decode_totals = _totals(decode, inp, model)
    decode_slowest = np.argmax(decode_totals, axis=1)
    decode_tpot = lay.pp * decode_totals[rows, decode_slowest]
    passes_per_prompt = pf.passes_per_prompt
    weights_bytes, kv_bytes, activations_bytes = _memory(inp, fixed.memory_per_stage, pf.tokens, batches)

    serving = _serving_terms(ctx, decode, mixed, riders, pf)
    totals = _totals(serving, inp, model)
    slowest = np.argmax(totals, axis=1)
    stage_time = totals[rows, slowest]
    tpot = lay.pp * stage_time
    queue, ttft, requests_per_s = _queue_and_ttft(inp, batches, stage_time, tpot, passes_per_prompt * prefill_step.total_s,
                                                  prefill_rate, prefill_latency, hit_latency)
    cache_bytes, cache_fits, storage, cache_in_hbm = _prompt_cache(inp, requests_per_s)
    at = lambda a, idx: lay.pp * a[rows, idx]
    return BatchTable(
        batches=batches, compute_s=at(decode.compute, decode_slowest), weights_s=at(decode.weights, decode_slowest),
        kv_s=at(decode.kv, decode_slowest), comm_s=at(decode.comm, decode_slowest), overhead_s=at(decode.overhead, decode_slowest),
        tpot_low_s=tpot * serving.low_ratio[rows, slowest], tpot_high_s=tpot * serving.high_ratio[rows, slowest],
        decode_low_ratio=decode.low_ratio[rows, decode_slowest], decode_high_ratio=decode.high_ratio[rows, decode_slowest],
        stage_time_s=stage_time, tpot_s=tpot, ttft_s=ttft, queue_s=queue, decode_tokens_per_s=batches / decode_tpot,
        serving_step=tuple(at(term, slowest) for term in serving.as_tuple()), prefill_riders=riders,
        cache_bytes=cache_bytes, cache_in_hbm=cache_in_hbm, cache_fits=cache_fits, storage_usd_per_s=storage, touch=touch,
        weights_bytes=weights_bytes, kv_bytes=kv_bytes, activations_bytes=activations_bytes, capacity_bytes=accel.hbm_capacity_bytes,
        prefill_step=prefill_step, prefill_latency_s=prefill_latency, cache_hit_latency_s=hit_latency,
        prefill_tokens_per_s=prefill_rate, chunk_tokens=pf.tokens, flops_per_s=ctx.flops_per_s,
        hbm_bandwidth_bytes_per_s=ctx.hbm_bytes_per_s, step_model=model, kernel_source=ctx.rates.source if ctx.calibrated else "",
        input_tokens=inp.input_tokens, output_tokens=inp.output_tokens, role=inp.role,
    )
