"""Golden roofline numbers worked out by hand from cited hardware and model figures.

The configuration is chosen so that every term can be written out here: Llama 3.1 8B on a single
H100 (tp = pp = ep = 1, so there is no communication).

Sources: H100 SXM 989.5 TFLOP/s dense BF16 and 3.35 TB/s HBM3 (NVIDIA datasheet via Glenn
Lockwood / hpctech); achievable fractions 0.803 of BF16 peak (ml-engineering MAMF table) and 0.8
of HBM bandwidth (NVIDIA AIConfigurator); Llama 3.1 8B config.json (32 layers, hidden 4096, 32 query
/ 8 KV heads of 128, MLP 14336, vocab 128256).
"""

import pytest

from planner.modes import OverlapPolicy, ServingRole
from planner.physics.roofline import (
    StepTime,
    all_reduce_time_s,
    all_to_all_time_s,
    causal_attention_pairs,
    expert_touch_fraction,
    point_to_point_time_s,
)

# --- hand-worked model numbers (Llama 3.1 8B) ---------------------------------------------
L, D, H, HKV, HD, FFN, VOCAB = 32, 4096, 32, 8, 128, 14336, 128256
ATTENTION = D * H * HD + 2 * D * HKV * HD + H * HD * D  # q, k, v, o = 41,943,040
MLP = 3 * D * FFN  # gate, up, down = 176,160,768
NORMS = 2 * D
PER_LAYER = ATTENTION + MLP + NORMS  # 218,112,000
VOCAB_MATRIX = VOCAB * D  # 525,336,576
ACTIVE = L * PER_LAYER + VOCAB_MATRIX  # layers + LM head = 7,504,920,576
TOTAL = L * PER_LAYER + 2 * VOCAB_MATRIX + D  # + embedding + final norm = 8,030,261,248
KV_PER_TOKEN_BF16 = 2 * HKV * HD * 2 * L  # K and V, 8 heads x 128, 2 bytes, 32 layers = 131,072
ATTN_FLOPS_PER_CONTEXT_TOKEN = 4 * H * HD * L  # QK^T and AV, 2 FLOPs per MAC each

# --- hand-worked hardware numbers (H100 SXM) ----------------------------------------------
F_EFF = 989.5e12 * 0.803
BW_EFF = 3.35e12 * 0.8


def test_hand_counts_match_the_catalog(models):
    from planner.model.architecture import kv_bytes_per_token, param_counts

    counts = param_counts(models["llama-3.1-8b"])
    assert counts.total == TOTAL == 8_030_261_248
    assert counts.active_matmul == ACTIVE
    assert kv_bytes_per_token(models["llama-3.1-8b"], 2.0) == KV_PER_TOKEN_BF16 == 131_072


def test_decode_step_of_llama_8b_on_one_h100(run_estimate):
    batch, isl, osl = 32, 1024, 256
    mean_context = isl + osl / 2  # 1152
    compute_s = (2 * ACTIVE * batch + ATTN_FLOPS_PER_CONTEXT_TOKEN * mean_context * batch) / F_EFF
    weights_s = 2 * ACTIVE / BW_EFF  # every weight but the input-embedding table is read once
    kv_s = batch * mean_context * KV_PER_TOKEN_BF16 / BW_EFF
    e = run_estimate("llama-3.1-8b", "hgx-h100", batch, isl, osl, role=ServingRole.DECODE)
    assert e.decode_step.compute_s == pytest.approx(compute_s, rel=1e-9)  # 0.629 ms
    assert e.decode_step.weights_s == pytest.approx(weights_s, rel=1e-9)  # 5.60 ms
    assert e.decode_step.kv_s == pytest.approx(kv_s, rel=1e-9)  # 1.80 ms
    assert e.decode_step.comm_s == 0.0
    assert e.tpot_s == pytest.approx(max(compute_s, weights_s + kv_s), rel=1e-9)  # 7.40 ms
    assert e.decode_step.dominant_term == "weights" and e.decode_step.bound == "memory"
    assert e.decode_tokens_per_s == pytest.approx(batch / e.tpot_s)
    # cost: $2.10/h per H100 (catalog estimate) for one accelerator
    assert e.usd_per_million_decode_tokens == pytest.approx(2.10 / 3600 * e.tpot_s / batch * 1e6, rel=1e-9)


