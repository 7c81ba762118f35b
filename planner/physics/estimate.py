"""Evaluate one fixed deployment: decode and prefill step times, TPOT, TTFT, HBM use and cost.

Step 1 splits the model's layers into pipeline stages and sums per-layer quantities per stage.
Step 2 evaluates the decode step and a prefill chunk of every stage with the roofline terms.
Step 3 takes the slowest stage, then derives latencies, throughputs, memory and cost.
"""

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from planner.hardware.catalog import Overheads, RackType
from planner.model.architecture import (
    ModelArch,
    attention_flops_per_context_token,
    kv_bytes_per_sequence,
    kv_bytes_per_token_per_layer,
    layer_params,
    layer_windows,
    param_counts,
)
from planner.modes import OverlapPolicy, ServingRole
from planner.physics.cost import usd_per_million_tokens
from planner.physics.deployment import Layout, Precisions, stage_of_layer
from planner.physics.kv_cache import CacheUse, cached_bytes, reload_s
from planner.physics.links import (
    EffectiveLinks,
    ReplicaLinks,
    default_replica_links,
    effective_links,
)
from planner.physics.memory import (
    MemoryUse,
    activation_bytes_per_accelerator,
    kv_bytes_per_accelerator,
    kv_shard_fraction,
    weight_bytes_per_accelerator,
)
from planner.physics.roofline import (
    StepTime,
    all_reduce_time_s,
    all_to_all_time_s,
    causal_attention_pairs,
    compute_time_s,
    expert_touch_fraction,
    matmul_flops,
    memory_time_s,
    point_to_point_time_s,
    step_total_s,
)
from planner.units import GB, SECONDS_PER_HOUR, TB, TFLOP, US

__all__ = ["DEFAULT_PREFILL_CHUNK_TOKENS", "BatchTable", "DeploymentInputs", "Estimate", "estimate", "evaluate_batches"]

WORST_CASE_QUEUE_DEPARTURES = 2  # claim 3: a request waits at most about two batch departures
DEFAULT_PREFILL_CHUNK_TOKENS = 8192  # tokens per prefill forward pass (serving engines' chunked-prefill budget)
ALL_REDUCES_PER_LAYER = 2  # after attention and after the MLP (Megatron-style tensor parallelism)
DISPATCH_AND_COMBINE = 2  # an expert all-to-all goes out (dispatch) and comes back (combine)


@dataclass(frozen=True)
class DeploymentInputs:
    """Everything one replica's evaluation needs."""

    arch: ModelArch
    rack: RackType
    layout: Layout
    batch_per_replica: int
    input_tokens: int
    output_tokens: int
    precisions: Precisions
    overheads: Overheads
    overlap: OverlapPolicy = OverlapPolicy.SERIAL
    prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS
    notes: tuple[str, ...] = ()  # extra assumptions to state (precision fall-backs, ...)
    expert_imbalance: float = 1.0  # hottest expert-parallel rank's load over the mean (from the expert placement)
    redundant_experts_per_rank: int = 0  # extra expert copies each expert-parallel rank holds
    role: ServingRole = ServingRole.AGGREGATED
    prefix_cache: CacheUse | None = None  # prompt caching in a KV tier (claim 9)

    @property
    def prefilled_tokens(self) -> float:
        """Prompt tokens a request needs computed on average: cache hits skip their prefix."""
        if self.prefix_cache is None:
            return float(self.input_tokens)
        return self.input_tokens - self.prefix_cache.hit_rate * self.prefix_cache.prefix_tokens

    @property
    def expert_slot_factor(self) -> float:
        """Expert weights an accelerator holds relative to an even split without redundant copies."""
        if not self.arch.is_moe or self.layout.ep == 1:
            return 1.0
        return 1.0 + self.redundant_experts_per_rank * self.layout.ep / self.arch.moe.n_routed_experts


