"""The command line, run in-process."""

import json

import pytest

from planner.cli.main import main

ESTIMATE_FIELDS = ["tpot_s", "ttft_s", "output_tokens_per_s_per_accelerator", "usd_per_million_output_tokens", "step_time_s",
                   "memory_bytes_per_accelerator"]


def test_estimate_llama_70b_on_one_hgx_h100(tmp_path, capsys):
    out = tmp_path / "llama.json"
    code = main(["estimate", "--model", "llama-3.1-70b", "--rack", "hgx-h100", "--tp", "8", "--batch", "64",
                 "--isl", "2048", "--osl", "128", "--weights-precision", "bf16", "--kv-precision", "bf16", "--json", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    for name in ESTIMATE_FIELDS:
        assert name in record
    assert set(record["step_time_s"]) >= {"compute", "weights", "kv", "comm"}
    assert set(record["memory_bytes_per_accelerator"]) >= {"weights", "kv", "activations", "capacity"}
    assert record["memory_bytes_per_accelerator"]["capacity"] == 81_559 * 2**20  # what nvidia-smi reports
    assert record["accelerators"] == 8 and record["fits_hbm"]
    # 70.55e9 bf16 parameters over 8 GPUs: 17.64 GB each
    assert record["memory_bytes_per_accelerator"]["weights"] == pytest.approx(70.55e9 * 2 / 8, rel=1e-3)
    steps = record["step_time_s"]
    # calibrated (the default): every kernel's time sits in one term, so the terms add up to TPOT
    assert record["step_model"] == "calibrated"
    assert record["mean_step_per_token_s"] == pytest.approx(sum(steps[k] for k in ("compute", "weights", "kv", "comm", "overhead")))
    assert record["tpot_s"] < record["mean_step_per_token_s"]  # a user does not wait on its own prompt
    low, high = record["tpot_s_range"]
    assert low < record["tpot_s"] < high
    assert record["roofline"]["tpot_s"] < record["tpot_s"] and 0 < record["roofline"]["fraction_reached"] < 1
    printed = capsys.readouterr().out
    assert "dominant" in printed and "Assumptions" in printed


def test_estimate_deepseek_v3_fp8_on_gb200_nvl72(tmp_path):
    out = tmp_path / "ds.json"
    code = main(["estimate", "--model", "deepseek-v3", "--rack", "gb200-nvl72", "--ep", "64", "--batch", "4096",
                 "--isl", "3072", "--osl", "1024", "--weights-precision", "fp8", "--kv-precision", "fp8", "--json", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    assert record["layout"] == {"tp": 1, "ep": 64, "pp": 1, "dp_attn": 64, "expert_tp": 1}
    assert record["precisions"]["compute"] == "fp8"
    assert record["links"]["stage_link_kind"] == "scale_up"
    # TensorRT-LLM (the default engine) reserves each of the 64 sequences per GPU at its whole
    # 3072 + 1024 tokens (GUARANTEED_NO_EVICT), 35,136 B per token (fp8 MLA latent)
    assert record["memory_bytes_per_accelerator"]["kv"] == pytest.approx(64 * 4096 * 35136, rel=1e-9)
    for name in ESTIMATE_FIELDS:
        assert name in record
    # SGLang pages them at the mean length (3072 + 512) + 10% headroom
    assert main(["estimate", "--model", "deepseek-v3", "--rack", "gb200-nvl72", "--ep", "64", "--batch", "4096", "--isl", "3072",
                 "--osl", "1024", "--weights-precision", "fp8", "--kv-precision", "fp8", "--engine", "sglang", "--json", str(out)]) == 0
    paged = json.loads(out.read_text())["memory_bytes_per_accelerator"]["kv"]
    assert paged == pytest.approx(64 * 3584 * 1.1 * 35136, rel=1e-9)


def test_estimate_from_a_bundled_problem(tmp_path):
    out = tmp_path / "p.json"
    assert main(["estimate", "llama-3.1-70b-hgx-h100", "--tp", "8", "--batch", "32", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["input_tokens"] == 2048



def test_estimate_a_pool_replica_and_a_prompt_cache_tier(tmp_path, capsys):
    """The TTFT parts add up in each role (Poisson arrivals: a request waits half a step or pass on
    average, 0.9 of one at the 90th percentile, then its own service). A prefill replica with one
    16,384-token prompt per pass cuts it into two 8,192-token chunks: two passes. A decode replica's
    request joins the next step and leaves with it. An aggregated replica with a prompt cache in
    remote storage: a miss rides its 32,768 tokens in four 8,192-token chunks, one step each; a hit
    reloads 50 ms + prefix bytes over 4 x 0.64 x 50 GB/s, then rides its uncached 2,048 tokens in
    one step that carries a quarter of a chunk's extra time; 90% of requests hit."""
    out = tmp_path / "e.json"
    assert main(["estimate", "disaggregation-wins-long-prompts", "--tp", "1", "--batch", "1", "--role", "prefill", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    pass_s = r["prefill_chunk_step_time_s"]["total"]
    assert r["role"] == "prefill" and r["queue_wait_s"] == pytest.approx(pass_s / 2)
    assert r["prefill_latency_s"] == pytest.approx(2 * pass_s)
    assert r["ttft_s"] == pytest.approx(2.5 * pass_s) and r["ttft_p90_s"] == pytest.approx(2.9 * pass_s)
    assert main(["estimate", "disaggregation-wins-long-prompts", "--tp", "4", "--batch", "64", "--role", "decode", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["queue_wait_s"] == pytest.approx(r["tpot_s"] / 2)  # one stage: a step is TPOT
    assert r["ttft_s"] == pytest.approx(1.5 * r["tpot_s"]) and r["ttft_p90_s"] == pytest.approx(1.9 * r["tpot_s"])
    assert main(["estimate", "prompt-cache-coding-agent", "--tp", "2", "--dp-attn", "2", "--ep", "4", "--batch", "14",
                 "--cache-tier", "remote-storage", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    step_s, carrying_s = r["step_time_s"]["total"], r["prefill_latency_s"] / 4
    hit = 0.050 + 30720 * 35136 / (4 * 0.64 * 50e9) + step_s + (carrying_s - step_s) * 2048 / 8192
    assert r["cache_hit_latency_s"] == pytest.approx(hit, rel=1e-9)
    assert r["ttft_s"] == pytest.approx(step_s / 2 + 0.1 * r["prefill_latency_s"] + 0.9 * hit)
    assert r["ttft_p90_s"] == pytest.approx(0.9 * step_s + max(r["prefill_latency_s"], hit))  # misses are 10% of requests
    capsys.readouterr()
    assert main(["estimate", "llama-3.1-70b-hgx-h100", "--tp", "8", "--batch", "8", "--cache-tier", "hbm"]) == 2
    assert "--cache-tier" in capsys.readouterr().err  # no prefix_cache to place
    assert main(["estimate", "prompt-cache-coding-agent", "--tp", "2", "--dp-attn", "2", "--ep", "4", "--batch", "14",
                 "--cache-tier", "flash"]) == 2
    assert "did you mean 'local-flash'" in capsys.readouterr().err

def test_estimate_that_does_not_fit_exits_3(capsys):
    assert main(["estimate", "--model", "deepseek-v3", "--rack", "hgx-h100", "--tp", "8", "--ep", "8", "--batch", "64"]) == 3
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_bad_flags_exit_2_with_the_flag_named(capsys):
    assert main(["estimate", "--model", "llama-3.1-70b", "--rack", "hgx-h100", "--tp", "3", "--batch", "64"]) == 2
    err = capsys.readouterr().err
    assert "--tp" in err and "not divisible by tp=3" in err and "Traceback" not in err
    assert main(["estimate", "--model", "deepseek-v4", "--rack", "hgx-h100", "--batch", "8"]) == 2
    assert "did you mean" in capsys.readouterr().err
    assert main(["estimate", "--model", "llama-3.1-8b", "--rack", "hgx-h100", "--ep", "64", "--batch", "64"]) == 2
    assert "dense" in capsys.readouterr().err


def test_schema_and_catalog(capsys, tmp_path):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "workloads" in schema["properties"]
    out = tmp_path / "catalog.json"
    assert main(["catalog", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert {r["id"] for r in record["racks"]} >= {"hgx-h100", "gb200-nvl72", "gb300-nvl72"}
    assert "deepseek-v3" in capsys.readouterr().out
    remote = next(r for r in record["kv_tiers"] if r["id"] == "remote-storage")
    assert remote["first_byte_latency_s"] == 0.050 and remote["cost"] == "0.023 USD per GB-month"
    assert main(["catalog", "kv-tiers"]) == 0
    assert "S3_STANDARD" in capsys.readouterr().out


def test_redundant_expert_slots_make_ep72_of_256_experts_expressible(tmp_path, capsys, models):
    """SGLang's EP72 decode pool holds 256 experts + 32 redundant copies: 288 slots, 4 per GPU. Without
    the redundant slots 256 does not split over 72 ranks, and the message says how many to add. Each GPU
    then holds 4 experts' weights per MoE layer: 288/256 of an even 72-way split."""
    from planner.model.architecture import param_counts

    base = ["estimate", "--model", "deepseek-v3", "--rack", "hgx-h100", "--ep", "72", "--dp-attn", "72", "--batch", "18432",
            "--isl", "2000", "--osl", "1", "--role", "decode", "--weights-precision", "fp8", "--kv-precision", "fp8"]
    assert main(base) == 2
    assert "add 32 redundant experts (288 slots, 4 per rank)" in capsys.readouterr().err
    out = tmp_path / "ep72.json"
    assert main(base + ["--redundant-experts", "32", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    counts = param_counts(models["deepseek-v3"])
    dense_per_gpu = counts.total - counts.layers_routed_total  # attention, dense layers, shared experts, embeddings: on every rank
    expected = dense_per_gpu + counts.layers_routed_total * 288 / 256 / 72  # fp8: one byte per weight
    assert record["memory_bytes_per_accelerator"]["weights"] == pytest.approx(expected, rel=0.01)


def test_expert_kernels_follow_the_models_routing_skew(tmp_path):
    # aiconfigurator-core 0.12.0's H100 TensorRT-LLM MoE tables (fp8_block) measured under power-law
    # routing (alpha 1.01) run 1.36x (4,096 tokens) to 1.47x (16,384) the balanced latency in the
    # median over shapes; the whole step, with attention and dense GEMMs unchanged, slows by less.
    args = ["estimate", "--model", "deepseek-v3", "--rack", "hgx-h100", "--ep", "8", "--batch", "4096", "--isl", "1024",
            "--osl", "1024", "--weights-precision", "fp8", "--kv-precision", "fp8"]
    steps = {}
    for routing in ("default", "balanced"):
        out = tmp_path / f"{routing}.json"
        extra = [] if routing == "default" else ["--expert-routing", routing]
        assert main(args + extra + ["--json", str(out)]) in (0, 3)
        record = json.loads(out.read_text())
        steps[routing] = record["tpot_s"]
        if routing == "default":
            assert any("power law 1.01 routing" in a for a in record["assumptions"])
    assert 1.05 < steps["default"] / steps["balanced"] < 1.47
    # an imbalance given by hand is the rank skew itself: the kernels then run at balanced routing
    out = tmp_path / "given.json"
    assert main(args + ["--expert-imbalance", "1.1", "--json", str(out)]) in (0, 3)
    assert any("balanced routing" in a for a in json.loads(out.read_text())["assumptions"])