def test_prefill_and_ttft_of_llama_8b_on_one_h100(run_estimate):
    batch, isl, osl = 32, 1024, 256
    # The engine's token budget (8192) packs eight whole 1024-token prompts into one prefill pass.
    packed, tokens = 8, 8192
    pairs = isl * (isl + 1) / 2  # causal attention over each whole 1024-token prompt
    compute_s = (2 * L * PER_LAYER * tokens + 2 * VOCAB_MATRIX * packed + ATTN_FLOPS_PER_CONTEXT_TOKEN * pairs * packed) / F_EFF
    weights_s = 2 * ACTIVE / BW_EFF
    kv_s = tokens * KV_PER_TOKEN_BF16 / BW_EFF  # the pass writes its own cache
    prefill_s = max(compute_s, weights_s + kv_s)  # compute-bound
    # an aggregated replica prefills batch x isl / osl = 128 prompt tokens in every decode step:
    # 128/8192 of a pass's FLOPs and KV traffic ride along with the 32 decode tokens
    share = batch * isl / osl / tokens
    mixed_step = max((2 * ACTIVE * batch + ATTN_FLOPS_PER_CONTEXT_TOKEN * 1152 * batch) / F_EFF + share * compute_s,
                     (2 * ACTIVE + batch * 1152 * KV_PER_TOKEN_BF16) / BW_EFF + share * kv_s)
    # a new request's whole 1024-token prompt rides in the next step on top of those 128 tokens
    carry = (128 + isl) / tokens
    carrying_step = max((2 * ACTIVE * batch + ATTN_FLOPS_PER_CONTEXT_TOKEN * 1152 * batch) / F_EFF + carry * compute_s,
                        (2 * ACTIVE + batch * 1152 * KV_PER_TOKEN_BF16) / BW_EFF + carry * kv_s)
    e = run_estimate("llama-3.1-8b", "hgx-h100", batch, isl, osl)
    assert e.prefill_chunk_step.bound == "compute"
    assert e.prefill_chunk_step.total_s == pytest.approx(prefill_s, rel=1e-9)
    assert e.prefill_riders_per_step == pytest.approx(128)
    assert e.mean_step_per_token_s == pytest.approx(mixed_step, rel=1e-9)  # the prompts' FLOPs hide under the weight fetch
    # a user's tokens are not held up by its own prompt (prefilled before its first token): the other
    # 31 requests' share of the riders is between them
    pure_step = (2 * ACTIVE + batch * 1152 * KV_PER_TOKEN_BF16) / BW_EFF  # memory-bound as well
    assert e.tpot_s == pytest.approx(pure_step + (batch - 1) / batch * (mixed_step - pure_step), rel=1e-9)
    assert e.queue_wait_s == pytest.approx(mixed_step / 2, rel=1e-9)  # a Poisson arrival waits half the step in progress
    assert e.prefill_latency_s == pytest.approx(carrying_step, rel=1e-9)
    assert e.sustained_output_tokens_per_s == pytest.approx(batch / mixed_step, rel=1e-9)
    assert e.ttft_s == pytest.approx(mixed_step / 2 + carrying_step, rel=1e-9)
    assert e.ttft_p90_s == pytest.approx(0.9 * mixed_step + carrying_step, rel=1e-9)
    assert e.prefill_tokens_per_s == pytest.approx(tokens / prefill_s, rel=1e-9)


