"""What both step models share: the step context of one deployment, the step terms they return,
and the parts of a forward pass written once for both (the experts a batch touches, the collectives
over the graph's links, the pipeline hand-off, the KV and expert bytes a step reads).

Arrays have shape (n_batches, pp); token counts come in as (n, 1).
"""

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from planner.hardware.kernels import KernelRates
from planner.model.architecture import ModelArch, kv_bytes_per_token_per_layer
from planner.modes import StepModel
from planner.physics.inputs import DeploymentInputs
from planner.physics.links import EffectiveLinks, ReplicaLinks
from planner.physics.memory import (
    kv_bytes_per_accelerator,
    kv_shard_fraction,
)
from planner.physics.roofline import (
    all_reduce_time_s,
    all_to_all_time_s,
    domains_per_token,
    expert_touch_fraction,
    point_to_point_time_s,
)
from planner.physics.stages import (
    Stages,
    attention_heads_per_rank,
    decode_context_per_layer,
)
from planner.precision import input_bytes_per_value, matmul_format

__all__ = ["ALL_REDUCES_PER_LAYER", "DISPATCH_AND_COMBINE", "ExchangeCopies", "StepContext", "StepTerms", "all_reduces_per_stage",
           "decode_kv_bytes", "exchange_copies", "moe_exchange", "pp_send", "roofline_all_reduces", "roofline_comm", "roofline_exchange",
           "stage_domains", "touch_fraction"]

ALL_REDUCES_PER_LAYER = 2  # after attention and after the MLP (Megatron-style tensor parallelism)
DISPATCH_AND_COMBINE = 2  # an expert all-to-all goes out (dispatch) and comes back (combine)


_KEPT: dict[tuple, tuple] = {}
KEPT_ENTRIES = 8192  # what several contexts share (`StepContext.shared`); emptied when full


def _kept(kind: str, anchors: tuple, values: tuple, build):
    """`build()` kept under `kind`, the identities of the catalog objects `anchors` (held by the
    entry, so that no other object takes their ids while it lives) and the hashable `values`."""
    key = (kind, values, *map(id, anchors))
    hit = _KEPT.get(key)
    if hit is None:
        if len(_KEPT) >= KEPT_ENTRIES:
            _KEPT.clear()
        hit = _KEPT[key] = (anchors, build())
    return hit[1]


def _read_only(value):
    """`value` (an array, or a tuple of arrays and other values) with its arrays made read only."""
    for a in value if isinstance(value, tuple) else (value,):
        if isinstance(a, np.ndarray):
            a.setflags(write=False)
    return value


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
    # batch-dependent kernel times shared by the contexts of one enumeration (`reused`; None: not kept)
    reuse: dict | None = field(default=None, compare=False, repr=False)
    # what the step's kernels need that depends on this context alone, kept by the functions that
    # build it (`memo`): every batch of every table of the context reuses it
    cache: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # the curves bound to this deployment's attention heads per rank (prefill attention needs them)
        if self.rates is not None and self.rates.heads is None:
            heads = attention_heads_per_rank(self.inp.arch, self.inp.layout.tp)
            object.__setattr__(self, "rates", _kept("heads", (self.rates,), heads, lambda: self.rates.with_heads(heads)))

    def memo(self, key, build):
        """`build()` for this context, computed on first use and kept."""
        value = self.cache.get(key)
        if value is None:
            value = self.cache[key] = build()
        return value

    def shared(self, kind: tuple, values, build):
        """`build()` kept for every context on the same model, accelerator, overheads and kernel curves
        (the same catalog objects) with equal formats and `values()` (what else `build` reads), and kept
        by this context under `kind` (the bundle and what varies between its calls on one context)."""
        hit = self.cache.get(kind)
        if hit is None:
            inp = self.inp
            hit = self.cache[kind] = _kept(kind, (inp.arch, inp.rack.accelerator, inp.overheads, self.rates), (inp.precisions, *values()),
                                           build)
        return hit

    def reused(self, kind: tuple, rows: tuple, build):
        """`build()`, a kernel class's times at `rows` (arrays), kept in `reuse` for every context of one
        enumeration on the same model, accelerator, overheads and kernel curves (the same catalog
        objects) with equal formats, equal `kind` (what else `build` reads, by value) and `rows` of the
        same exact contents: layouts that differ only where `build` does not look (the dense GEMMs,
        attention and all-reduces of layouts that differ in expert parallelism) share one evaluation.
        The arrays kept are made read only."""
        if self.reuse is None:
            return build()
        inp = self.inp
        key = (kind, inp.precisions, id(inp.arch), id(inp.rack.accelerator), id(inp.overheads), id(self.rates),
               *((None,) if a is None else (a.dtype.str, a.shape, a.tobytes()) for a in rows))
        hit = self.reuse.get(key)
        if hit is None:  # the catalog objects are held by the entry, so that no other object takes their ids meanwhile
            hit = self.reuse[key] = ((inp.arch, inp.rack.accelerator, inp.overheads, self.rates), _read_only(build()))
        return hit[1]

    @property
    def calibrated(self) -> bool:
        return self.inp.step_model is StepModel.CALIBRATED and self.rates is not None