@dataclass(frozen=True)
class Estimate:
    """The figures of one deployment. Times in seconds, bytes, USD."""

    inputs: DeploymentInputs
    links: ReplicaLinks
    decode_step: StepTime  # a pure decode step, all pipeline stages (the TPOT of a decode-only replica)
    prefill_chunk_step: StepTime  # one prefill chunk through the slowest stage
    serving_step: StepTime  # the step users wait on: mixed decode + prefill for an aggregated replica (sums to TPOT)
    tpot_s: float
    stage_time_s: float
    prefill_latency_s: float  # the whole prompt (a cache miss)
    queue_wait_s: float  # the rest of TTFT: 2 departures (aggregated), the prompt ahead (prefill), the next step (decode)
    cache_hit_latency_s: float  # a prompt-cache hit: reload its prefix and prefill the rest (0 without a cache)
    ttft_s: float
    decode_tokens_per_s: float  # per replica, decode alone (batch / pure decode step)
    prefill_tokens_per_s: float  # per replica, prefill alone (chunks back to back)
    sustained_output_tokens_per_s: float  # per replica in its role (an aggregated replica also prefills)
    sustained_input_tokens_per_s: float
    prefill_riders_per_step: float  # prompt tokens prefilled in each micro-batch step on each stage (aggregated)
    prompt_cache_bytes_per_accelerator: float  # in the cache's tier (HBM: counted in `memory`)
    storage_usd_per_hour: float  # holding the prompt cache outside HBM
    memory: MemoryUse
    expert_touch_fraction: float
    flops_per_s_effective: float
    hbm_bandwidth_bytes_per_s_effective: float
    assumptions: tuple[str, ...] = field(default_factory=tuple)

    @property
    def n_accelerators(self) -> int:
        return self.inputs.layout.n_accelerators

    @property
    def usd_per_hour(self) -> float:
        """The replica's accelerators plus any prompt cache held outside HBM."""
        return self.inputs.rack.accelerator.price_usd_per_hour * self.n_accelerators + self.storage_usd_per_hour

    @property
    def output_tokens_per_s_per_accelerator(self) -> float:
        """Sustained output tokens per second per accelerator in the replica's role."""
        return self.sustained_output_tokens_per_s / self.n_accelerators

    @property
    def usd_per_million_output_tokens(self) -> float:
        return usd_per_million_tokens(self.usd_per_hour / SECONDS_PER_HOUR, self.decode_tokens_per_s)

    @property
    def usd_per_million_input_tokens(self) -> float:
        return usd_per_million_tokens(self.usd_per_hour / SECONDS_PER_HOUR, self.prefill_tokens_per_s)

    @property
    def replica_seconds_per_request(self) -> float:
        """Replica time one request takes in this replica's role."""
        if self.inputs.role is ServingRole.PREFILL:
            return self.inputs.prefilled_tokens / self.prefill_tokens_per_s
        return self.inputs.output_tokens / self.sustained_output_tokens_per_s

    @property
    def usd_per_million_output_tokens_all_in(self) -> float:
        """Replica cost per output token of its workload: per token it makes (an aggregated replica's
        prefill included), or for a prefill replica per token its prompts go on to produce."""
        tokens = self.inputs.output_tokens / self.replica_seconds_per_request
        return usd_per_million_tokens(self.usd_per_hour / SECONDS_PER_HOUR, tokens)

    @property
    def requests_per_s(self) -> float:
        return 1.0 / self.replica_seconds_per_request

    @property
    def usd_per_request(self) -> float:
        return self.usd_per_hour / SECONDS_PER_HOUR * self.replica_seconds_per_request

    @property
    def fits(self) -> bool:
        return self.memory.fits


@dataclass(frozen=True)
class _Stages:
    """Per-stage sums, arrays of shape (pp,)."""

    n_layers: np.ndarray
    n_moe_layers: np.ndarray
    dense_params: np.ndarray  # attention, dense MLPs, shared experts, routers, norms
    head_params: np.ndarray  # the LM head matmul (last stage)
    vocab_params_stored: np.ndarray  # embedding table (first stage); final norm and untied LM head (last stage)
    routed_total_params: np.ndarray
    routed_active_params: np.ndarray
    layer_to_stage: np.ndarray

    def per_stage(self, per_layer: np.ndarray) -> np.ndarray:
        return np.bincount(self.layer_to_stage, weights=per_layer, minlength=len(self.n_layers))


