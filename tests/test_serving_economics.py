"""Serving economics: prompt caching in KV tiers (claim 9) and disaggregated prefill/decode pools.

Hand-worked figures use the cited numbers of tests/test_roofline_golden.py (Llama 3.1 8B on one
H100: 989.5 TFLOP/s BF16 x 0.803 MAMF, 3.35 TB/s x 0.8, 80 GB, $2.10/h) and the tier prices of
topologies/kv_tiers.yaml (OpenCost's GCP N2 memory rate 0.004237 USD per GiB-hour; local SSD
0.08 USD per GB-month; S3 Standard 0.023 USD per GB-month; 730-hour months).
"""

import json

import numpy as np
import pytest

from planner.architecture import kv_bytes_per_sequence
from planner.cache_report import cache_economics
from planner.cli import main
from planner.deployment import ServingRole
from planner.export import export_plan
from planner.kv_cache import break_even_retention_s, cached_bytes, hit_discount, tiers_for
from planner.paths import data_dir
from planner.plan_report import solve_record
from planner.problem import load_problem, parse_problem, resolve_problem
from planner.solve import solve
from planner.validate import check_plan

L, D, FFN, VOCAB = 32, 4096, 14336, 128256
PER_LAYER = D * 32 * 128 + 2 * D * 8 * 128 + 32 * 128 * D + 3 * D * FFN + 2 * D
F_EFF = 989.5e12 * 0.803
KV_PER_TOKEN = 131_072  # Llama 3.1 8B, bf16


def _solved(name):
    resolved = resolve_problem(load_problem(data_dir("problems") / f"{name}.yaml"))
    return resolved, solve(resolved)


@pytest.fixture(scope="module")
def agent():
    return _solved("prompt-cache-coding-agent")


def test_claim_9_break_even_retention_by_hand(hw, run_estimate):
    """Llama 3.1 8B on one H100, a 1024-token prompt. Prefill is compute-bound: 2 x 6.98e9 FLOPs
    per token plus causal attention over the prompt, at 794.6 TFLOP/s = 17.9 us per token, so
    recomputing a token costs $2.10/h x 17.9 us = $1.04e-8. Holding its 131,072 bytes of KV costs,
    per second, 131,072 x $2.10/h / 80 GB in HBM, 131,072 x 0.004237 USD / GiB-hour in host DRAM,
    131,072 x 0.08 USD / GB-month on local flash. Break-even = recompute / holding."""
    isl = 1024
    pairs = isl * (isl + 1) / 2
    prefill_s = (2 * L * PER_LAYER * isl + 2 * VOCAB * D + 4 * 32 * 128 * L * pairs) / F_EFF
    recompute = 2.10 / 3600 * prefill_s / isl
    e = run_estimate("llama-3.1-8b", "hgx-h100", 32, isl, 256)
    assert e.usd_per_million_input_tokens / 1e6 == pytest.approx(recompute, rel=1e-9)
    tiers = {t.id: t for t in tiers_for(hw.accelerators["h100-sxm"])}
    expected = {
        "hbm": recompute / (KV_PER_TOKEN * 2.10 / 3600 / 80e9),  # 10.9 s: a small model, a large KV per FLOP
        "host-dram": recompute / (KV_PER_TOKEN * 0.004237 / 2**30 / 3600),  # 73 s
        "local-flash": recompute / (KV_PER_TOKEN * 0.08 / 1e9 / (730 * 3600)),  # 44 min
        "remote-storage": recompute / (KV_PER_TOKEN * 0.023 / 1e9 / (730 * 3600)),  # 2.5 h
    }
    for tier, seconds in expected.items():
        assert break_even_retention_s(KV_PER_TOKEN, tiers[tier].usd_per_byte_s, recompute) == pytest.approx(seconds, rel=1e-3)
    assert expected["hbm"] == pytest.approx(10.9, rel=0.02) and expected["local-flash"] == pytest.approx(2630, rel=0.02)
    assert hit_discount(recompute, KV_PER_TOKEN, tiers["local-flash"].usd_per_byte_s, 60) == pytest.approx(expected["local-flash"] / 60)


def test_claim_9_minutes_in_memory_an_hour_in_flash(agent):
    """DeepSeek-V3 on GB200 NVL72 (MLA: 35 KB of fp8 KV per token, 37B active parameters): a
    cached token pays for minutes in HBM or DRAM and for hours on flash or disk; held an hour on
    flash, a hit costs about a tenth of a miss (the lecture's 10x)."""
    _, result = agent
    econ = cache_economics(result, "agent")
    tiers = {t.tier.id: t for t in econ.tiers}
    assert econ.kv_bytes_per_token == pytest.approx(61 * (512 + 64))  # latent + rope key, fp8, 61 layers
    assert 60 < tiers["hbm"].break_even_s < 30 * 60
    assert 5 * 60 < tiers["host-dram"].break_even_s < 3600
    assert tiers["local-flash"].break_even_s > 3600 and tiers["remote-storage"].break_even_s > tiers["local-flash"].break_even_s
    one_hour_on_flash = hit_discount(econ.recompute_usd_per_million_tokens / 1e6, econ.kv_bytes_per_token,
                                     tiers["local-flash"].tier.usd_per_byte_s, 3600)
    assert 5 < one_hour_on_flash < 40
    assert econ.best_tier(3600).tier.id in ("local-flash", "remote-storage")  # an hour does not pay in HBM or DRAM


