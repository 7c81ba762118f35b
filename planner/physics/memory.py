"""HBM use per accelerator: weight shard, KV-cache shard, activations and fixed reserves."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from planner.model.architecture import (
    AttentionKind,
    ModelArch,
    kv_bytes_per_token_per_layer,
    layer_windows,
)
from planner.modes import Engine, StepModel
from planner.units import GB, MIB

if TYPE_CHECKING:
    from planner.physics.inputs import DeploymentInputs

__all__ = [
    "LOGIT_BYTES",
    "MemoryUse",
    "activation_bytes_per_accelerator",
    "engine_kv_margin_bytes",
    "engine_kv_margin_note",
    "held_kv_bytes_per_layer",
    "held_kv_tokens_per_layer",
    "kv_bytes_per_accelerator",
    "kv_shard_fraction",
    "weight_bytes_per_accelerator",
    "windowed_kv_note",
]

LOGIT_BYTES = 4  # samplers keep fp32 logits
LIVE_HIDDEN_VECTORS = 2  # residual stream and the normalised input of the current block
LIVE_MLP_VECTORS = 2  # gate and up projections of the current MLP, alive together

# SGLang's hybrid sliding-window pool (on for gpt-oss with every attention backend from 0.5.10, for Llama 4's
# chunked layers from 0.5.8-0.5.9): the windowed layers' pool holds --swa-full-tokens-ratio times the full pool's
# tokens, default 0.8 in every release read (0.5.1-0.5.10.post1; python/sglang/srt/server_args.py, the pools sized in
# model_runner_kv_cache_mixin.py _resolve_hybrid_swa_tokens), and ScheduleBatch.maybe_evict_swa frees a sequence's
# out-of-window tokens every window's worth of decode steps, so a sequence holds up to two windows there.
SGLANG_SWA_FULL_TOKENS_RATIO = 0.8
SGLANG_SWA_WINDOWS_HELD = 2

# What an engine keeps out of its KV pool at its defaults, beyond the weights and a forward pass's peak.
# TensorRT-LLM: KvCacheConfig.free_gpu_memory_fraction 0.9 of the memory left after a max_num_tokens profiling
# pass (llmapi/llm_args.py; _torch/pyexecutor/_util.py KvCacheCreator.configure_kv_cache_capacity; trtllm-bench
# --kv_cache_free_gpu_mem_fraction 0.90). vLLM: gpu_memory_utilization 0.92 of the whole memory from 0.20 on, 0.9
# before (vllm/config/cache.py; v1/worker/gpu_worker.py determine_available_memory). SGLang: mem_fraction_static
# chosen so that R MiB stay free for activations and CUDA graphs (srt/server_args.py _handle_gpu_memory_settings,
# 0.5.5; memory_hook.py in 0.5.23): R = 512 + 1.5 max(chunked_prefill_size, 2048) + 2 cuda_graph_max_bs
# + 1024 tp pp / 8 (MLA models 1536 more in 0.5.23), at least 10240 on parts over 60 GB, with chunked_prefill_size
# 8192 (16384 from 160 GB) and cuda_graph_max_bs 256 under tp 4, else 512 (512 from 160 GB).
TRTLLM_FREE_MEMORY_FRACTION = 0.9
VLLM_GPU_MEMORY_UTILIZATION = 0.92
SGLANG_RESERVE_BASE_MIB = 512
SGLANG_RESERVE_MIB_PER_CHUNK_TOKEN = 1.5
SGLANG_RESERVE_MIB_PER_GRAPH_BATCH = 2
SGLANG_RESERVE_MIB_PER_8_RANKS = 1024
SGLANG_RESERVE_MLA_MIB = 1536
SGLANG_RESERVE_FLOOR_MIB = 10240  # on parts with more than 60 GB


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


def held_kv_tokens_per_layer(arch: ModelArch, engine: Engine, context_tokens: float, step_model: StepModel) -> np.ndarray:
    """Tokens of KV a sequence of `context_tokens` takes from each layer's share of HBM, shape (n_layers,): the
    context in a full-attention layer; in a sliding-window or chunked layer what the engine's cache manager holds.

    - the ideal roofline and vLLM: the window (vLLM's hybrid KV cache manager, on by default, frees the blocks
      behind it: SlidingWindowManager and ChunkedLocalAttentionManager in vllm/v1/core/single_type_kv_cache_manager.py).
    - TensorRT-LLM: the whole context. Without kv_cache_config.max_attention_window (which neither gpt-oss's nor
      Llama 4's model code, nor trtllm-bench, sets) its KVCacheManager sizes every layer at the maximum sequence
      length and the window reaches the attention kernel only (_torch/pyexecutor/resource_manager.py,
      _torch/models/modeling_gpt_oss.py AttentionBlock, modeling_llama.py Llama4Attention).
    - SGLang: the windowed layers' pool has SGLANG_SWA_FULL_TOKENS_RATIO times the full pool's tokens and the
      memory is split so, whichever pool fills first; per sequence that costs the full layers max(L, held / r)
      tokens and the windowed ones r times that, held = min(L, 2 w)."""
    windows = layer_windows(arch)
    context, ideal = float(context_tokens), step_model is not StepModel.CALIBRATED
    windowed = np.isfinite(windows)
    if not windowed.any() or engine is Engine.TRTLLM and not ideal:
        return np.full(len(windows), context)
    if engine is not Engine.SGLANG or ideal:
        return np.minimum(context, windows)
    held = np.minimum(context, SGLANG_SWA_WINDOWS_HELD * windows[windowed]).max()
    full = max(context, held / SGLANG_SWA_FULL_TOKENS_RATIO)
    return np.where(windowed, SGLANG_SWA_FULL_TOKENS_RATIO * full, full)


def held_kv_bytes_per_layer(arch: ModelArch, engine: Engine, context_tokens: float, step_model: StepModel,
                            kv_bytes_per_value: float) -> np.ndarray:
    """KV bytes a sequence of `context_tokens` takes in each layer (`held_kv_tokens_per_layer`), shape (n_layers,)."""
    return kv_bytes_per_token_per_layer(arch, kv_bytes_per_value) * held_kv_tokens_per_layer(arch, engine, context_tokens, step_model)


def windowed_kv_note(arch: ModelArch, engine: Engine, step_model: StepModel) -> str | None:
    """How the KV of a model's sliding-window or chunked layers is reserved (`held_kv_tokens_per_layer`)."""
    if not np.isfinite(layer_windows(arch)).any():
        return None
    if step_model is not StepModel.CALIBRATED:
        return "windowed attention layers hold only their window of KV (the ideal)"
    if engine is Engine.VLLM:
        return "windowed attention layers hold only their window of KV (vLLM's hybrid KV cache manager frees the blocks behind it)"
    if engine is Engine.TRTLLM:
        return ("windowed attention layers hold KV for the whole sequence: TensorRT-LLM sizes every layer at the maximum "
                "length unless kv_cache_config.max_attention_window is set, and the window reaches only the attention kernel")
    return (f"windowed attention layers draw on SGLang's hybrid SWA pool, sized at {SGLANG_SWA_FULL_TOKENS_RATIO:g} of the full "
            "pool's tokens (--swa-full-tokens-ratio), which costs each sequence that share of its length in those layers")


def _sglang_reserve_bytes(capacity_bytes: float, tp: int, pp: int, mla: bool) -> float:
    """SGLang's default free memory for activations and CUDA graphs (the constants above)."""
    large = capacity_bytes >= 160 * GB
    chunk = 16384 if large else 8192
    graph_batch = 512 if large or tp >= 4 else 256
    reserve = (SGLANG_RESERVE_BASE_MIB + SGLANG_RESERVE_MIB_PER_CHUNK_TOKEN * max(chunk, 2048) + SGLANG_RESERVE_MIB_PER_GRAPH_BATCH * graph_batch
               + SGLANG_RESERVE_MIB_PER_8_RANKS * tp * pp / 8 + (SGLANG_RESERVE_MLA_MIB if mla else 0))
    if capacity_bytes > 60 * GB:
        reserve = max(reserve, SGLANG_RESERVE_FLOOR_MIB)
    return reserve * MIB


def engine_kv_margin_bytes(inp: "DeploymentInputs", weights_bytes: np.ndarray, activations_bytes: np.ndarray) -> np.ndarray:
    """HBM an engine at its defaults keeps out of its KV pool beyond the weights and `activations_bytes`
    (the planner's forward-pass peak with the runtime reserve): TensorRT-LLM 10% of what is left, vLLM 8%
    of the whole, SGLang its reserve where it exceeds the planner's activations. None for the roofline."""
    engine, capacity_bytes, lay = inp.engine, inp.rack.accelerator.hbm_capacity_bytes, inp.layout
    if inp.step_model is not StepModel.CALIBRATED:
        return 0.0 * activations_bytes
    if engine is Engine.TRTLLM:
        return (1 - TRTLLM_FREE_MEMORY_FRACTION) * np.maximum(capacity_bytes - weights_bytes - activations_bytes, 0.0)
    if engine is Engine.VLLM:
        return (1 - VLLM_GPU_MEMORY_UTILIZATION) * capacity_bytes + 0.0 * activations_bytes
    reserve = _sglang_reserve_bytes(capacity_bytes, lay.tp, lay.pp, inp.arch.attention.kind is AttentionKind.MLA)
    return np.maximum(reserve - activations_bytes, 0.0)


def engine_kv_margin_note(engine: Engine, step_model: StepModel) -> str | None:
    """How the engine's default memory setting shrinks its KV pool (`engine_kv_margin_bytes`)."""
    if step_model is not StepModel.CALIBRATED:
        return None
    if engine is Engine.TRTLLM:
        return (f"the KV cache gets {TRTLLM_FREE_MEMORY_FRACTION:.0%} of the memory left after weights and a forward pass "
                "(TensorRT-LLM's default free_gpu_memory_fraction); the rest is counted with the reserves")
    if engine is Engine.VLLM:
        return (f"weights, a forward pass and the KV cache share {VLLM_GPU_MEMORY_UTILIZATION:.0%} of HBM (vLLM's default "
                "gpu_memory_utilization); the rest is counted with the reserves")
    return ("SGLang's default mem_fraction_static leaves its reserve for activations and CUDA graphs free "
            "(10-27 GiB by part and parallelism); it is counted with the reserves")


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
