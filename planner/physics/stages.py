"""A model's layers split into pipeline stages, with the per-stage sums every step term needs:
parameters, layer counts, GEMM kernels per forward pass, and widths of the elementwise work; and the
shapes the calibrated step model prices: every dense GEMM's (n, k) per tensor-parallel rank with its
count per stage, and the attention heads per rank."""

import functools
from dataclasses import dataclass

import numpy as np

from planner.hardware.kernels import HeadShape
from planner.model.architecture import (
    AttentionKind,
    ModelArch,
    chunked_layers,
    layer_params,
    layer_windows,
    param_counts,
)
from planner.physics.deployment import stage_of_layer
from planner.physics.memory import kv_shard_fraction
from planner.physics.roofline import chunked_attention_pairs

__all__ = ["ELEMENTWISE_OPS_PER_LAYER", "GEMMS_PER_ATTENTION", "GemmGroup", "GemmShape", "Stages", "attention_heads_per_rank",
           "decode_context_per_layer", "elementwise_bytes_per_token", "gemm_groups", "gemm_shapes", "stages", "window_groups"]

# Dense GEMM launches per layer (each a separate kernel with its own fixed time).
GEMMS_PER_ATTENTION = {AttentionKind.MLA: 4, AttentionKind.GQA: 2}  # MLA: q, kv-down, kv-up (absorbed), out; GQA: fused qkv, out
GEMMS_PER_MLP = 2  # fused gate-up, down
ADD_NORMS_PER_LAYER = 2  # residual add + RMSNorm before attention and before the MLP
ELEMENTWISE_OPS_PER_LAYER = ADD_NORMS_PER_LAYER + 1  # and one activation (gate x up)
ADD_NORM_BYTES_PER_HIDDEN = 8  # aiconfigurator's add+norm: 2 bytes x (2h in + 2h out) per token
ACTIVATION_BYTES_PER_WIDTH = 6  # read gate and up (2 x 2 bytes), write 2 bytes, per intermediate unit


@dataclass(frozen=True)
class Stages:
    """Per-stage sums, arrays of shape (pp,)."""

    n_layers: np.ndarray
    n_moe_layers: np.ndarray
    dense_params: np.ndarray  # attention, dense MLPs, shared experts, routers, norms
    head_params: np.ndarray  # the LM head matmul (last stage)
    vocab_params_stored: np.ndarray  # embedding table (first stage); final norm and untied LM head (last stage)
    routed_total_params: np.ndarray
    routed_active_params: np.ndarray
    gemm_kernels: np.ndarray  # dense GEMM launches per forward pass (attention, dense MLPs, shared experts, routers, head)
    activation_width: np.ndarray  # sum over layers of the dense or shared-expert intermediate width (elementwise work)
    is_first: np.ndarray
    is_last: np.ndarray
    layer_to_stage: np.ndarray

    def per_stage(self, per_layer: np.ndarray) -> np.ndarray:
        return np.bincount(self.layer_to_stage, weights=per_layer, minlength=len(self.n_layers))


def _gemm_kernels_per_layer(arch: ModelArch) -> np.ndarray:
    moe = np.array(arch.layer_is_moe, dtype=bool)
    attention = GEMMS_PER_ATTENTION.get(arch.attention.kind, 2)
    shared = GEMMS_PER_MLP if arch.is_moe and arch.moe.n_shared_experts else 0
    router = 1 if arch.is_moe else 0
    return np.where(moe, attention + shared + router, attention + GEMMS_PER_MLP).astype(float)


def _activation_width_per_layer(arch: ModelArch) -> np.ndarray:
    moe = np.array(arch.layer_is_moe, dtype=bool)
    shared = arch.moe.n_shared_experts * arch.moe.shared_expert_intermediate_size if arch.is_moe else 0
    return np.where(moe, shared, arch.dense_intermediate_size).astype(float)