def test_prompt_cache_in_the_plan(agent):
    resolved, result = agent
    record = solve_record(result)
    assert check_plan(resolved, record, placement=True) == []
    for d in result.deployments:
        c, e = d.candidate, d.estimate
        assert c.kv_tier is not None
        # Little's law by hand: misses write entries at (1 - 0.9) x requests/s, each kept an hour
        prefix_bytes = float(np.sum(kv_bytes_per_sequence(e.inputs.arch, 30720, 1.0)))
        requests = e.sustained_output_tokens_per_s / 512
        held = requests * 0.1 * 3600 * prefix_bytes
        assert e.prompt_cache_bytes_per_accelerator == pytest.approx(held / c.accelerators, rel=1e-9)
        assert cached_bytes(requests, 0.9, 3600, prefix_bytes) == pytest.approx(held)
        # a hit prefills 2,048 new tokens instead of 32,768
        assert e.inputs.prefilled_tokens == pytest.approx(32768 - 0.9 * 30720)
    # without the cache the same traffic costs several times more
    raw = json.loads(json.dumps(record["problem_spec"]))
    del raw["workloads"][0]["prefix_cache"]
    uncached = solve(resolve_problem(parse_problem(raw)), explain=False)
    assert uncached.usd_per_hour > 2 * result.usd_per_hour


def test_cache_command(tmp_path, capsys):
    out = tmp_path / "cache.json"
    assert main(["cache", "prompt-cache-coding-agent", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "break-even retention" in text and "kept 60.0 min" in text
    record = json.loads(out.read_text())
    assert {t["tier"] for t in record["workloads"][0]["tiers"]} == {"hbm", "host-dram", "local-flash", "remote-storage"}


# ---------------------------------------------------------------------------------------------
# disaggregated prefill and decode


@pytest.mark.parametrize(("name", "split"), [("disaggregation-wins-long-prompts", True), ("disaggregation-loses-chat", False)])
def test_the_solver_picks_the_serving_mode_and_says_by_how_much(name, split):
    resolved, result = _solved(name)
    assert result.status == "OPTIMAL"
    w = resolved.workloads[0].name
    assert result.is_split(w) is split
    line = next(x for x in result.explanation.lines() if "serving wins" in x)
    assert ("disaggregated" if split else "aggregated") in line.split("wins")[0]
    margin = float(line.rsplit("(", 1)[1].rstrip("%)"))
    assert margin > 5  # the other mode costs at least 5% more
    assert check_plan(resolved, solve_record(result), placement=True) == []


def test_pair_ttft_by_hand_and_checked():
    resolved, result = _solved("disaggregation-wins-long-prompts")
    p = next(d for d in result.deployments if d.candidate.role is ServingRole.PREFILL)
    q = next(d for d in result.deployments if d.candidate.role is ServingRole.DECODE)
    # 16,384 prompt tokens of fp8 KV for Llama 3.1 70B: 80 layers x 8 KV heads x 128 x 2 (K, V) bytes
    kv = 16384 * 80 * 8 * 128 * 2
    assert p.candidate.kv_handoff_bytes == pytest.approx(kv)
    nic = min(p.candidate.accelerators, q.candidate.accelerators) * 50e9 * 0.86  # ConnectX-7, DeepEP's 0.86
    ttft = p.estimate.ttft_s + kv / nic + q.estimate.ttft_s
    assert result.workload_ttft_s("summarise") == pytest.approx(ttft, rel=1e-9)
    assert ttft <= 10.0
    # the same plan against a tighter TTFT limit: the check names the pair
    record = solve_record(result)
    record["problem_spec"]["workloads"][0]["ttft_limit_ms"] = ttft * 1000 * 0.9
    tight = resolve_problem(parse_problem(record["problem_spec"]))
    assert any("prefill-decode pair gives TTFT" in str(v) for v in check_plan(tight, record))


def test_disaggregated_exports_name_the_transfer_flags():
    _, result = _solved("disaggregation-wins-long-prompts")
    record = solve_record(result)
    vllm = export_plan(record, "vllm")
    assert '"kv_role": "kv_producer"' in vllm and '"kv_role": "kv_consumer"' in vllm and "toy_proxy_server.py" in vllm
    sglang = export_plan(record, "sglang")
    assert "--disaggregation-mode prefill" in sglang and "--disaggregation-mode decode" in sglang
    assert "sglang_router.launch_router --pd-disaggregation" in sglang
    trt = export_plan(record, "trtllm")
    assert "cache_transceiver_config:" in trt and "trtllm-serve disaggregated -c disagg_config_summarise.yaml" in trt
    assert "context_servers:" in trt and "generation_servers:" in trt
