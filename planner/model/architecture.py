"""Transformer architecture: parameter counts, KV-cache bytes and attention FLOPs, per layer.

Everything here is a count or a size that follows from the architecture alone; times live in
`roofline.py`. Per-layer quantities are numpy arrays of length `n_layers` so that pipeline stages
can be summed over layer ranges.
"""

import functools
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from planner.precision import Precision

__all__ = [
    "Attention",
    "AttentionKind",
    "DraftAcceptance",
    "LayerParams",
    "MoE",
    "ModelArch",
    "ParamCounts",
    "PublishedCounts",
    "attention_flops_per_context_token",
    "chunked_layers",
    "expert_touch_fraction",
    "kv_bytes_per_request",
    "kv_bytes_per_sequence",
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_layer",
    "layer_params",
    "layer_windows",
    "mtp_module_params",
    "param_counts",
]

SWIGLU_MATRICES = 3  # gate, up and down projections of a gated (SwiGLU) MLP
KEYS_AND_VALUES = 2  # a GQA/MHA cache stores one key and one value vector per KV head
FLOPS_PER_MAC = 2  # one multiply-accumulate = 2 floating-point operations


class AttentionKind(StrEnum):
    GQA = "gqa"  # multi-head, grouped-query and multi-query attention: n_kv_heads K/V heads
    MLA = "mla"  # multi-head latent attention (DeepSeek-V2/V3): a low-rank latent is cached


@dataclass(frozen=True)
class Attention:
    kind: AttentionKind
    n_heads: int
    n_kv_heads: int = 0  # GQA only
    head_dim: int = 0  # GQA only
    q_lora_rank: int | None = None  # MLA only; None = full-rank query projection
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    qkv_bias: bool = False
    output_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm on queries and keys (Qwen3)
    sinks: bool = False  # one learned attention-sink logit per head (gpt-oss)


@dataclass(frozen=True)
class MoE:
    n_routed_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    n_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    expert_bias: bool = False  # biases on expert projections (gpt-oss)
    router_bias: bool = False
    routing: str = "power_law_1.2"  # routing skew the calibrated expert kernels assume (see MoESpec.routing)
    expert_groups: int = 1  # the router first picks groups_per_token of these groups (DeepSeek-V3: 8 / 4)
    groups_per_token: int = 1


@dataclass(frozen=True)
class PublishedCounts:
    """Parameter counts a model's authors publish, and whether their active count includes the
    input-embedding table (conventions differ between labs)."""

    total_params: float
    active_params: float
    active_includes_input_embedding: bool
    source: str


@dataclass(frozen=True)
class DraftAcceptance:
    """Published acceptance of a model's own draft (its next-token-prediction modules): the chance
    that the draft's i-th token is accepted given that the ones before it were, per position."""

    rates: tuple[float, ...]
    source: str


@dataclass(frozen=True)
class ModelArch:
    """A decoder-only transformer, dense or mixture-of-experts."""

    id: str
    name: str
    n_layers: int
    hidden_size: int
    vocab_size: int
    tie_word_embeddings: bool
    attention: Attention
    dense_intermediate_size: int  # FFN width of dense layers (0 if every layer is MoE)
    moe: MoE | None
    layer_is_moe: tuple[bool, ...]
    layer_window_tokens: tuple[int | None, ...]  # None = full attention; else sliding/chunked window
    max_context_tokens: int
    window_chunked: bool = False  # windowed layers attend within fixed chunks (Llama 4), not over a sliding window
    native_weights_precision: Precision = Precision.BF16
    native_expert_weights_precision: Precision | None = None
    fp8_block_size: int = 0  # fp8 checkpoints quantised in square blocks of this many values (0: per tensor or none)
    published: PublishedCounts | None = None
    mtp_layers: int = 0  # multi-token-prediction modules the checkpoint ships (config num_nextn_predict_layers)
    mtp_acceptance: DraftAcceptance | None = None  # their published acceptance, the default of speculative decoding

    @property
    def is_moe(self) -> bool:
        return self.moe is not None and any(self.layer_is_moe)

    @property
    def n_moe_layers(self) -> int:
        return sum(self.layer_is_moe)


def _mlp_params(hidden: int, intermediate: int, bias: bool) -> int:
    """Gated MLP: gate and up (hidden -> intermediate), down (intermediate -> hidden)."""
    weights = SWIGLU_MATRICES * hidden * intermediate
    biases = (2 * intermediate + hidden) if bias else 0
    return weights + biases


