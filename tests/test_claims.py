"""The lecture's claims (docs/physics.md), reproduced by the planner's own formulas.

Each expected value is worked out here from cited figures: accelerator datasheets (H100 989.5
TFLOP/s BF16, 3.35 TB/s, 80 GB; B200/GB200 8 TB/s, 186 GB, 5 PFLOP/s FP8; GB300 288 GB, 100 GB/s
ConnectX-8; NVLink 5 900 GB/s per direction), achievable fractions (MAMF 0.803 BF16 on H100;
AIConfigurator 0.8 of HBM; DeepEP 0.77 of NVLink and 0.86 of a NIC) and model config.json files.
"""

import math

import pytest

from planner.model.architecture import kv_bytes_per_token, param_counts
from planner.model.catalog import ModelSpec, arch_from_spec
from planner.modes import ServingRole
from planner.physics.roofline import (
    critical_batch_size,
    hbm_drain_time_s,
    kv_compute_crossover_context_tokens,
)

H100_F, H100_BW, H100_HBM = 989.5e12, 3.35e12, 80e9
F_EFF_H100_BF16, BW_EFF = 989.5e12 * 0.803, 0.8  # MAMF; AIConfigurator (BW_EFF is the fraction)
LATENCY = 10e-6  # AIConfigurator p2p latency per collective
DECODE = ServingRole.DECODE  # claims about decode alone use decode-only replicas (no prefill riding in the steps)


def test_claim_1_unbatched_decode_costs_about_a_thousand_times_more(run_estimate):
    """DeepSeek-V3 on a GB200 NVL72 rack: one sequence at a time vs a batch of 4096.

    By hand: batched, a step reads each GPU's ~27 GB of weights (4.1 ms at 6.4 TB/s) plus KV and
    all-to-alls, ~8 ms for 4096 tokens. Unbatched (TP64 so that one sequence uses the whole rack),
    a step is dominated by fixed collective latencies: an all-reduce after each of the 61 attention
    blocks and after each of the 61 MLP or MoE blocks (with attention tensor-parallel every rank holds
    the token, computes its own experts and the all-reduce sums them: no dispatch), 122 collectives
    of 10 us = 1.22 ms for ONE token. Ratio ~ 4096 x 1.22 / 8 ~ 600.
    """
    batched = run_estimate("deepseek-v3", "gb200-nvl72", 4096, 2048, 512, ep=64, weights="fp8", kv="fp8", role=DECODE)
    single = run_estimate("deepseek-v3", "gb200-nvl72", 1, 2048, 512, tp=64, ep=64, dp_attn=1, weights="fp8", kv="fp8", role=DECODE)
    latency_floor = (61 + 61) * LATENCY
    assert single.tpot_s > latency_floor
    ratio = single.usd_per_million_decode_tokens / batched.usd_per_million_decode_tokens
    hand_ratio = 4096 * latency_floor / batched.tpot_s
    assert ratio == pytest.approx(hand_ratio, rel=0.15)
    assert 500 < ratio < 3000  # "~1000x"