@functools.lru_cache(maxsize=256)
def _stages(arch: ModelArch, pp: int) -> _Stages:
    layer_to_stage = stage_of_layer(arch.n_layers, pp)
    per = lambda values: np.bincount(layer_to_stage, weights=values, minlength=pp)
    params = layer_params(arch)
    counts = param_counts(arch)
    first, last = np.arange(pp) == 0, np.arange(pp) == pp - 1
    separate_head = not counts.tied or pp > 1  # a tied head on a later stage needs its own copy
    return _Stages(
        n_layers=per(np.ones(arch.n_layers)),
        n_moe_layers=per(np.array(arch.layer_is_moe, dtype=float)),
        dense_params=per(params.dense),
        head_params=np.where(last, counts.lm_head, 0.0),
        vocab_params_stored=np.where(first, counts.embedding, 0.0)
        + np.where(last, counts.final_norm + (counts.lm_head if separate_head else 0.0), 0.0),
        routed_total_params=per(params.routed_total),
        routed_active_params=per(params.routed_active),
        layer_to_stage=layer_to_stage,
    )


def _comm_s(inp: DeploymentInputs, st: _Stages, eff: EffectiveLinks, tokens_per_rank: np.ndarray, tokens_per_stage: np.ndarray) -> np.ndarray:
    """Per-stage communication of one forward pass: TP all-reduces, the MoE token exchange, the
    hand-off to the next stage. Token counts have shape (n, 1); the result (n, pp).

    The MoE exchange is needed whenever a MoE layer mixes tokens of several attention ranks or
    spreads experts over ranks (ep > 1 or dp_attn > 1). Each token goes to its k experts' ranks
    (docs/physics.md: B * k * d * b_a per layer), or with ep = 1 once to every rank, and reaches all
    `expert_tp` accelerators of each; (n-1)/n of the copies leave their sender. It replaces the MoE
    layer's MLP all-reduce."""
    lay, arch, act = inp.layout, inp.arch, inp.precisions.activation_bytes
    hidden_bytes = arch.hidden_size * act
    moe_exchange = arch.is_moe and (lay.ep > 1 or lay.dp_attn > 1)
    n_all_reduce = ALL_REDUCES_PER_LAYER * st.n_layers - (st.n_moe_layers if moe_exchange else 0)
    comm = n_all_reduce * all_reduce_time_s(tokens_per_rank * hidden_bytes, lay.tp, eff.tp_bytes_per_s, eff.latency_s)
    if moe_exchange:
        copies = arch.moe.experts_per_token if lay.ep > 1 else 1
        remote = (lay.stage_size - 1) / lay.stage_size
        per_member = tokens_per_stage / lay.stage_size * copies * lay.expert_tp * hidden_bytes * remote * inp.expert_imbalance
        one_way = all_to_all_time_s(per_member, lay.stage_size, eff.stage_injection_bytes_per_s, eff.stage_bisection_bytes_per_s, eff.latency_s)
        comm = comm + st.n_moe_layers * DISPATCH_AND_COMBINE * one_way
    if lay.pp > 1:
        send = point_to_point_time_s(tokens_per_stage * hidden_bytes, eff.pp_bytes_per_s, eff.latency_s)
        comm = comm + np.where(np.arange(lay.pp) == lay.pp - 1, 0.0, send)
    return comm * np.ones((1, lay.pp))


def _touch(arch: ModelArch, tokens: np.ndarray) -> np.ndarray:
    if not arch.is_moe:
        return np.zeros_like(tokens)
    return expert_touch_fraction(tokens, arch.moe.experts_per_token, arch.moe.n_routed_experts)