def _attention_params(att: Attention, hidden: int) -> int:
    """Projection weights of one attention block (norms of q/k included, layer norms excluded)."""
    if att.kind is AttentionKind.GQA:
        q_dim = att.n_heads * att.head_dim
        kv_dim = att.n_kv_heads * att.head_dim
        weights = hidden * q_dim + 2 * hidden * kv_dim + q_dim * hidden  # q, k, v, o
        biases = (q_dim + 2 * kv_dim if att.qkv_bias else 0) + (hidden if att.output_bias else 0)
        norms = 2 * att.head_dim if att.qk_norm else 0
        sinks = att.n_heads if att.sinks else 0
        return weights + biases + norms + sinks
    qk_head_dim = att.qk_nope_head_dim + att.qk_rope_head_dim
    if att.q_lora_rank:
        query = hidden * att.q_lora_rank + att.q_lora_rank + att.q_lora_rank * att.n_heads * qk_head_dim
    else:
        query = hidden * att.n_heads * qk_head_dim
    kv_down = hidden * (att.kv_lora_rank + att.qk_rope_head_dim) + att.kv_lora_rank  # latent + shared rope key, norm
    kv_up = att.kv_lora_rank * att.n_heads * (att.qk_nope_head_dim + att.v_head_dim)
    output = att.n_heads * att.v_head_dim * hidden
    return query + kv_down + kv_up + output


@dataclass(frozen=True)
class LayerParams:
    """Per-layer parameter counts, arrays of shape (n_layers,).

    `dense`: parameters every token uses (attention, dense MLP, shared experts, router, norms);
    `routed_total`: all routed experts; `routed_active`: the `experts_per_token` a token uses.
    """

    attention: np.ndarray
    dense: np.ndarray
    routed_total: np.ndarray
    routed_active: np.ndarray


def layer_params(arch: ModelArch) -> LayerParams:
    d = arch.hidden_size
    attention = _attention_params(arch.attention, d)
    layer_norms = 2 * d  # pre-attention and pre-MLP RMSNorm weights
    dense_mlp = _mlp_params(d, arch.dense_intermediate_size, bias=False) if arch.dense_intermediate_size else 0
    is_moe = np.array(arch.layer_is_moe, dtype=bool)
    dense = np.full(arch.n_layers, float(attention + layer_norms))
    routed_total = np.zeros(arch.n_layers)
    routed_active = np.zeros(arch.n_layers)
    if arch.moe is not None:
        moe = arch.moe
        one_expert = _mlp_params(d, moe.expert_intermediate_size, moe.expert_bias)
        shared = moe.n_shared_experts * _mlp_params(d, moe.shared_expert_intermediate_size, bias=False)
        router = d * moe.n_routed_experts + (moe.n_routed_experts if moe.router_bias else 0)
        dense += np.where(is_moe, shared + router, dense_mlp)
        routed_total = np.where(is_moe, float(moe.n_routed_experts * one_expert), 0.0)
        routed_active = np.where(is_moe, float(moe.experts_per_token * one_expert), 0.0)
    else:
        dense += dense_mlp
    return LayerParams(np.full(arch.n_layers, float(attention)), dense, routed_total, routed_active)


def mtp_module_params(arch: ModelArch) -> float:
    """Parameters of one multi-token-prediction module (DeepSeek-V3 technical report, section 2.2): a
    transformer block like the model's last layer, the projection M that joins the previous hidden
    state and the next token's embedding (2d x d), and the RMSNorms of both inputs and of its output.
    Its embedding and output head are the main model's (shared). DeepSeek-V3: 11.6B; its checkpoint's
    14B adds a copy of the embedding and the head (0.93B each)."""
    per_layer = layer_params(arch)
    d = arch.hidden_size
    return float(per_layer.dense[-1] + per_layer.routed_total[-1]) + 2 * d * d + 3 * d


@dataclass(frozen=True)
class ParamCounts:
    """Whole-model parameter counts.

    `active_matmul` is what one token multiplies through (2 FLOPs each): every layer's dense part,
    its `experts_per_token` routed experts and the LM head. The input embedding is a table lookup,
    not a matmul, so it is excluded; `active_with_input_embedding` adds it for comparison with labs
    that count it.
    """

    embedding: float
    lm_head: float
    layers_dense: float
    layers_routed_total: float
    layers_routed_active: float
    final_norm: float
    tied: bool

    @property
    def total(self) -> float:
        head = 0.0 if self.tied else self.lm_head
        return self.embedding + head + self.layers_dense + self.layers_routed_total + self.final_norm

    @property
    def active_matmul(self) -> float:
        return self.lm_head + self.layers_dense + self.layers_routed_active

    @property
    def active_with_input_embedding(self) -> float:
        return self.active_matmul + (0.0 if self.tied else self.embedding)

    @property
    def sparsity_ratio(self) -> float:
        """N_total / N_active (docs/physics.md claim 2)."""
        return self.total / self.active_matmul


def param_counts(arch: ModelArch) -> ParamCounts:
    per_layer = layer_params(arch)
    vocab_matrix = float(arch.vocab_size * arch.hidden_size)
    return ParamCounts(
        embedding=vocab_matrix,
        lm_head=vocab_matrix,
        layers_dense=float(per_layer.dense.sum()),
        layers_routed_total=float(per_layer.routed_total.sum()),
        layers_routed_active=float(per_layer.routed_active.sum()),
        final_norm=float(arch.hidden_size),
        tied=arch.tie_word_embeddings,
    )


