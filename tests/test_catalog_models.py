"""Model catalog: parameter counts against published figures, KV-cache golden numbers, layer patterns."""

import numpy as np
import pytest

from planner.model.architecture import (
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    param_counts,
)

REQUIRED = [
    "deepseek-v3", "kimi-k2", "qwen3-235b-a22b", "qwen3-30b-a3b", "qwen3-32b", "llama-3.1-8b", "llama-3.1-70b",
    "llama-3.1-405b", "llama-4-scout", "llama-4-maverick", "mixtral-8x7b", "mixtral-8x22b", "gpt-oss-20b", "gpt-oss-120b",
]

# Published totals and active counts, with each lab's convention for the active count
# (source in the catalog entry; repeated here so the test does not read the numbers it checks).
PUBLISHED = {
    "deepseek-v3": (671e9, 37e9, True),  # DeepSeek-V3 README
    "kimi-k2": (1.0e12, 32e9, True),  # Kimi K2 model card
    "qwen3-235b-a22b": (235e9, 22e9, True),  # model card
    "qwen3-30b-a3b": (30.5e9, 3.3e9, True),  # model card
    "qwen3-32b": (32.8e9, 32.8e9, True),  # model card: 32.8B
    "llama-3.1-8b": (8e9, 8e9, True),
    "llama-3.1-70b": (70e9, 70e9, True),
    "llama-3.1-405b": (405e9, 405e9, True),
    "llama-4-scout": (109e9, 17e9, True),  # HF Llama 4 blog; total includes the vision encoder
    "llama-4-maverick": (400e9, 17e9, True),
    "mixtral-8x7b": (46.7e9, 12.9e9, True),  # Mixtral paper
    "mixtral-8x22b": (141e9, 39e9, True),
    "gpt-oss-20b": (20.9e9, 3.6e9, False),  # OpenAI counts the unembedding, not the input embedding
    "gpt-oss-120b": (116.8e9, 5.1e9, False),
    "llama-3.3-70b": (70e9, 70e9, True),  # Llama 3.3 model card
    "llama-2-7b": (6.74e9, 6.74e9, True),  # Hugging Face model page (the paper rounds to 7B)
    "llama-2-70b": (69e9, 69e9, True),
    "gpt-j-6b": (6.053e9, 6.053e9, True),  # model card: 6,053,381,344 (non-gated MLP written as gated, equal weights)
    "falcon-180b": (180e9, 180e9, True),  # model card (non-gated MLP written as gated, equal weights)
}


def test_every_required_model_is_in_the_catalog(models):
    assert set(REQUIRED) <= set(models)


@pytest.mark.parametrize("model_id", sorted(PUBLISHED))
def test_parameter_counts_within_3_percent_of_published(models, model_id):
    total, active, with_embedding = PUBLISHED[model_id]
    counts = param_counts(models[model_id])
    computed_active = counts.active_with_input_embedding if with_embedding else counts.active_matmul
    assert counts.total == pytest.approx(total, rel=0.03)
    assert computed_active == pytest.approx(active, rel=0.03)


def test_every_catalog_model_matches_its_own_published_counts(models):
    for arch in models.values():
        assert arch.published is not None, arch.id
        counts = param_counts(arch)
        active = counts.active_with_input_embedding if arch.published.active_includes_input_embedding else counts.active_matmul
        assert counts.total == pytest.approx(arch.published.total_params, rel=0.03), arch.id
        assert active == pytest.approx(arch.published.active_params, rel=0.03), arch.id


def test_kv_bytes_per_token_deepseek_v3_mla(models):
    # MLA caches the 512-wide latent and one 64-wide RoPE key per layer: 61 x 576 values
    arch = models["deepseek-v3"]
    assert kv_bytes_per_token(arch, 2.0) == 61 * (512 + 64) * 2 == 70_272
    assert kv_bytes_per_token(arch, 1.0) == 61 * (512 + 64) * 1 == 35_136


def test_kv_bytes_per_token_llama_70b_gqa(models):
    # GQA: a key and a value for each of 8 KV heads of 128 in each of 80 layers
    arch = models["llama-3.1-70b"]
    assert kv_bytes_per_token(arch, 2.0) == 2 * 80 * 8 * 128 * 2 == 327_680
    assert kv_bytes_per_token(arch, 1.0) == 2 * 80 * 8 * 128 * 1 == 163_840


def test_sliding_window_layers_hold_at_most_their_window(models):
    # gpt-oss-120b: 18 full layers and 18 layers with a 128-token window, 2 x 8 x 64 values per token
    arch = models["gpt-oss-120b"]
    per_layer_bf16 = 2 * 8 * 64 * 2
    assert kv_bytes_per_token(arch, 2.0) == 18 * per_layer_bf16 == 36_864
    seq = kv_bytes_per_sequence(arch, 10_000, 2.0)
    assert seq.sum() == 18 * per_layer_bf16 * 10_000 + 18 * per_layer_bf16 * 128
    assert kv_bytes_per_sequence(arch, 100, 2.0).sum() == 36 * per_layer_bf16 * 100


def test_layer_patterns(models):
    ds = models["deepseek-v3"]
    assert ds.layer_is_moe[:3] == (False, False, False) and all(ds.layer_is_moe[3:]) and ds.n_moe_layers == 58
    mav = models["llama-4-maverick"]
    assert [i for i, moe in enumerate(mav.layer_is_moe) if moe] == list(range(1, 48, 2))
    assert [i for i, w in enumerate(mav.layer_window_tokens) if w is None] == list(range(3, 48, 4))
    oss = models["gpt-oss-20b"]
    assert oss.layer_window_tokens[:4] == (128, None, 128, None)
    kimi = models["kimi-k2"]
    assert kimi.layer_is_moe[0] is False and kimi.n_moe_layers == 60


def test_moe_sparsity_is_what_the_lecture_uses(models):
    # DeepSeek-V3: 671B total over ~37B active -> ~18x sparse
    counts = param_counts(models["deepseek-v3"])
    assert counts.sparsity_ratio == pytest.approx(671.03 / 36.62, rel=1e-3)
    per_layer = np.array([1 for m in models["deepseek-v3"].layer_is_moe if m])
    assert per_layer.sum() == 58
