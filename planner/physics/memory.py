"""HBM use per accelerator: weight shard, KV-cache shard, activations and fixed reserves."""

from dataclasses import dataclass

import numpy as np

from planner.model.architecture import AttentionKind, ModelArch

__all__ = [
    "LOGIT_BYTES",
    "MemoryUse",
    "activation_bytes_per_accelerator",
    "kv_bytes_per_accelerator",
    "kv_shard_fraction",
    "weight_bytes_per_accelerator",
]

LOGIT_BYTES = 4  # samplers keep fp32 logits
LIVE_HIDDEN_VECTORS = 2  # residual stream and the normalised input of the current block
LIVE_MLP_VECTORS = 2  # gate and up projections of the current MLP, alive together


@dataclass(frozen=True)
class MemoryUse:
    """Bytes on the fullest accelerator of a replica."""

    weights_bytes: float
    kv_bytes: float
    activations_bytes: float  # activations, communication buffers and the runtime reserve
    capacity_bytes: float
    prompt_cache_bytes: float = 0.0  # cached prefixes kept in HBM between requests

    @property
    def used_bytes(self) -> float:
        return self.weights_bytes + self.kv_bytes + self.activations_bytes + self.prompt_cache_bytes

    @property
    def free_bytes(self) -> float:
        return self.capacity_bytes - self.used_bytes

    @property
    def fill_fraction(self) -> float:
        return self.used_bytes / self.capacity_bytes

    @property
    def fits(self) -> bool:
        return self.used_bytes <= self.capacity_bytes


def weight_bytes_per_accelerator(
    dense_params: np.ndarray, routed_params: np.ndarray, tp: int, stage_size: int,
    weight_bytes_per_param: float, expert_weight_bytes_per_param: float,
) -> np.ndarray:
    """Dense weights are split over the `tp` ranks (and replicated over attention-DP ranks); routed
    experts are spread over all `stage_size` accelerators of a stage."""
    return dense_params * weight_bytes_per_param / tp + routed_params * expert_weight_bytes_per_param / stage_size


def kv_shard_fraction(arch: ModelArch, tp: int) -> float:
    """Share of a sequence's KV cache one TP rank holds. GQA splits KV heads over the TP ranks until
    each holds one head (beyond that heads are replicated); an MLA latent cannot be split by head,
    so every TP rank holds all of it (why MLA models serve with attention data parallelism)."""
    att = arch.attention
    if att.kind is AttentionKind.MLA:
        return 1.0
    return 1.0 / min(tp, att.n_kv_heads)


def kv_bytes_per_accelerator(sequences_per_rank: float, kv_bytes_per_sequence: np.ndarray, shard_fraction: float) -> np.ndarray:
    """KV bytes of the sequences an attention rank serves, for the layers of each stage. With
    pipelining every stage holds the cache of all micro-batches, so this does not drop with pp."""
    return sequences_per_rank * kv_bytes_per_sequence * shard_fraction


def activation_bytes_per_accelerator(
    tokens_per_forward: float, hidden_size: int, mlp_width_per_accelerator: float, activation_bytes_per_value: float,
    logits_tokens: float, vocab_per_accelerator: float, dispatch_tokens: float,
) -> float:
    """Peak live tensors of one layer for the largest forward pass (decode micro-batch or prefill
    chunk), the sampler's logits, and the expert-dispatch receive buffer."""
    layer = tokens_per_forward * activation_bytes_per_value * (
        LIVE_HIDDEN_VECTORS * hidden_size + LIVE_MLP_VECTORS * mlp_width_per_accelerator
    )
    logits = logits_tokens * vocab_per_accelerator * LOGIT_BYTES
    dispatch = dispatch_tokens * hidden_size * activation_bytes_per_value
    return layer + logits + dispatch