@functools.lru_cache(maxsize=256)
def stages(arch: ModelArch, pp: int) -> Stages:
    layer_to_stage = stage_of_layer(arch.n_layers, pp)
    per = lambda values: np.bincount(layer_to_stage, weights=values, minlength=pp)
    params = layer_params(arch)
    counts = param_counts(arch)
    first, last = np.arange(pp) == 0, np.arange(pp) == pp - 1
    separate_head = not counts.tied or pp > 1  # a tied head on a later stage needs its own copy
    return Stages(
        n_layers=per(np.ones(arch.n_layers)),
        n_moe_layers=per(np.array(arch.layer_is_moe, dtype=float)),
        dense_params=per(params.dense),
        head_params=np.where(last, counts.lm_head, 0.0),
        vocab_params_stored=np.where(first, counts.embedding, 0.0)
        + np.where(last, counts.final_norm + (counts.lm_head if separate_head else 0.0), 0.0),
        routed_total_params=per(params.routed_total),
        routed_active_params=per(params.routed_active),
        gemm_kernels=per(_gemm_kernels_per_layer(arch)) + np.where(last, 1.0, 0.0),
        activation_width=per(_activation_width_per_layer(arch)),
        is_first=first,
        is_last=last,
        layer_to_stage=layer_to_stage,
    )


def elementwise_bytes_per_token(arch: ModelArch, st: Stages, tp: int, activation_bytes: float) -> np.ndarray:
    """Bytes the norms and activations of a stage move per token on one accelerator (pp,)."""
    scale = activation_bytes / 2  # the per-unit byte counts above are for 16-bit activations
    return scale * (st.n_layers * ADD_NORMS_PER_LAYER * ADD_NORM_BYTES_PER_HIDDEN * arch.hidden_size
                    + ACTIVATION_BYTES_PER_WIDTH * st.activation_width / tp)


@dataclass(frozen=True)
class GemmShape:
    """One dense GEMM of a forward pass on one tensor-parallel rank: n output and k input features,
    launches per pass on each stage (pp,), and whether engines run it in bf16 whatever the weights."""

    name: str
    n: float
    k: float
    count: np.ndarray
    bf16: bool = False


def _attention_gemms(arch: ModelArch, tp: int) -> list[tuple[str, float, float]]:
    """(name, n, k) of one layer's attention projections per rank. GQA: fused QKV (KV heads per rank as
    the cache holds them) and output. MLA (DeepSeek, as TensorRT-LLM runs it; aiconfigurator-core's
    deepseek model file): the fused q/kv down-projection, replicated on every rank, then q-up, kv-up
    (absorbed into the attention in decode, same FLOPs and bytes) and output, split by heads."""
    att, hidden = arch.attention, arch.hidden_size
    heads = att.n_heads / tp
    if att.kind is AttentionKind.GQA:
        kv_heads = att.n_kv_heads * kv_shard_fraction(arch, tp)
        return [("qkv", (heads + 2 * kv_heads) * att.head_dim, hidden), ("attention output", hidden, heads * att.head_dim)]
    qk_dim = att.qk_nope_head_dim + att.qk_rope_head_dim
    down = att.kv_lora_rank + att.qk_rope_head_dim + (att.q_lora_rank or 0)
    query = [("q up", heads * qk_dim, att.q_lora_rank)] if att.q_lora_rank else [("q", heads * qk_dim, hidden)]
    return [("q/kv down", down, hidden), *query, ("kv up", heads * (att.qk_nope_head_dim + att.v_head_dim), att.kv_lora_rank),
            ("attention output", hidden, heads * att.v_head_dim)]