def test_a_lone_prompt_on_a_prefill_replica_runs_a_pass_of_its_own_length(run_estimate):
    """A prefill replica whose passes hold one 128-token prompt (batch 1): the pass is 128 tokens,
    not the 8,192-token budget, and TTFT is half a pass of waiting plus the prompt's own pass; at
    batch 8 the pass holds eight such prompts (and each waits for a pass eight prompts long)."""
    isl = 128
    pairs = isl * (isl + 1) / 2

    def pass_s(prompts):
        tokens = prompts * isl
        compute_s = (2 * L * PER_LAYER * tokens + 2 * VOCAB_MATRIX * prompts + ATTN_FLOPS_PER_CONTEXT_TOKEN * pairs * prompts) / F_EFF
        memory_s = (2 * ACTIVE + tokens * KV_PER_TOKEN_BF16) / BW_EFF  # every weight once, the pass writes its own cache
        return max(compute_s, memory_s)

    one = run_estimate("llama-3.1-8b", "hgx-h100", 1, isl, 1, role=ServingRole.PREFILL)
    assert one.prefill_chunk_step.total_s == pytest.approx(pass_s(1), rel=1e-9)  # 5.6 ms: the weight fetch of one pass
    assert one.prefill_latency_s == pytest.approx(pass_s(1), rel=1e-9)
    assert one.queue_wait_s == pytest.approx(pass_s(1) / 2, rel=1e-9)
    assert one.ttft_s == pytest.approx(1.5 * pass_s(1), rel=1e-9)
    assert one.ttft_p90_s == pytest.approx(1.9 * pass_s(1), rel=1e-9)
    assert one.sustained_input_tokens_per_s == pytest.approx(isl / pass_s(1), rel=1e-9)
    eight = run_estimate("llama-3.1-8b", "hgx-h100", 8, isl, 1, role=ServingRole.PREFILL)
    assert eight.ttft_s == pytest.approx(1.5 * pass_s(8), rel=1e-9)
    assert eight.sustained_input_tokens_per_s == pytest.approx(8 * isl / pass_s(8), rel=1e-9)


def test_memory_of_llama_8b_on_one_h100(run_estimate):
    batch, isl, osl = 32, 1024, 256
    weights = 2 * TOTAL
    kv = batch * (isl + osl / 2) * 1.10 * KV_PER_TOKEN_BF16  # paged: the mean length (1152) + 10% headroom, under 1280
    layer_activations = 8192 * 2 * (2 * D + 2 * FFN)  # a prefill pass of 8192 packed tokens, bf16
    logits = batch * VOCAB * 4  # fp32 logits of the decode batch
    reserve = 3_758_096_384  # AIConfigurator other_mem (3.5 GiB); no NCCL buffers for one GPU
    e = run_estimate("llama-3.1-8b", "hgx-h100", batch, isl, osl)
    assert e.memory.weights_bytes == pytest.approx(weights, rel=1e-12)
    assert e.memory.kv_bytes == pytest.approx(kv, rel=1e-12)
    assert e.memory.activations_bytes == pytest.approx(layer_activations + logits + reserve, rel=1e-12)
    assert e.memory.capacity_bytes == 81_559 * 2**20 and e.memory.fits  # nvidia-smi: 81,559 MiB


def test_step_time_combination_rule():
    step = StepTime(compute_s=3.0, weights_s=1.0, kv_s=1.5, comm_s=0.5)
    assert step.total_s == 3.5  # max(3, 1 + 1.5) + 0.5
    assert step.dominant_term == "compute" and step.bound == "compute"
    overlapped = step._replace(overlap=OverlapPolicy.OVERLAPPED)
    assert overlapped.total_s == 3.0
    assert step.scaled(2).total_s == 7.0


def test_expert_touch_fraction():
    assert expert_touch_fraction(1, 8, 256) == pytest.approx(8 / 256)
    assert expert_touch_fraction(2, 8, 256) == pytest.approx(1 - (248 / 256) ** 2)
    assert expert_touch_fraction(4096, 8, 256) == pytest.approx(1.0)
    assert expert_touch_fraction(0, 8, 256) == 0.0


