"""A model's layers split into pipeline stages, with the per-stage sums every step term needs:
parameters, layer counts, GEMM kernels per forward pass, and widths of the elementwise work."""

import functools
from dataclasses import dataclass

import numpy as np

from planner.model.architecture import (
    AttentionKind,
    ModelArch,
    layer_params,
    param_counts,
)
from planner.physics.deployment import stage_of_layer

__all__ = ["ELEMENTWISE_OPS_PER_LAYER", "GEMMS_PER_ATTENTION", "Stages", "elementwise_bytes_per_token", "stages"]

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