@functools.lru_cache(maxsize=256)
def gemm_shapes(arch: ModelArch, pp: int, tp: int) -> tuple[GemmShape, ...]:
    """Every dense GEMM of a forward pass per tensor-parallel rank (aiconfigurator-core's model files
    list the same ones): attention projections, the gated MLP of dense layers (fused gate-up, down),
    the shared experts and the router (replicated, bf16) of MoE layers, the LM head (bf16) on the last
    stage. Routed experts are priced apart, as grouped GEMMs."""
    layer_to_stage = stage_of_layer(arch.n_layers, pp)
    per = lambda mask: np.bincount(layer_to_stage, weights=np.asarray(mask, dtype=float), minlength=pp)
    moe = np.array(arch.layer_is_moe, dtype=bool)
    hidden, every = arch.hidden_size, np.ones(arch.n_layers)
    shapes = [GemmShape(name, n, k, per(every)) for name, n, k in _attention_gemms(arch, tp)]
    if arch.dense_intermediate_size and (~moe).any():
        width = arch.dense_intermediate_size / tp
        shapes += [GemmShape("gate-up", 2 * width, hidden, per(~moe)), GemmShape("down", hidden, width, per(~moe))]
    if arch.moe is not None and moe.any():
        shared = arch.moe.n_shared_experts * arch.moe.shared_expert_intermediate_size / tp
        if shared:
            shapes += [GemmShape("shared gate-up", 2 * shared, hidden, per(moe)), GemmShape("shared down", hidden, shared, per(moe))]
        shapes.append(GemmShape("router", arch.moe.n_routed_experts, hidden, per(moe), bf16=True))
    shapes.append(GemmShape("lm head", arch.vocab_size / tp, hidden, np.where(np.arange(pp) == pp - 1, 1.0, 0.0), bf16=True))
    return tuple(shapes)


@dataclass(frozen=True)
class GemmGroup:
    """GEMM shapes of one format as arrays: n, k (S,), launches per stage (S, pp), and ((n, k), ...)."""

    n: np.ndarray
    k: np.ndarray
    count: np.ndarray
    key: tuple[tuple[float, float], ...]


@functools.lru_cache(maxsize=256)
def gemm_groups(arch: ModelArch, pp: int, tp: int, bf16: bool, with_head: bool) -> GemmGroup | None:
    """`gemm_shapes` of one format (bf16 or the weights' own), the LM head left out unless `with_head`."""
    shapes = [g for g in gemm_shapes(arch, pp, tp) if g.bf16 is bf16 and (with_head or g.name != "lm head")]
    if not shapes:
        return None
    return GemmGroup(np.array([g.n for g in shapes], dtype=float), np.array([g.k for g in shapes], dtype=float),
                     np.stack([g.count for g in shapes]), tuple((float(g.n), float(g.k)) for g in shapes))


def decode_context_per_layer(arch: ModelArch, input_tokens: float, output_tokens: float) -> np.ndarray:
    """Context tokens a decode query reads in each layer (n_layers,), over a request's output: the mean
    context S = input + output / 2 in a full-attention layer, min(S, w) in a sliding-window layer; in a
    chunked layer (Llama 4) the mean over the output positions p of the tokens of p's own chunk,
    (p - 1) mod C + 1 (`chunked_attention_pairs` between the prompt's end and the last position, per
    position), about C / 2 once the output spans chunks and a few tokens just past a chunk boundary."""
    windows = layer_windows(arch)
    lengths = np.minimum(input_tokens + output_tokens / 2, windows)
    chunked = chunked_layers(arch)
    if chunked.any() and output_tokens > 0:
        c = windows[chunked]
        lengths[chunked] = (chunked_attention_pairs(input_tokens + output_tokens, c) - chunked_attention_pairs(input_tokens, c)) / output_tokens
    return lengths


@functools.lru_cache(maxsize=1024)
def window_groups(arch: ModelArch, pp: int, input_tokens: float, output_tokens: float) -> tuple[tuple[float, np.ndarray], ...]:
    """(KV length, layers per stage) for each distinct KV length a decode step's layers read over a
    request of these lengths (`decode_context_per_layer`)."""
    lengths = decode_context_per_layer(arch, input_tokens, output_tokens)
    to_stage = stage_of_layer(arch.n_layers, pp)
    return tuple((float(length), np.bincount(to_stage, weights=(lengths == length).astype(float), minlength=pp))
                 for length in np.unique(lengths))


def attention_heads_per_rank(arch: ModelArch, tp: int) -> HeadShape:
    """Query heads, KV heads (as the cache shards them) and q.k head dimension on one tensor-parallel rank."""
    att = arch.attention
    if att.kind is AttentionKind.MLA:
        heads = att.n_heads / tp
        return HeadShape(heads, heads, att.qk_nope_head_dim + att.qk_rope_head_dim)
    return HeadShape(att.n_heads / tp, att.n_kv_heads * kv_shard_fraction(arch, tp), att.head_dim)