def test_claim_2_critical_batch_is_300_times_sparsity(models, run_estimate):
    # Dense H100 at matched precision (bf16 weights, bf16 compute): F / BW = 989.5 / 3.35 = 295.4
    assert critical_batch_size(H100_F, H100_BW, 2.0, 1.0, 1.0) == pytest.approx(295.37, rel=1e-3)
    # DeepSeek-V3 on GB200 in fp8: F/BW = 5000/8 = 625, b_w/2 = 0.5, sparsity = N_total / N_active
    counts = param_counts(models["deepseek-v3"])
    sparsity = counts.total / counts.active_matmul  # 671.0B / 36.6B = 18.3
    assert sparsity == pytest.approx(671.03 / 36.62, rel=1e-3)
    b_star = critical_batch_size(5000e12, 8e12, 1.0, counts.total, counts.active_matmul)
    assert b_star == pytest.approx(625 * 0.5 * 18.32, rel=2e-3)  # ~5,700: "a few thousand tokens in flight"
    # The composed roofline agrees: on a single H100, Llama 3.1 8B at B* = F_eff / BW_eff (bf16,
    # every fetched weight active) has compute time equal to weight-fetch time.
    b_star_eff = F_EFF_H100_BF16 / (H100_BW * BW_EFF)  # 296.5
    e = run_estimate("llama-3.1-8b", "hgx-h100", round(b_star_eff), 1, 1)
    assert e.decode_step.compute_s == pytest.approx(e.decode_step.weights_s, rel=0.01)
    # MoE: DeepSeek-V3 with every weight sharded 64 ways (TP64 x EP64) crosses at its own B*
    b_star_ds = (5000e12 * 0.723) / (8e12 * BW_EFF) * 0.5 * counts.total / counts.active_matmul
    e = run_estimate("deepseek-v3", "gb200-nvl72", round(b_star_ds), 1, 1, tp=64, ep=64, dp_attn=1, weights="fp8")
    assert e.decode_step.compute_s == pytest.approx(e.decode_step.weights_s, rel=0.05)


@pytest.mark.parametrize("accel, capacity, bandwidth", [
    ("h100-sxm", 81_559 * 2**20, 3.35e12),  # 23.9 ms
    ("h200-sxm", 143_771 * 2**20, 4.8e12),  # 29.4 ms
    ("b200", 183_359 * 2**20, 8.0e12),  # 22.5 ms
    ("gb200", 189_471 * 2**20, 8.0e12),  # 23.3 ms
    ("tpu-v5e", 16e9, 0.819e12),  # 19.5 ms
    ("tpu-v6e", 32e9, 1.638e12),  # 19.5 ms
    ("tpu-v7", 206.2e9, 7.38e12),  # 27.9 ms
])
def test_claim_3_hbm_drain_time_is_15_to_30_ms(hw, accel, capacity, bandwidth):
    a = hw.accelerators[accel]
    drain = hbm_drain_time_s(a.hbm_capacity_bytes, a.hbm_bandwidth_bytes_per_s)
    assert drain == pytest.approx(capacity / bandwidth)
    # "about 15-30 ms": with the capacity the devices report (H200: 143,771 MiB = 150.8 GB for a
    # "141 GB" part) the H200 drains in 31.4 ms, so the band is read as 15-32 ms
    assert 15e-3 <= drain <= 32e-3


def test_claim_3_every_hbm_part_drains_in_tens_of_ms(hw):
    # The 288 GB parts (B300, GB300, MI355X) and MI325X grew capacity faster than bandwidth: 36-43 ms.
    drains = {a.id: hbm_drain_time_s(a.hbm_capacity_bytes, a.hbm_bandwidth_bytes_per_s) for a in hw.accelerators.values()}
    assert all(10e-3 <= d <= 45e-3 for d in drains.values()), drains


def test_claim_3_a_full_hbm_departs_every_drain_time_and_waits_two_departures_at_worst(run_estimate):
    """Llama 3.1 70B TP8 on HGX H100 with a batch that fills HBM: a memory-bound step reads what
    HBM holds, so the step time approaches C / BW_eff = 80 GB / 2.68 TB/s = 29.9 ms."""
    # KV room: 80 GB - 17.6 GB weights - 4.4 GB activations = 58 GB / (4352 tokens x 40,960 B) = 325 sequences
    e = run_estimate("llama-3.1-70b", "hgx-h100", 320, 4096, 256, tp=8)
    assert 0.85 < e.memory.fill_fraction <= 1.0
    assert e.decode_step.bound == "memory"
    drain_eff = H100_HBM / (H100_BW * BW_EFF)
    fetched = e.decode_step.memory_s * H100_BW * BW_EFF  # bytes read per step per GPU
    assert fetched == pytest.approx(e.memory.weights_bytes + e.memory.kv_bytes * (4096 + 128) / (4096 + 256), rel=0.02)
    assert e.decode_step.memory_s == pytest.approx(drain_eff, rel=0.15)
    # a request waits for the step in progress (a Poisson arrival lands uniformly in it: half a
    # departure on average, a whole one at worst), then leaves with the step that carries its prompt,
    # itself at least one departure: two departures at worst (claim 3)
    assert e.queue_wait_s == pytest.approx(0.5 * e.stage_time_s)
    assert e.prefill_latency_s >= e.stage_time_s
    assert e.ttft_s == pytest.approx(0.5 * e.stage_time_s + e.prefill_latency_s)
    assert e.ttft_p90_s == pytest.approx(0.9 * e.stage_time_s + e.prefill_latency_s)