class StepTerms(NamedTuple):  # a tuple: made a few dozen times per table, for speed
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


def touch_fraction(arch: ModelArch, tokens: np.ndarray) -> np.ndarray:
    if not arch.is_moe:
        return np.zeros_like(tokens)
    return expert_touch_fraction(tokens, arch.moe.experts_per_token, arch.moe.n_routed_experts)


def moe_exchange(ctx: StepContext) -> bool:
    """Whether a MoE layer exchanges tokens between ranks: only when its attention ranks hold different
    tokens (attention data parallelism). With attention tensor-parallel (dp_attn = 1) every rank
    already holds every token after the attention all-reduce, so each computes its own experts and
    the layer's all-reduce sums their outputs, as with a dense MLP (TensorRT-LLM sets up no MoE
    communication without attention DP: `CommunicationFactory.create_strategy`; vLLM and SGLang
    all-reduce expert-parallel layers under tensor parallelism likewise)."""
    lay, arch = ctx.inp.layout, ctx.inp.arch
    return arch.is_moe and lay.dp_attn > 1


def roofline_comm(ctx: StepContext, tokens_per_rank: np.ndarray, tokens_per_stage: np.ndarray, prefill: bool = False) -> np.ndarray:
    """Per-stage communication of one forward pass over the graph's links: TP all-reduces, the MoE
    token exchange (`roofline_exchange`; a prefill pass's forwards inside domains), the hand-off to
    the next stage.

    The MoE exchange is needed whenever a MoE layer mixes tokens of several attention ranks
    (`moe_exchange`). Each token goes to its k experts' ranks
    (docs/physics.md: B * k * d * b_a per layer), or with ep = 1 once to every rank, and reaches all
    `expert_tp` accelerators of each. It replaces the MoE layer's MLP all-reduce."""
    comm = roofline_all_reduces(ctx, tokens_per_rank)
    if moe_exchange(ctx):
        comm = comm + roofline_exchange(ctx, tokens_per_stage, once_per_domain=prefill)
    return comm + pp_send(ctx, tokens_per_stage)


def all_reduces_per_stage(ctx: StepContext) -> np.ndarray:
    """Tensor-parallel all-reduces of a stage's forward pass (the MoE exchange replaces a MoE layer's second)."""
    st = ctx.st
    return ALL_REDUCES_PER_LAYER * st.n_layers - (st.n_moe_layers if moe_exchange(ctx) else 0)


def roofline_all_reduces(ctx: StepContext, tokens_per_rank: np.ndarray) -> np.ndarray:
    inp, eff = ctx.inp, ctx.eff
    message = tokens_per_rank * inp.arch.hidden_size * inp.precisions.activation_bytes
    return all_reduces_per_stage(ctx) * all_reduce_time_s(message, inp.layout.tp, eff.tp_bytes_per_s, eff.latency_s)


