"""KV capacity of models with sliding-window or chunked attention layers, engine by engine.

gpt-oss-20b (openai/gpt-oss-20b config.json): 24 layers alternating sliding_attention (window 128) and
full_attention, 8 KV heads of 64 values. Llama 4 Maverick: 48 layers, every 4th global, the others chunked
attention over 8192 tokens. What each engine's cache manager holds for a windowed layer (sources in
planner/physics/memory.py): the whole sequence in TensorRT-LLM (no max_attention_window set), the window in
vLLM's hybrid manager, and in SGLang a hybrid pool of 0.8 of the full pool's tokens.
"""

import numpy as np
import pytest

from planner.modes import Engine, StepModel
from planner.physics.memory import held_kv_tokens_per_layer, windowed_kv_note

CAL, ROOF = StepModel.CALIBRATED, StepModel.ROOFLINE


def _split(held: np.ndarray, arch) -> tuple[set, set]:
    """The distinct tokens held by the windowed layers and by the full ones (rounded to 1e-9 tokens)."""
    windowed = np.array([w is not None for w in arch.layer_window_tokens])
    return set(np.round(held[windowed], 9).tolist()), set(np.round(held[~windowed], 9).tolist())


def test_tensorrt_llm_holds_the_whole_sequence_in_sliding_layers(models):
    arch = models["gpt-oss-20b"]
    assert sum(w is not None for w in arch.layer_window_tokens) == 12
    assert _split(held_kv_tokens_per_layer(arch, Engine.TRTLLM, 2048, CAL), arch) == ({2048.0}, {2048.0})
    # the ideal roofline keeps only the window, whatever the engine
    assert _split(held_kv_tokens_per_layer(arch, Engine.TRTLLM, 2048, ROOF), arch) == ({128.0}, {2048.0})


def test_vllm_holds_the_window(models):
    arch = models["gpt-oss-20b"]
    assert _split(held_kv_tokens_per_layer(arch, Engine.VLLM, 2048, CAL), arch) == ({128.0}, {2048.0})
    assert _split(held_kv_tokens_per_layer(arch, Engine.VLLM, 100, CAL), arch) == ({100.0}, {100.0})


def test_sglang_pays_its_hybrid_pool_ratio(models):
    arch = models["gpt-oss-20b"]
    # 2048 tokens: the sliding pool holds at most two windows (256) of a sequence, under 0.8 x 2048, so the
    # full pool fills first and each sliding layer costs 0.8 x 2048 = 1638.4 tokens of the budget
    assert _split(held_kv_tokens_per_layer(arch, Engine.SGLANG, 2048, CAL), arch) == ({1638.4}, {2048.0})
    # 200 tokens: the sequence holds all 200 in the sliding pool, which has 0.8 of the full pool's tokens, so the
    # sliding pool fills first: per sequence 200 / 0.8 = 250 full-pool tokens and 200 sliding ones
    assert _split(held_kv_tokens_per_layer(arch, Engine.SGLANG, 200, CAL), arch) == ({200.0}, {250.0})
    # Llama 4's chunked layers at 2048 tokens (under one 8192-token chunk): 2048 / 0.8 = 2560 in the 12 global layers
    maverick = models["llama-4-maverick"]
    assert _split(held_kv_tokens_per_layer(maverick, Engine.SGLANG, 2048, CAL), maverick) == ({2048.0}, {2560.0})


def test_models_without_windows_hold_the_context_everywhere(models):
    arch = models["llama-3.1-8b"]
    for engine in Engine:
        assert set(held_kv_tokens_per_layer(arch, engine, 1500, CAL).tolist()) == {1500.0}
    assert windowed_kv_note(arch, Engine.TRTLLM, CAL) is None
    assert "whole sequence" in windowed_kv_note(models["gpt-oss-20b"], Engine.TRTLLM, CAL)