def test_claim_4_moe_experts_stay_inside_one_nvl72_rack(hw, run_estimate):
    """256 experts over 64 GPUs = 4 per GPU, all-to-all on NVLink. Across two racks the all-to-all
    runs on the NICs: on GB300 (ConnectX-8, 100 GB/s) that is (900 x 0.77) / (100 x 0.86) = 8.1x
    less bandwidth per GPU, the lecture's ~8x."""
    inside = run_estimate("deepseek-v3", "gb300-nvl72", 4096, 2048, 512, ep=64, weights="fp8", kv="fp8")
    assert 256 // inside.inputs.layout.ep == 4
    assert inside.links.stage.link_kind == "scale_up" and not inside.links.stage.spans_domains
    assert inside.links.n_scale_up_domains == 1
    across = run_estimate("deepseek-v3", "gb300-nvl72", 8192, 2048, 512, ep=128, weights="fp8", kv="fp8")
    assert across.links.stage.link_kind == "scale_out" and across.links.n_scale_up_domains == 2
    gb300 = hw.accelerators["gb300"]
    ratio = (gb300.scale_up_bandwidth_bytes_per_s * gb300.scale_up_bandwidth_fraction) / (
        gb300.scale_out_bandwidth_bytes_per_s * gb300.scale_out_bandwidth_fraction)
    assert ratio == pytest.approx(900 * 0.77 / (100 * 0.86))
    assert 7.5 < ratio < 8.5
    # Same tokens per GPU in both (64 per GPU). The ideal exchange dispatches in the expert GEMMs' fp8
    # (1 byte a value) and combines in bf16 (2 bytes). Inside the rack a token's 8 copies go to the 63
    # other GPUs' experts over NVLink with probability 63/64 each. Across two racks half of the experts
    # sit in the other rack: a decode step sends those 4 copies over the NICs (low-latency kernels send
    # every copy), while the 8 x 127/128 - 4 = 3.94 copies for the sender's own rack move over NVLink at
    # the same time, in 64 x 3.94 x 7168 / 693 GB/s = 2.6 us against 21 us on the NICs.
    def phase(copies, value_bytes, link_bytes_per_s):
        return 64 * copies * 7168 * value_bytes / link_bytes_per_s + LATENCY
    nvlink, nic = 900e9 * 0.77, 100e9 * 0.86
    inside_a2a = phase(8 * 63 / 64, 1, nvlink) + phase(8 * 63 / 64, 2, nvlink)
    across_a2a = phase(4, 1, nic) + phase(4, 2, nic)
    assert inside.decode_step.comm_s == pytest.approx(58 * inside_a2a, rel=1e-6)
    assert across.decode_step.comm_s == pytest.approx(58 * across_a2a, rel=1e-6)
    # 4.87 ms vs 2.07 ms per token: 2.4x; half the copies stay in the rack and the fixed 10 us per
    # collective dilutes the 8x bandwidth gap
    assert across.decode_step.comm_s > 2 * inside.decode_step.comm_s