def stage_domains(ctx: StepContext) -> int:
    """Scale-up domains one pipeline stage spans."""
    return -(-ctx.inp.layout.stage_size // ctx.inp.rack.n_accelerators) if ctx.links.stage.spans_domains else 1


class ExchangeCopies(NamedTuple):
    """Copies of one token an expert all-to-all sends to other accelerators of its stage: `local` inside
    the sender's scale-up domain, `remote` across the scale-out network."""

    local: float
    remote: float


def exchange_copies(ctx: StepContext, once_per_domain: bool) -> ExchangeCopies:
    """Each token goes to its k experts (with ep = 1 once to every rank), the experts spread evenly
    over the stage's S accelerators in D domains: k (S-1)/S copies leave the sender, k (D-1)/D of them
    for another domain. With `once_per_domain` a token crosses the scale-out network once per remote
    domain that holds one of its experts and is forwarded inside it (DeepEP's normal mode; the least
    traffic that reaches every expert): domains_per_token(k, D) (D-1)/D crossings, group-limited routing
    capping the domains where the placement keeps expert groups inside them."""
    inp = ctx.inp
    arch, lay = inp.arch, inp.layout
    copies = arch.moe.experts_per_token if lay.ep > 1 else 1
    domains = stage_domains(ctx)
    crossing = copies * (domains - 1) / domains
    local = copies * (lay.stage_size - 1) / lay.stage_size - crossing
    if once_per_domain and domains > 1:
        groups = (arch.moe.expert_groups, arch.moe.groups_per_token) if inp.expert_groups_local else (1, 1)
        crossing = domains_per_token(copies, domains, *groups) * (domains - 1) / domains
    return ExchangeCopies(local, crossing)


def roofline_exchange(ctx: StepContext, tokens_per_stage: np.ndarray, once_per_domain: bool) -> np.ndarray:
    """Dispatch and combine of every MoE layer over the graph's links, in the least bytes: tokens go out
    in the format the expert GEMMs read (`matmul_format`) where that is narrower than the activations,
    and come back in the activations' format. The copies inside a domain move over its scale-up links
    while those for other domains cross the scale-out network (injection and bisection bound), at the
    same time. `once_per_domain` (a prefill pass): a token crosses once per remote domain
    its experts sit in and is forwarded inside it (`exchange_copies`; DeepEP's normal kernels); a decode
    step sends every copy directly, as low-latency kernels do to save the forwarding hop."""
    inp, eff, lay, arch = ctx.inp, ctx.eff, ctx.inp.layout, ctx.inp.arch
    x = exchange_copies(ctx, once_per_domain)
    tokens = tokens_per_stage / lay.stage_size * lay.expert_tp * inp.expert_imbalance
    prec = inp.precisions
    activation_bytes, expert_input = prec.activation_bytes, matmul_format(prec.compute, prec.expert_weights or prec.weights)
    total = 0.0 * tokens_per_stage
    for value_bytes in (min(activation_bytes, input_bytes_per_value(expert_input)), activation_bytes):
        per_copy = arch.hidden_size * value_bytes
        if x.remote > 0:
            across = all_to_all_time_s(tokens * x.remote * per_copy, lay.stage_size, eff.stage_injection_bytes_per_s,
                                       eff.stage_bisection_bytes_per_s, eff.latency_s)
            total = total + np.maximum(across, tokens * x.local * per_copy / inp.rack.accelerator.achievable_scale_up_bytes_per_s)
        else:
            total = total + all_to_all_time_s(tokens * x.local * per_copy, lay.stage_size, eff.stage_injection_bytes_per_s,
                                              eff.stage_bisection_bytes_per_s, eff.latency_s)
    return ctx.st.n_moe_layers * total


def pp_send(ctx: StepContext, tokens_per_stage: np.ndarray) -> np.ndarray:
    lay = ctx.inp.layout
    if lay.pp == 1:
        return 0.0 * tokens_per_stage * np.ones((1, 1))
    hidden_bytes = ctx.inp.arch.hidden_size * ctx.inp.precisions.activation_bytes
    send = point_to_point_time_s(tokens_per_stage * hidden_bytes, ctx.eff.pp_bytes_per_s, ctx.eff.latency_s)
    return np.where(np.arange(lay.pp) == lay.pp - 1, 0.0, send)


def decode_kv_bytes(ctx: StepContext, per_rank: np.ndarray) -> np.ndarray:
    inp = ctx.inp
    context = decode_context_per_layer(inp.arch, inp.input_tokens, inp.output_tokens)
    per_sequence = ctx.st.per_stage(kv_bytes_per_token_per_layer(inp.arch, inp.precisions.kv_bytes) * context)
    return kv_bytes_per_accelerator(per_rank, per_sequence, kv_shard_fraction(inp.arch, inp.layout.tp))