def kv_bytes_per_token_per_layer(arch: ModelArch, kv_bytes_per_value: float) -> float:
    """Cache bytes one token adds to one layer.

    GQA: `2 * n_kv_heads * head_dim * b` (a key and a value per KV head).
    MLA: `(kv_lora_rank + qk_rope_head_dim) * b` (the compressed latent and one shared RoPE key).
    """
    att = arch.attention
    if att.kind is AttentionKind.MLA:
        return (att.kv_lora_rank + att.qk_rope_head_dim) * kv_bytes_per_value
    return KEYS_AND_VALUES * att.n_kv_heads * att.head_dim * kv_bytes_per_value


def _window_array(arch: ModelArch) -> np.ndarray:
    return _windows(arch.layer_window_tokens)


@functools.lru_cache(maxsize=256)
def _windows(layer_window_tokens: tuple[int | None, ...]) -> np.ndarray:
    """Read-only (shared between callers): inf for full attention."""
    out = np.array([np.inf if w is None else float(w) for w in layer_window_tokens])
    out.flags.writeable = False
    return out


def kv_bytes_per_token(arch: ModelArch, kv_bytes_per_value: float) -> float:
    """KV bytes per token of context once the context is longer than every window: only
    full-attention layers keep growing (docs/physics.md `kv`)."""
    full_layers = sum(1 for w in arch.layer_window_tokens if w is None)
    return full_layers * kv_bytes_per_token_per_layer(arch, kv_bytes_per_value)


def kv_bytes_per_sequence(arch: ModelArch, context_tokens: float, kv_bytes_per_value: float) -> np.ndarray:
    """KV bytes one sequence of `context_tokens` holds in each layer, shape (n_layers,).
    Sliding-window and chunked-attention layers hold at most their window."""
    per_layer = kv_bytes_per_token_per_layer(arch, kv_bytes_per_value)
    return per_layer * np.minimum(float(context_tokens), _window_array(arch))


def kv_bytes_per_request(arch: ModelArch, context_tokens: float, kv_bytes_per_value: float) -> float:
    """KV bytes one request of `context_tokens` holds over all its layers (a prefix to store or reload,
    a KV hand-off, the bytes of one token's KV)."""
    return float(np.sum(kv_bytes_per_sequence(arch, context_tokens, kv_bytes_per_value)))


def attention_flops_per_context_token(arch: ModelArch, absorbed: bool) -> float:
    """FLOPs one query token spends on one cached (context) token in one layer: scores plus the
    weighted sum of values.

    GQA: `2 * n_heads * head_dim` for QK^T plus the same for AV.
    MLA absorbed (decode): scores against the latent and RoPE key, values from the latent:
    `2 * n_heads * (kv_lora + rope) + 2 * n_heads * kv_lora`.
    MLA unabsorbed (prefill): like MHA with q/k head dim nope+rope and v head dim v_head_dim.
    """
    att = arch.attention
    if att.kind is AttentionKind.GQA:
        return FLOPS_PER_MAC * att.n_heads * att.head_dim * 2  # QK^T and AV
    if absorbed:
        scores = FLOPS_PER_MAC * att.n_heads * (att.kv_lora_rank + att.qk_rope_head_dim)
        values = FLOPS_PER_MAC * att.n_heads * att.kv_lora_rank
    else:
        scores = FLOPS_PER_MAC * att.n_heads * (att.qk_nope_head_dim + att.qk_rope_head_dim)
        values = FLOPS_PER_MAC * att.n_heads * att.v_head_dim
    return float(scores + values)


def layer_windows(arch: ModelArch) -> np.ndarray:
    """Attention window per layer in tokens (inf for full attention), shape (n_layers,)."""
    return _window_array(arch)


def chunked_layers(arch: ModelArch) -> np.ndarray:
    """Which layers attend within fixed chunks of their window (Llama 4), shape (n_layers,) of bool."""
    return np.isfinite(_window_array(arch)) & arch.window_chunked


def expert_touch_fraction(tokens, experts_per_token, n_experts):
    """Expected fraction of a layer's E experts hit by `tokens` tokens choosing k each:
    1 - (1 - k/E)^tokens (docs/physics.md; routing assumed uniform and independent). Broadcasts;
    a float for scalar arguments."""
    if np.ndim(n_experts) == 0 and np.ndim(experts_per_token) == 0 and n_experts > 0:  # the common case, in fewer steps
        touched = 1.0 - (1.0 - float(experts_per_token) / float(n_experts)) ** np.asarray(tokens, dtype=float)
        return float(touched) if touched.ndim == 0 else touched
    n = np.asarray(n_experts, dtype=float)
    touched = np.where(n > 0, 1.0 - (1.0 - experts_per_token / np.where(n > 0, n, 1.0)) ** np.asarray(tokens, dtype=float), 0.0)
    return float(touched) if touched.ndim == 0 else touched