def test_collective_times():
    # ring all-reduce of 1 MB over 8 ranks at 100 GB/s: 2 * 7/8 * 1e6 / 1e11 = 17.5 us, + 10 us
    assert all_reduce_time_s(1e6, 8, 100e9, 10e-6) == pytest.approx(27.5e-6)
    assert all_reduce_time_s(1e6, 1, 100e9, 10e-6) == 0.0
    # all-to-all, 7 MB per member over 8 members, switched: injection 7e6/1e11 = 70 us
    assert all_to_all_time_s(7e6, 8, 100e9, 400e9, 0.0) == pytest.approx(70e-6)
    # ring of 16 on a torus (bisection 2 links x 45 GB/s): 8*8 pairs carry 1e6/15 bytes each
    assert all_to_all_time_s(1e6, 16, 90e9, 90e9, 0.0) == pytest.approx(64 * 1e6 / 15 / 90e9)
    assert point_to_point_time_s(1e6, 50e9, 10e-6) == pytest.approx(30e-6)


def test_causal_attention_pairs():
    assert causal_attention_pairs(4, float("inf")) == 10  # 1 + 2 + 3 + 4
    assert causal_attention_pairs(4, 2) == 7  # 1 + 2 + 2 + 2
    assert causal_attention_pairs(1000, 128) == pytest.approx(128 * 129 / 2 + 872 * 128)


def test_domains_a_token_is_sent_to_under_group_limited_routing():
    from planner.physics.roofline import domains_per_token

    # uniform routing of 8 experts over 4 domains: 4 (1 - (3/4)^8) = 3.5995
    assert domains_per_token(8, 4) == pytest.approx(4 * (1 - 0.75 ** 8))
    # DeepSeek-V3 (8 groups, 4 per token) with one group per node on 8 nodes: exactly the 4 chosen nodes
    assert domains_per_token(8, 8, 8, 4) == pytest.approx(4.0)
    # two groups per node on 4 nodes: a node is missed when none of its 2 groups is among the 4 chosen,
    # C(6, 4) / C(8, 4) = 15/70, so 4 x 55/70 domains
    assert domains_per_token(8, 4, 8, 4) == pytest.approx(4 * 55 / 70)
    # 16 nodes cannot hold whole groups (8 groups): uniform over the 16
    assert domains_per_token(8, 16, 8, 4) == pytest.approx(16 * (1 - (15 / 16) ** 8))
    assert domains_per_token(8, 1, 8, 4) == 1.0
    # Kimi K2 routes without groups (n_group 1): uniform
    assert domains_per_token(8, 8, 1, 1) == pytest.approx(8 * (1 - (7 / 8) ** 8))


def test_a_prefill_pass_crosses_the_nics_once_per_node_its_experts_sit_in(run_estimate):
    """DeepSeek-V3 prefill over four HGX H100 boxes (EP32, attention DP32, 32 prompts of 1024 tokens: 1024 tokens
    per GPU). SGLang reports 7.2k prompt tokens/s per GPU on such a layout (its large-scale EP blog, row SG-01 of
    benchmarks/published.csv); sending each token's 8 copies over the 50 GB/s NICs, as a decode step's low-latency
    kernels do, made the ideal roofline slower than that measurement. DeepEP's prefill kernels send a token once to
    each remote node that holds one of its experts and forward it over NVLink there. With DeepSeek's group-limited
    routing (4 of 8 groups, two groups per node) a node is missed when neither of its groups is chosen:
    C(6,4)/C(8,4) = 15/70, so 4 x 55/70 = 3.14 nodes are hit, 3/4 of them remote: 2.36 NIC crossings per token
    instead of 8 x 3/4 = 6. Dispatch in the experts' fp8 (1 byte), combine in bf16 (2 bytes); the 8 x 31/32 - 6 =
    1.75 copies for the sender's own box move over NVLink (450 GB/s) meanwhile, well under the NIC time."""
    crossings = 4 * 55 / 70 * 3 / 4

    def phase(value_bytes):
        return 1024 * crossings * 7168 * value_bytes / (50e9 * 0.86) + 10e-6

    e = run_estimate("deepseek-v3", "hgx-h100", 32, 1024, 1, ep=32, dp_attn=32, weights="fp8", role=ServingRole.PREFILL)
    assert e.prefill_chunk_step.comm_s == pytest.approx(58 * (phase(1) + phase(2)), rel=1e-9)
    assert 1024 * 1.75 * 7168 * 2 / (450e9 * 0.77) < phase(2)