def _decode_terms(inp: DeploymentInputs, st: _Stages, eff: EffectiveLinks, flops_per_s: float, bw: float,
                  batches: np.ndarray, riders: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """Roofline terms of one decode micro-batch step, shape (n_batches, pp), and the touch fraction.
    `riders` (n_batches,): prefill tokens travelling in the same step on each stage; they widen the
    set of experts touched and the collectives (their own FLOPs and KV reads are added by the caller)."""
    arch, lay, prec = inp.arch, inp.layout, inp.precisions
    micro_batch = (batches / lay.pp)[:, None]
    per_rank = micro_batch / lay.dp_attn
    extra = np.zeros_like(micro_batch) if riders is None else riders[:, None]
    mean_context = inp.input_tokens + inp.output_tokens / 2
    windows = layer_windows(arch)
    attention = st.per_stage(attention_flops_per_context_token(arch, absorbed=True) * np.minimum(mean_context, windows))
    flops = (matmul_flops(st.dense_params + st.head_params, per_rank) + attention * per_rank) / lay.tp
    flops = flops + matmul_flops(st.routed_active_params, micro_batch) / lay.stage_size * inp.expert_imbalance
    touch = _touch(arch, micro_batch + extra)
    weights = weight_bytes_per_accelerator(st.dense_params + st.head_params, st.routed_total_params * touch * inp.expert_slot_factor,
                                           lay.tp, lay.stage_size, prec.weight_bytes, prec.expert_weight_bytes)
    kv = kv_bytes_per_accelerator(per_rank, st.per_stage(kv_bytes_per_sequence(arch, mean_context, prec.kv_bytes)),
                                  kv_shard_fraction(arch, lay.tp))
    comm = _comm_s(inp, st, eff, per_rank + extra / lay.dp_attn, micro_batch + extra)
    return compute_time_s(flops, flops_per_s), memory_time_s(weights, bw), memory_time_s(kv, bw), comm, touch[:, 0]


def _prefill_stages(inp: DeploymentInputs, st: _Stages, eff: EffectiveLinks, flops_per_s: float, bw: float) -> tuple[list[StepTime], int, int]:
    """Roofline terms of one prefill chunk per attention rank on every stage; chunk size, chunks."""
    arch, lay, prec = inp.arch, inp.layout, inp.precisions
    prompt = inp.input_tokens
    chunk = min(inp.prefill_chunk_tokens, prompt)
    n_chunks = math.ceil(prompt / chunk)
    per_stage_tokens = np.array([[chunk * lay.dp_attn]], dtype=float)
    windows = layer_windows(arch)
    pairs = st.per_stage(attention_flops_per_context_token(arch, absorbed=False) * causal_attention_pairs(prompt, windows)) / n_chunks
    flops = (matmul_flops(st.dense_params, chunk) + matmul_flops(st.head_params, 1) + pairs) / lay.tp
    flops = flops + matmul_flops(st.routed_active_params, per_stage_tokens[0]) / lay.stage_size * inp.expert_imbalance
    touch = _touch(arch, per_stage_tokens[0])
    weights = weight_bytes_per_accelerator(st.dense_params + st.head_params, st.routed_total_params * touch * inp.expert_slot_factor,
                                           lay.tp, lay.stage_size, prec.weight_bytes, prec.expert_weight_bytes)
    mean_prior_context = (prompt - chunk) / 2  # a chunk reads the cache of the chunks before it
    kv_tokens = chunk + np.minimum(mean_prior_context, windows)
    kv = st.per_stage(kv_bytes_per_token_per_layer(arch, prec.kv_bytes) * kv_tokens) * kv_shard_fraction(arch, lay.tp)
    comm = _comm_s(inp, st, eff, np.array([[float(chunk)]]), per_stage_tokens)[0]
    steps = [StepTime(float(c), float(w), float(k), float(m), inp.overlap) for c, w, k, m in
             zip(compute_time_s(flops, flops_per_s), memory_time_s(weights, bw), memory_time_s(kv, bw), comm)]
    return steps, chunk, n_chunks


def _memory(inp: DeploymentInputs, st: _Stages, chunk: int, batches: np.ndarray) -> tuple[np.ndarray, ...]:
    """HBM use of the fullest stage's accelerators for each batch: weights, KV, activations (n,).
    A prefill replica's batch is the prompts it holds (being computed or awaiting their hand-off)."""
    arch, lay, prec = inp.arch, inp.layout, inp.precisions
    per_rank = (batches / lay.dp_attn)[:, None]
    weights = weight_bytes_per_accelerator(st.dense_params + st.vocab_params_stored, st.routed_total_params * inp.expert_slot_factor,
                                           lay.tp, lay.stage_size, prec.weight_bytes, prec.expert_weight_bytes) * np.ones_like(per_rank)
    max_context = inp.input_tokens + (0 if inp.role is ServingRole.PREFILL else inp.output_tokens)
    kv = kv_bytes_per_accelerator(per_rank, st.per_stage(kv_bytes_per_sequence(arch, max_context, prec.kv_bytes)),
                                  kv_shard_fraction(arch, lay.tp))
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
    serving_step: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # the role's step terms x pp (compute, weights, kv, comm)
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
    prefill_step: StepTime
    prefill_latency_s: float
    cache_hit_latency_s: float  # a cache hit: reload its prefix, prefill the rest (0 without a prompt cache)
    prefill_tokens_per_s: float
    chunk_tokens: int
    flops_per_s: float
    hbm_bandwidth_bytes_per_s: float

    @property
    def used_bytes(self) -> np.ndarray:
        return self.weights_bytes + self.kv_bytes + self.activations_bytes + (self.cache_bytes if self.cache_in_hbm else 0.0)

    @property
    def fits(self) -> np.ndarray:
        return (self.used_bytes <= self.capacity_bytes) & self.cache_fits

    input_tokens: int
    output_tokens: int
    role: ServingRole = ServingRole.AGGREGATED

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


def evaluate_batches(inp: DeploymentInputs, batches, links: ReplicaLinks | None = None) -> BatchTable:
    """Evaluate `inp`'s layout at every batch in `batches` (inp.batch_per_replica is ignored)."""
    accel, lay = inp.rack.accelerator, inp.layout
    links = links or default_replica_links(inp.rack, lay, inp.overheads.collective_latency_s)
    eff = effective_links(links, accel)
    fmt = inp.precisions.compute
    flops_per_s = accel.dense_flops_per_s[fmt] * accel.compute_fraction_by_format[fmt]
    bw = accel.hbm_bandwidth_bytes_per_s * accel.hbm_bandwidth_fraction
    st = _stages(inp.arch, lay.pp)
    batches = np.asarray(batches, dtype=float)

    rows = np.arange(len(batches))
    compute, weights, kv, comm, touch = _decode_terms(inp, st, eff, flops_per_s, bw, batches)
    decode_totals = step_total_s(compute, weights, kv, comm, inp.overlap)
    decode_slowest = np.argmax(decode_totals, axis=1)
    decode_tpot = lay.pp * decode_totals[rows, decode_slowest]
    prefill, chunk, n_chunks = _prefill_stages(inp, st, eff, flops_per_s, bw)
    slowest_chunk = max(prefill, key=lambda step: step.total_s)
    prefill_latency = (n_chunks + lay.pp - 1) * slowest_chunk.total_s
    prefill_rate = chunk * lay.dp_attn / slowest_chunk.total_s
    weights_bytes, kv_bytes, activations_bytes = _memory(inp, st, chunk, batches)

    riders = np.zeros_like(batches)
    serving = (compute, weights, kv, comm)
    if inp.role is ServingRole.AGGREGATED:
        # Mixed batches: every micro-batch step also prefills its share of the prompts, batch x
        # (prompt tokens computed / output tokens) per replica step, at the per-token cost of a
        # prefill chunk on each stage. Their FLOPs add to compute; they share the weight fetch.
        riders = batches / lay.pp * inp.prefilled_tokens / inp.output_tokens
        per_chunk = (riders / (chunk * lay.dp_attn))[:, None]
        m_compute, m_weights, m_kv, m_comm, _ = _decode_terms(inp, st, eff, flops_per_s, bw, batches, riders)
        serving = (m_compute + per_chunk * np.array([step.compute_s for step in prefill]), m_weights,
                   m_kv + per_chunk * np.array([step.kv_s for step in prefill]), m_comm)
    totals = step_total_s(*serving, inp.overlap)
    slowest = np.argmax(totals, axis=1)
    stage_time = totals[rows, slowest]
    tpot = lay.pp * stage_time
    if inp.role is ServingRole.PREFILL:
        # a prompt waits for the one ahead of it, then runs its chunks through the stages
        queue = n_chunks * slowest_chunk.total_s + 0.0 * batches
        requests_per_s = np.full_like(batches, prefill_rate / inp.prefilled_tokens)
    elif inp.role is ServingRole.DECODE:
        queue = 0.0 * batches
        requests_per_s = batches / tpot / inp.output_tokens
    else:
        queue = WORST_CASE_QUEUE_DEPARTURES * stage_time
        requests_per_s = batches / tpot / inp.output_tokens
    cache_bytes, cache_fits, storage, cache_in_hbm = _prompt_cache(inp, requests_per_s)
    hit_latency = _cache_hit_latency(inp, prefill_latency)
    if inp.role is ServingRole.DECODE:
        queue = stage_time  # a request that arrives with its KV cache joins the next step
        ttft = stage_time
    else:
        ttft = queue + _worst_prefill_latency(inp, prefill_latency, hit_latency)
    return BatchTable(
        batches=batches,
        compute_s=lay.pp * compute[rows, decode_slowest],
        weights_s=lay.pp * weights[rows, decode_slowest],
        kv_s=lay.pp * kv[rows, decode_slowest],
        comm_s=lay.pp * comm[rows, decode_slowest],
        stage_time_s=stage_time,
        tpot_s=tpot,
        ttft_s=ttft,
        queue_s=queue,
        decode_tokens_per_s=batches / decode_tpot,
        serving_step=tuple(lay.pp * term[rows, slowest] for term in serving),
        prefill_riders=riders,
        cache_bytes=cache_bytes,
        cache_in_hbm=cache_in_hbm,
        cache_fits=cache_fits,
        storage_usd_per_s=storage,
        touch=touch,
        weights_bytes=weights_bytes,
        kv_bytes=kv_bytes,
        activations_bytes=activations_bytes,
        capacity_bytes=accel.hbm_capacity_bytes,
        prefill_step=slowest_chunk,
        prefill_latency_s=prefill_latency,
        cache_hit_latency_s=hit_latency,
        prefill_tokens_per_s=prefill_rate,
        chunk_tokens=chunk,
        flops_per_s=flops_per_s,
        hbm_bandwidth_bytes_per_s=bw,
        input_tokens=inp.input_tokens,
        output_tokens=inp.output_tokens,
        role=inp.role,
    )


def _role_note(inp: DeploymentInputs, chunk: int) -> str:
    if inp.role is ServingRole.PREFILL:
        return (f"prefill-only replica: prompts in chunks of {chunk} tokens per attention rank, pipelined over {inp.layout.pp} "
                "stage(s); TTFT waits for the prompt ahead, then prefills; the KV cache leaves for a decode replica")
    if inp.role is ServingRole.DECODE:
        return "decode-only replica: requests arrive with their KV cache and join the next step; TPOT is the pure decode step"
    return (f"aggregated replica: prefill chunks ride in the decode steps ({inp.prefilled_tokens:g} prompt tokens per "
            f"{inp.output_tokens} output tokens), so TPOT includes their compute; TTFT = {WORST_CASE_QUEUE_DEPARTURES} "
            f"departures of queueing (worst case, claim 3) + prefill in chunks of {chunk} tokens per attention rank, "
            f"pipelined over {inp.layout.pp} stage(s)")


def _assumptions(inp: DeploymentInputs, chunk: int, touch: float, flops_per_s: float, bw: float, links: ReplicaLinks) -> tuple[str, ...]:
    accel, prec = inp.rack.accelerator, inp.precisions
    fmt = prec.compute
    notes = [
        (f"compute at {fmt} tensor-core rate x achievable fraction {accel.compute_fraction_by_format[fmt]:.3f} = "
        f"{flops_per_s / TFLOP:.0f} TFLOP/s per accelerator"),
        (f"HBM at {accel.hbm_bandwidth_fraction:.2f} of peak = {bw / TB:.2f} TB/s; scale-up links at "
        f"{accel.scale_up_bandwidth_fraction:.2f}, scale-out at {accel.scale_out_bandwidth_fraction:.2f} of peak"),
        (f"decode KV reads use the mean context {inp.input_tokens + inp.output_tokens / 2:g} tokens (input + output/2); "
        f"HBM reserves the full {inp.input_tokens + inp.output_tokens} tokens per sequence"),
        f"communication is {'overlapped with' if inp.overlap is OverlapPolicy.OVERLAPPED else 'added to'} the compute/memory roofline",
        _role_note(inp, chunk),
        f"price ${accel.price_usd_per_hour:.2f}/h per {accel.id} (estimate: {accel.price_basis})",
        ("the scale-out network is a non-blocking fabric; collectives pay "
        f"{links.latency_s / US:.0f} us fixed latency each"),
    ]
    notes.extend(inp.notes)
    if inp.prefix_cache is not None and inp.role is not ServingRole.DECODE:
        c = inp.prefix_cache
        notes.append(f"prompt cache: {c.hit_rate:.0%} of requests find their first {c.prefix_tokens} tokens in {c.tier.name}, kept "
                     f"{c.retention_s / 60:g} min after last use; misses write new entries (Little's law); hits reload at "
                     f"{c.tier.read_bytes_per_s_per_accelerator / GB:g} GB/s per accelerator"
                     + ("" if c.tier.in_hbm else f" and cost {c.tier.usd_per_byte_s * GB * SECONDS_PER_HOUR:.3g} USD per GB-hour held"))
    if inp.arch.is_moe:
        notes.append(f"a decode step touches {touch:.1%} of each MoE layer's experts (1-(1-k/E)^b, routing independent per token)")
        notes.append(f"expert load: the hottest expert-parallel rank carries {inp.expert_imbalance:.3f}x the mean"
                     + (f"; {inp.redundant_experts_per_rank} redundant expert copies per rank" if inp.redundant_experts_per_rank else ""))
    return tuple(notes)


def estimate(inp: DeploymentInputs, links: ReplicaLinks | None = None) -> Estimate:
    """Evaluate `inp`. Links default to a replica filling instances of `inp.rack` in order."""
    links = links or default_replica_links(inp.rack, inp.layout, inp.overheads.collective_latency_s)
    t = evaluate_batches(inp, [inp.batch_per_replica], links)
    return Estimate(
        inputs=inp,
        links=links,
        decode_step=StepTime(float(t.compute_s[0]), float(t.weights_s[0]), float(t.kv_s[0]), float(t.comm_s[0]), inp.overlap),
        prefill_chunk_step=t.prefill_step,
        serving_step=StepTime(*(float(term[0]) for term in t.serving_step), inp.overlap),
        tpot_s=float(t.tpot_s[0]),
        stage_time_s=float(t.stage_time_s[0]),
        prefill_latency_s=t.prefill_latency_s,
        queue_wait_s=float(t.queue_s[0]),
        cache_hit_latency_s=t.cache_hit_latency_s,
        ttft_s=float(t.ttft_s[0]),
        decode_tokens_per_s=float(t.decode_tokens_per_s[0]),
        prefill_tokens_per_s=t.prefill_tokens_per_s,
        sustained_output_tokens_per_s=float(t.sustained_output_tokens_per_s[0]),
        sustained_input_tokens_per_s=float(t.sustained_input_tokens_per_s[0]),
        prefill_riders_per_step=float(t.prefill_riders[0]),
        prompt_cache_bytes_per_accelerator=float(t.cache_bytes[0]),
        storage_usd_per_hour=float(t.storage_usd_per_s[0]) * SECONDS_PER_HOUR,
        memory=MemoryUse(float(t.weights_bytes[0]), float(t.kv_bytes[0]), float(t.activations_bytes[0]), t.capacity_bytes,
                         float(t.cache_bytes[0]) if t.cache_in_hbm else 0.0),
        expert_touch_fraction=float(t.touch[0]),
        flops_per_s_effective=t.flops_per_s,
        hbm_bandwidth_bytes_per_s_effective=t.hbm_bandwidth_bytes_per_s,
        assumptions=_assumptions(inp, t.chunk_tokens, float(t.touch[0]), t.flops_per_s, t.hbm_bandwidth_bytes_per_s, links),
    )