def test_gpt_oss_kv_per_sequence_on_tensorrt_llm_and_vllm(run_estimate):
    """A gpt-oss-20b sequence of 1024 + 1024 tokens in bf16 KV: per layer and token 2 x 8 x 64 x 2 = 2048 bytes.
    TensorRT-LLM reserves the whole 2048 tokens in all 24 layers: 24 x 2048 x 2048 = 100.7 MB. vLLM pages the mean
    length plus 10% headroom, (1024 + 512) x 1.1 = 1689.6 tokens, in the 12 full layers and 128 in the 12 sliding
    ones: 12 x 2048 x (1689.6 + 128) = 44.7 MB."""
    per_token_layer = 2 * 8 * 64 * 2
    trt = run_estimate("gpt-oss-20b", "hgx-h100", 64, 1024, 1024, step_model=CAL, engine=Engine.TRTLLM)
    vllm = run_estimate("gpt-oss-20b", "hgx-h100", 64, 1024, 1024, step_model=CAL, engine=Engine.VLLM)
    assert trt.memory.kv_bytes == pytest.approx(64 * 24 * 2048 * per_token_layer, rel=1e-9)
    assert vllm.memory.kv_bytes == pytest.approx(64 * 12 * per_token_layer * (1689.6 + 128), rel=1e-9)
    assert any("whole sequence" in note for note in trt.assumptions)


def test_chunked_attention_pairs_by_hand():
    from planner.physics.roofline import chunked_attention_pairs

    # chunks of 4 over 10 tokens: 1+2+3+4, 1+2+3+4, 1+2 = 23
    assert chunked_attention_pairs(10, 4) == 23
    assert chunked_attention_pairs(3, 4) == 6  # inside one chunk: plain causal, 3 x 4 / 2
    # two whole 8192-token chunks and 1000 more: 2 x 8192 x 8193 / 2 + 1000 x 1001 / 2
    assert chunked_attention_pairs(17384, 8192) == 2 * 8192 * 8193 / 2 + 1000 * 1001 / 2


def test_a_decode_query_reads_its_own_chunk_in_llama_4(models):
    """Llama 4 Maverick's chunked layers (C = 8192): an output token at position p reads the (p - 1) mod C + 1 tokens
    of its chunk. 8K in / 1K out: positions 8193-9216 sit at the start of the second chunk, 1..1024 tokens, 512.5 on
    average, where a sliding window would read 8192. 1K in / 8K out: positions 1025-9216 read 1025..8192 and then
    1..1024: (8192 x 8193 / 2 - 1024 x 1025 / 2 + 1024 x 1025 / 2) / 8192 = 4096.5. The global layers read the mean
    context, input + output / 2."""
    from planner.physics.stages import decode_context_per_layer

    arch = models["llama-4-maverick"]
    assert arch.window_chunked and not models["gpt-oss-20b"].window_chunked
    assert _split(decode_context_per_layer(arch, 8192, 1024), arch) == ({512.5}, {8704.0})
    assert _split(decode_context_per_layer(arch, 1024, 8192), arch) == ({4096.5}, {5120.0})
    # gpt-oss slides: the last 128 tokens
    oss = models["gpt-oss-20b"]
    assert _split(decode_context_per_layer(oss, 8192, 1024), oss) == ({128.0}, {8704.0})



def test_a_decode_step_reads_llama_4_chunks_on_the_roofline(run_estimate):
    """Maverick TP8 on an HGX H200 (4.8 TB/s at the achievable 0.8), batch 16, 8K in / 1K out, bf16 KV: a layer holds
    2 x 8 KV heads x 128 x 2 bytes = 4,096 bytes per token, one KV head per GPU at TP8 (1/8 of it). A decode step reads,
    per sequence, the 12 global layers at the mean context 8,704 tokens and the 36 chunked ones at 512.5 (the second
    chunk's first 1,024 positions), not at 8,192 as a sliding window would."""
    per_token_rank = 4096 / 8
    kv_bytes = 16 * per_token_rank * (12 * 8704 + 36 * 512.5)
    e = run_estimate("llama-4-maverick", "hgx-h200", 16, 8192, 1024, tp=8)
    assert e.decode_step.kv_s == pytest.approx(kv_bytes / (4.8e12 * 0.8), rel=1e-9)