def _two_trillion_moe() -> ModelSpec:
    """A Kimi-K2-like MoE with 768 experts: ~2.0T parameters."""
    return ModelSpec(
        id="moe-2t", name="2T MoE", n_layers=61, hidden_size=7168, vocab_size=163840,
        attention={"kind": "mla", "n_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
                   "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
        dense_intermediate_size=18432,
        moe={"n_routed_experts": 768, "experts_per_token": 8, "expert_intermediate_size": 2048,
             "n_shared_experts": 1, "first_dense_layers": 1},
        max_context_tokens=131072,
    )


def test_claim_5_a_blackwell_rack_holds_what_a_hopper_box_cannot(hw, run_estimate):
    hopper = hw.racks["hgx-h100"]
    gb200, gb300 = hw.racks["gb200-nvl72"], hw.racks["gb300-nvl72"]
    assert hopper.n_accelerators * hopper.accelerator.hbm_capacity_bytes == 8 * 81_559 * 2**20  # 684 GB ("8 x 80 GB")
    assert gb200.n_accelerators * gb200.accelerator.hbm_capacity_bytes == pytest.approx(72 * 189_471 * 2**20)  # 14.3 TB
    assert gb300.n_accelerators * gb300.accelerator.hbm_capacity_bytes == pytest.approx(72 * 288e9)  # 20.7 TB
    arch = arch_from_spec(_two_trillion_moe())
    total = param_counts(arch).total
    assert 1.9e12 < total < 2.1e12  # 60 x 768 x 3 x 7168 x 2048 = 2.03T routed + 0.03T rest
    # fp8: 2.0 TB of weights. One Hopper box holds 640 GB: no layout of its 8 GPUs can fit.
    assert total * 1.0 > 8 * 81_559 * 2**20
    hopper_try = run_estimate(None, "hgx-h100", 64, 8192, 1024, tp=8, ep=8, weights="fp8", kv="fp8", arch=arch)
    assert not hopper_try.fits
    assert hopper_try.memory.weights_bytes == pytest.approx(total / 8)  # each GPU would need 255 GB
    # One GB300 NVL72 rack: 64 GPUs x 288 GB; weights ~32 GB per GPU plus an 8K-context KV cache.
    blackwell = run_estimate(None, "gb300-nvl72", 1024, 8192, 1024, ep=64, weights="fp8", kv="fp8", arch=arch)
    assert blackwell.fits
    assert blackwell.memory.weights_bytes == pytest.approx(total / 64 + 0.5e9, rel=0.5)


def test_claim_6_pipelining_splits_weights_not_kv(run_estimate):
    """Llama 3.1 70B (80 layers of 855,654,400 parameters, vocab matrix 1,050,673,152) on HGX H100.
    Two stages of TP8 with twice the sequences in flight (one micro-batch per stage, as before)."""
    per_layer = 8192 * 8192 * 2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    vocab = 128256 * 8192
    one = run_estimate("llama-3.1-70b", "hgx-h100", 64, 2048, 256, tp=8)
    two = run_estimate("llama-3.1-70b", "hgx-h100", 128, 2048, 256, tp=8, pp=2)
    assert one.memory.weights_bytes == pytest.approx((80 * per_layer + 2 * vocab + 8192) * 2 / 8)
    assert two.memory.weights_bytes == pytest.approx((40 * per_layer + vocab + 8192) * 2 / 8)  # last stage
    kv_per_gpu = 64 * (2048 + 256) * (2 * 8 * 128 * 2 * 80) / 8  # 64 sequences' KV, 8 KV heads over 8 GPUs
    assert one.memory.kv_bytes == pytest.approx(kv_per_gpu)
    assert two.memory.kv_bytes == pytest.approx(kv_per_gpu)  # does NOT drop
    assert two.mean_step_per_token_s == pytest.approx(2 * two.stage_time_s)  # a token crosses both stages


def test_claim_7_kv_fetch_overtakes_compute_at_a_batch_independent_context(models, run_estimate):
    """Llama 3.1 70B on H100 (bf16): S* = 2 N_active BW / (F kv)
    = 2 x 69.50e9 x 3.35e12 / (989.5e12 x 327,680) = 1,436 tokens at peak rates."""
    active = 80 * (8192 * 8192 * 2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192) + 128256 * 8192
    kv = 2 * 8 * 128 * 2 * 80
    assert kv_bytes_per_token(models["llama-3.1-70b"], 2.0) == kv == 327_680
    s_star = kv_compute_crossover_context_tokens(active, H100_BW, H100_F, kv)
    assert s_star == pytest.approx(2 * 69.503e9 * 3.35e12 / (989.5e12 * 327680), rel=1e-4)
    assert s_star == pytest.approx(1436, rel=1e-3)
    s_star_eff = 2 * active * H100_BW * BW_EFF / (F_EFF_H100_BF16 * kv)  # 1,431 with achievable rates

    def crossover(batch: int) -> float:
        lo, hi = 16, 100_000
        while hi - lo > 1:
            mid = (lo + hi) // 2
            step = run_estimate("llama-3.1-70b", "hgx-h100", batch, mid, 2, tp=8).decode_step
            lo, hi = (mid, hi) if step.kv_s < step.compute_s else (lo, mid)
        return hi + 1  # mean decode context = input + output / 2

    small, large = crossover(16), crossover(256)
    assert small == pytest.approx(large, abs=2)  # independent of batch
    # Attention FLOPs (4 x 64 x 128 x 80 = 2.6 MFLOP per context token, 2.7% of the 96.8 MFLOP a
    # token of KV costs in fetch time) push the crossover slightly past the closed form.
    assert small == pytest.approx(s_star_eff, rel=0.04)
    assert small > s_star_eff


def test_claim_8_output_tokens_cost_about_five_times_input_tokens(run_estimate):
    """Llama 3.1 8B on one H100, batch 128, 1024 in / 256 out.
    Decode: max(2 N B / F, (2 N + B S kv) / BW) with N = 7.505e9, S = 1152, kv = 131,072 B:
      compute 2.42 ms; weights 5.60 ms + KV 7.21 ms = 12.81 ms per 128 tokens = 100 us per token.
    Prefill of 1024 tokens: compute 18.34 ms = 17.9 us per token. Output / input = 5.6."""
    active = 7_504_920_576
    layers = 32 * 218_112_000
    decode = max((2 * active * 128 + 524_288 * 1152 * 128) / F_EFF_H100_BF16,
                 (2 * active + 128 * 1152 * 131_072) / (H100_BW * BW_EFF)) / 128
    prefill = (2 * layers * 1024 + 2 * 525_336_576 + 524_288 * 1024 * 1025 / 2) / F_EFF_H100_BF16 / 1024
    e = run_estimate("llama-3.1-8b", "hgx-h100", 128, 1024, 256)
    assert e.decode_step.bound == "memory" and e.prefill_chunk_step.bound == "compute"
    ratio = e.usd_per_million_decode_tokens / e.usd_per_million_prefill_tokens
    assert ratio == pytest.approx(decode / prefill, rel=1e-6)
    assert 4 < ratio < 7  # "~5x"


def test_claim_10_fast_mode_buys_speed_at_a_steep_price(run_estimate):
    """Llama 3.1 70B, TP8 on one HGX H100, 8K prompts: speed bought by shrinking the batch.

    By hand: cost per token is price x G x TPOT / B (docs/physics.md), so going from batch B1 to B2 at
    speed-up s = TPOT(B1) / TPOT(B2) multiplies the price per token by r / s, r = B1 / B2.
    Memory-bound with compute hidden, TPOT(B) = t_0 + B t_kv (weights and collectives fixed, KV per
    sequence); with a = B1 t_kv / t_0 the batch share of the baseline step, s = (1 + a) / (1 + a / r),
    so r = a s / (1 + a - s) and the price multiple is a / (1 + a - s). It exceeds s whenever a < s
    (the fixed part is more than a third of the step for s = 2.5), and the lecture's "2.5x speed for
    ~6x price" is a = 1.8. Here the HBM-bound batch has a ~ 2.4: 2.5x speed costs ~2.7x."""
    isl, osl, s = 8192, 512, 2.5

    def at(batch):
        return run_estimate("llama-3.1-70b", "hgx-h100", batch, isl, osl, tp=8, role=DECODE)

    b1 = 64
    while at(b1 * 2).memory.fits:
        b1 *= 2
    slow = at(b1)
    lo, hi = 1, b1  # bisection: the largest batch with at least s times the speed
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if slow.tpot_s / at(mid).tpot_s >= s else (lo, mid)
    fast = at(lo)
    assert slow.decode_step.bound == fast.decode_step.bound == "memory"
    speedup = slow.tpot_s / fast.tpot_s
    price = fast.usd_per_million_decode_tokens / slow.usd_per_million_decode_tokens
    assert price == pytest.approx((b1 / lo) / speedup, rel=1e-9)  # cost per token = price x G x TPOT / B
    # the affine step of the docstring, from TPOT at batch 1 and at B1
    t_kv = (slow.tpot_s - at(1).tpot_s) / (b1 - 1)
    t_0 = at(1).tpot_s - t_kv
    a = b1 * t_kv / t_0
    assert a == pytest.approx(2.4, abs=0.2)
    assert price == pytest.approx(a / (1 + a - s), rel=0.1)
    assert speedup >= s and price > speedup  # steep: the price grows faster than the speed
    assert 1.8 / (1 + 1.8 - s) == pytest.approx(6.0)  # the lecture's figure


def test_claim_12_scale_up_domain_size_matters_more_than_flops(hw, run_estimate):
    """DeepSeek-V3 fp8 over 64 Blackwell GPUs: in one GB200 NVL72 rack vs eight HGX B200 boxes.
    Per-GPU FP8 FLOP/s differ by 5000/4500 = 1.11x and HBM bandwidth not at all, but in boxes the
    expert all-to-all crosses the 50 GB/s NICs instead of 900 GB/s NVLink."""
    rack = run_estimate("deepseek-v3", "gb200-nvl72", 4096, 2048, 512, ep=64, weights="fp8", kv="fp8")
    boxes = run_estimate("deepseek-v3", "hgx-b200", 4096, 2048, 512, ep=64, weights="fp8", kv="fp8")
    flops_ratio = hw.accelerators["gb200"].dense_flops_per_s["fp8"] / hw.accelerators["b200"].dense_flops_per_s["fp8"]
    assert flops_ratio == pytest.approx(5000 / 4500)
    # dispatch in fp8 (1 byte), combine in bf16 (2 bytes); in the rack a token's 8 copies reach the other 63
    # GPUs over NVLink (63/64 each); over eight boxes 8 x 7/8 = 7 of them cross the NICs, which set the pace
    copies_rack, copies_nic = 8 * 63 / 64, 8 * 7 / 8
    comm_rack = 58 * sum(64 * copies_rack * 7168 * b / (900e9 * 0.77) + LATENCY for b in (1, 2))
    comm_boxes = 58 * sum(64 * copies_nic * 7168 * b / (50e9 * 0.86) + LATENCY for b in (1, 2))
    assert rack.decode_step.comm_s == pytest.approx(comm_rack, rel=1e-6)
    assert boxes.decode_step.comm_s == pytest.approx(comm_boxes, rel=1e-6)
    speedup = rack.output_tokens_per_s_per_accelerator / boxes.output_tokens_per_s_per_accelerator
    assert speedup > 2 * flops_ratio
    # The next generations widen the domain: Rubin Ultra NVL576 puts 144 packages in one domain,
    # so an EP128 layout that spans two NVL72 racks stays on NVLink.
    assert hw.racks["rubin-ultra-nvl576"].n_accelerators == 144
    ultra = run_estimate("deepseek-v3", "rubin-ultra-nvl576", 8192, 2048, 512, ep=128, weights="fp8", kv="fp8")
    nvl72 = run_estimate("deepseek-v3", "gb200-nvl72", 8192, 2048, 512, ep=128, weights="fp8", kv="fp8")
    assert ultra.links.stage.link_kind == "scale_up" and nvl72.links.stage.link_kind == "scale_out"
    assert math.isfinite(ultra.tpot_s)
