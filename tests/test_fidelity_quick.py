"""Smoke test of the fidelity benchmark: `benchmarks/fidelity.py --quick` runs `planner estimate` on a
few published rows and produces well-formed output. It does not judge the planner's accuracy."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "fidelity.py"


def test_quick_fidelity_run_is_well_formed(tmp_path):
    out_json, out_csv = tmp_path / "fidelity.json", tmp_path / "fidelity.csv"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--json", str(out_json), "--csv", str(out_csv)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out_json.read_text())
    rows, summary = record["rows"], record["summary"]
    assert len(rows) >= 3 and summary["rows"] == len(rows)
    for row in rows:
        assert row["error"] is None, (row["id"], row["error"])
        assert math.isfinite(row["predicted"]) and row["predicted"] > 0, row["id"]
        assert math.isfinite(row["ratio"]) and row["ratio"] > 0, row["id"]
        assert row["abs_error"] == abs(row["ratio"] - 1)
        assert row["id"] in proc.stdout
    assert summary["evaluated"] == len(rows)
    assert math.isfinite(summary["median_abs_error"]) and 0 <= summary["share_within_20pct"] <= 1
    assert "median |error|" in proc.stdout
    assert out_csv.read_text().count("\n") == len(rows) + 1


def test_range_fields_are_read_when_present():
    sys.path.insert(0, str(SCRIPT.parent))
    import fidelity

    row = {"id": "x", "planner_mode": "inflight"}
    record = {"accelerators": 2, "output_tokens_per_s_per_accelerator": 100.0,
              "output_tokens_per_s_per_accelerator_range": [80.0, 130.0]}
    out = {"measured": 120.0}
    fidelity._compare(out, row, record)
    assert out["range"] == [80.0, 130.0] and out["range_covers"] is True
    assert fidelity.predicted(row, {"accelerators": 2, "output_tokens_per_s_per_accelerator": 1.0}, "low") is None


def test_held_out_perf_overview_rows_map_onto_the_planner(tmp_path):
    # one dense, one expert-parallel and one gpt-oss row of the held-out set evaluate without error
    out_json = tmp_path / "held_out.json"
    ids = "PO-llama-33-70b-H200-1024-1024,PO-deepseek-r1-B200-1024-1024,PO-gpt-oss-120b-H100-8192-1024"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--published", str(ROOT / "benchmarks" / "published_perf_overview.csv"),
                           "--ids", ids, "--json", str(out_json)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out_json.read_text())["rows"]
    assert sorted(r["id"] for r in rows) == sorted(ids.split(","))  # in file order
    assert all(r["error"] is None and r["predicted"] > 0 and r["batch"] > 0 for r in rows)
    # trtllm-bench's own limits bound the batch: DeepSeek-R1 FP4 on 4 B200 (DEP4) at 1K/1K holds at most 384 per
    # attention rank (TensorRT-LLM tuning.py: (4 x 179.06 GiB - 393.6e9 x 0.5 B) x 0.9 / (2 x 61 x 128 x 56 B x 2048)
    # = 287.6 requests, rounded up to a multiple of 128); gpt-oss's MXFP4 is not tuned: BuildConfig's 2048 per rank
    by_id = {r["id"]: r for r in rows}
    assert by_id["PO-deepseek-r1-B200-1024-1024"]["batch"] <= 384 * 4
    assert by_id["PO-gpt-oss-120b-H100-8192-1024"]["batch"] <= 2048 * 4
    assert all("trtllm-bench max_batch_size" in r["batch_rule"] for r in rows)


def _fidelity_modules():
    sys.path.insert(0, str(SCRIPT.parent))
    import fidelity
    import fidelity_groups
    import fidelity_metrics
    return fidelity, fidelity_metrics, fidelity_groups


def test_ttft_by_arrivals_on_a_hand_made_record():
    fidelity, _, _ = _fidelity_modules()
    record = {"accelerators": 4, "ttft_s": 0.5, "queue_wait_s": 0.2, "ttft_s_range": [0.4, 0.7], "batch_per_replica": 1}
    closed = {"id": "c", "planner_mode": "prefill_pool", "measured_unit": "ttft_s", "planner_arrivals": "closed",
              "measured_statistic": "mean"}
    out = {"measured": 0.25}
    fidelity._compare(out, closed, record)
    # closed arrivals drop the Poisson wait: 0.5 - 0.2 = 0.3 s, range 0.4 - 0.2 to 0.7 - 0.2
    assert math.isclose(out["predicted"], 0.3) and math.isclose(out["ratio"], 1.2)
    assert out["range"] == pytest.approx([0.2, 0.5]) and out["range_covers"] is True
    assert math.isclose(out["range_width"], 2.5) and out["compared"] == "ttft_s - queue_wait_s"
    poisson = dict(closed, planner_arrivals="poisson")
    assert fidelity.predicted(poisson, record) == 0.5
    p90 = dict(poisson, measured_statistic="p90")
    assert fidelity.predicted(p90, dict(record, ttft_p90_s=0.9)) == 0.9
    out = {"measured": 0.5}
    fidelity._compare(out, p90, record)  # no ttft_p90_s in the JSON: falls back to the mean, and says so
    assert out["predicted"] == 0.5 and out["compared"] == "ttft_s"
    with pytest.raises(ValueError):
        fidelity.predicted(dict(closed, planner_arrivals=""), record)
    # closed arrivals with others decoding (batch 5 of an aggregated replica): a request sent as the
    # one before it leaves waits the whole step that has just started, twice the mean Poisson wait
    busy = dict(record, batch_per_replica=5, role="aggregated")
    assert math.isclose(fidelity.predicted(dict(closed, planner_mode="inflight"), busy), 0.7)


def test_tpot_per_user_and_static_latency_on_a_hand_made_record():
    fidelity, _, _ = _fidelity_modules()
    record = {"accelerators": 8, "tpot_s": 0.02, "tpot_s_range": [0.015, 0.03], "batch_per_replica": 4,
              "input_tokens": 100, "output_tokens": 10, "prefill_only_tokens_per_s_per_replica": 1000.0,
              "decode_only_tokens_per_s_per_replica": 200.0}
    row = {"id": "t", "planner_mode": "inflight", "measured_unit": "tpot_s"}
    assert fidelity.predicted(row, record) == 0.02 and fidelity.predicted(row, record, "high") == 0.03
    per_user = dict(row, measured_unit="output_tokens_per_s_per_user")
    assert math.isclose(fidelity.predicted(per_user, record), 50.0)  # 1 / 20 ms
    out = {"measured": 40.0}
    fidelity._compare(out, per_user, record)
    assert out["range"] == pytest.approx([1 / 0.03, 1 / 0.015]) and out["range_covers"] is True
    static = {"id": "s", "planner_mode": "static", "measured_unit": "request_latency_s"}
    # 4 prompts x 100 tokens at 1,000 tokens/s = 0.4 s, then 10 steps of 4 tokens at 200 tokens/s = 0.2 s
    assert math.isclose(fidelity.predicted(static, record), 0.6)
    assert math.isclose(fidelity.predicted(dict(static, measured_unit="ttft_s"), record), 0.4)
    # the throughput of the same static batch: 4 x 10 tokens in 0.6 s on 8 accelerators
    assert math.isclose(fidelity.predicted({"id": "s", "planner_mode": "static"}, record), 40 / 0.6 / 8)


def test_flagged_rows_are_skipped_with_their_reason():
    fidelity, metrics, _ = _fidelity_modules()
    row = {"id": "x-1", "planner_model": "deepseek-r1", "planner_rack": "hgx-b200", "planner_mode": "inflight",
           "planner_tp": "8", "planner_ep": "2", "planner_pp": "1", "planner_dp_attn": "1", "planner_weights_precision": "nvfp4",
           "planner_batch": "1", "measured_value": "274.7", "measured_unit": "output_tokens_per_s_per_user",
           "mapping_flags": "kv_precision_assumed;weights_offloaded", "family": "f"}
    out = fidelity.evaluate(row)  # no planner call: the reason is known from the flags
    assert out["skipped"] == metrics.SKIP_FLAGS["weights_offloaded"] and out["predicted"] is None
    assert out["regimes"] == ["batch<=8"] and out["family"] == "f"
    assert fidelity.summarize([out])["skipped"] == 1 and fidelity.summarize([out])["failed"] == 0


def _result(family, regimes, ratio, covers=None, width=None):
    return {"family": family, "regimes": regimes, "ratio": ratio, "abs_error": None if ratio is None else abs(ratio - 1),
            "range_covers": covers, "range_width": width, "skipped": None if ratio is not None else "why"}


def test_family_and_regime_figures_and_targets():
    _, _, groups = _fidelity_modules()
    results = [_result("a", ["TTFT", "batch<=8", "dense"], 1.5, True, 2.0),
               _result("a", ["dense"], 0.9, False, 1.5),
               _result("b", ["MoE"], 1.1, True, 1.2),
               _result("b", ["MoE"], None)]
    fam = groups.by_family(results)
    assert fam["a"]["rows"] == 2 and math.isclose(fam["a"]["median_abs_error"], 0.3)  # median of 0.5 and 0.1
    assert math.isclose(fam["a"]["median_ratio"], 1.2) and fam["a"]["range_coverage"] == 0.5
    assert math.isclose(fam["a"]["median_range_width"], 1.75)
    assert fam["b"]["evaluated"] == 1 and fam["b"]["skipped"] == 1
    reg = groups.by_regime(results)
    assert reg["TTFT"]["evaluated"] == 1 and math.isclose(reg["TTFT"]["median_abs_error"], 0.5)
    assert reg["MoE"]["rows"] == 2 and reg["dense"]["rows"] == 2
    met = {what.split(" <=")[0].split(" >=")[0]: ok for what, _, ok in groups.targets(results)}
    # overall median |error| of 0.5, 0.1, 0.1 is 10%; worst family a at 30%; TTFT 50%; coverage 2 of 3; width median 1.5
    assert met["median |error|"] is True and met["every family"] is False and met["TTFT rows"] is False
    assert met["range coverage"] is False and met["median range width"] is True


def test_broad_rows_map_onto_the_planner(tmp_path):
    # a batch-1 TTFT row, a TPOT row, a static-latency row, a speculative-decoding row and a skipped one, through the CLI
    out_json = tmp_path / "broad.json"
    ids = "TRT05-TTFT-05,NIM-05,AMD-LAT-01,TRTDS-07,SGB-04"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--published", str(ROOT / "benchmarks" / "published_broad.csv"),
                           "--ids", ids, "--json", str(out_json)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out_json.read_text())
    rows = {r["id"]: r for r in record["rows"]}
    assert rows["SGB-04"]["skipped"] and rows["SGB-04"]["predicted"] is None
    assert rows["TRTDS-07"]["error"] is None and rows["TRTDS-07"]["predicted"] > 0 and "speculative" in rows["TRTDS-07"]["regimes"]
    for rid in ("TRT05-TTFT-05", "NIM-05", "AMD-LAT-01"):
        assert rows[rid]["error"] is None and rows[rid]["predicted"] > 0 and "batch<=8" in rows[rid]["regimes"]
    assert "TTFT" in rows["TRT05-TTFT-05"]["regimes"] and rows["TRT05-TTFT-05"]["compared"] == "ttft_s - queue_wait_s"
    assert record["summary"]["evaluated"] == 4 and record["summary"]["skipped"] == 1
    assert set(record["summary"]["by_family"]) == {"trtllm-v0.5", "nvidia-nim", "amd-rocm-vllm", "trtllm-deepseek-guides", "sglang-blogs"}
    assert "regime" in proc.stdout and "issue 21 targets" in proc.stdout


def test_broad_csv_rows_are_complete():
    sys.path.insert(0, str(SCRIPT.parent))
    import fidelity
    import fidelity_metrics

    units = set(fidelity_metrics.LATENCY_UNITS) | {"output_tokens_per_s_per_accelerator", "input_tokens_per_s_per_accelerator"}
    rows = fidelity.load_rows(ROOT / "benchmarks" / "published_broad.csv")
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["family"] and r["source"] and r["date"] and r["measured_unit"] in units, r["id"]
        if r["measured_unit"] == "ttft_s" and r["planner_mode"] != "static":
            assert r["planner_arrivals"] in ("closed", "poisson"), r["id"]
        assert fidelity_metrics.skip_reason(r) or (r["planner_isl"] and r["planner_osl"]), r["id"]


def _bench_rule():
    sys.path.insert(0, str(SCRIPT.parent))
    import trtllm_bench_rule
    return trtllm_bench_rule


def _perf_overview_row(row_id: str) -> dict:
    fidelity, _, _ = _fidelity_modules()
    return fidelity.load_rows((ROOT / "benchmarks" / "published.csv", ROOT / "benchmarks" / "published_perf_overview.csv"),
                              (row_id,))[0]


def test_trtllm_bench_rule_llama_70b_fp8_tp2_h100():
    # TRTPO-09: nvidia/Llama-3.3-70B-Instruct-FP8 on 2 H100, 1000/1000, worked from TensorRT-LLM's
    # bench/build/tuning.py calc_engine_setting + finetune_setting and benchmark/utils/general.py get_settings:
    #   config.json: 80 layers, 8 KV heads of head_dim 128; KV heads max(tp 2, 8) = 8; FP8 KV, 1 byte
    #   KV per token 2 x 80 x 8 x 128 x 1 = 163,840 B; per request x 2000 tokens = 0.30517578 GiB
    #   param_count = stored elements, one per FP8 weight: 80 x (8192 x (8192 + 2 x 1024 + 8192) + 3 x 8192 x 28672
    #   + 2 x 8192) + 2 x 128,256 x 8192 + 8192 = 70,553,706,496 -> engine 70,553,706,496 x 1 B = 65.70826 GiB
    #   device: NVML total 81,559 MiB = 79.64746 GiB each, x 2 = 159.29492 GiB
    #   requests = (159.29492 - 65.70826) x 0.90 / 0.30517578 = 84.22800 / 0.30517578 = 276.0
    #   max_batch_size: 256 <= 276.0 < 1024 -> 128 x ceil(276.0 / 128) = 384
    #   max_num_tokens: 276.0 x (1 + 1000/1000) = 552 < 4096 -> max(2048, 256 x 3) = 2048; no chunked prefill:
    #   max(2048, max ISL 1000 + 384) = 2048
    rule = _bench_rule()
    row = _perf_overview_row("TRTPO-09")
    bench = rule.settings_for_row(row)
    assert bench.requests == pytest.approx(276.0, rel=1e-4)
    assert (bench.max_batch_size, bench.max_num_tokens, bench.tuned) == (384, 2048, True)
    assert rule.replica_batch_limit(row, bench) == 384  # attention TP: one scheduler for the replica


def test_trtllm_bench_rule_deepseek_r1_fp8_dep8_h200():
    # PO-deepseek-r1-H200-1024-1024: deepseek-ai/DeepSeek-R1-0528 (FP8 block scales) on 8 H200, `--tp 8 --ep 8` with
    # attention DP, 1024/1024:
    #   config.json: 61 layers, num_key_value_heads 128, no head_dim -> head_size 7168 // 128 = 56;
    #   KV heads max(tp 8, 128) = 128; FP8 KV: 2 x 61 x 128 x 56 x 1 = 874,496 B per token, x 2048 = 1.66797 GiB
    #   param_count: the model's 671,026,404,352 plus the MTP module stored beside it: one MoE layer
    #   (attention 187,107,328 + norms 14,336 + 257 experts x 3 x 7168 x 2048 + router 256 x 7168 = 11,507,286,016),
    #   its embed_tokens and head 2 x 129,280 x 7168, eh_proj 2 x 7168 x 7168 and 3 norms: 13,463,426,048;
    #   plus one FP32 scale per 128 x 128 block of the linear weights: (routed 653,908,770,816 + MLPs 3,743,416,320
    #   + attention 61 x 187,107,328 + MTP 11,610,046,464) / 16,384 = 41,545,153;
    #   total 684,531,375,553 x 1 B = 637.51952 GiB
    #   device: 8 x 143,771 MiB = 1,123.21094 GiB
    #   requests = (1,123.21094 - 637.51952) x 0.90 / 1.66797 = 437.12227 / 1.66797 = 262.07
    #   max_batch_size 128 x ceil(262.07 / 128) = 384 per rank; tokens 524 -> 2048, max(2048, 1024 + 384) = 2048
    #   the replica holds at most 384 per attention rank x 8 ranks = 3072
    rule = _bench_rule()
    row = _perf_overview_row("PO-deepseek-r1-H200-1024-1024")
    bench = rule.settings_for_row(row)
    assert bench.requests == pytest.approx(262.07, rel=1e-4)
    assert (bench.max_batch_size, bench.max_num_tokens) == (384, 2048)
    assert rule.replica_batch_limit(row, bench) == 3072
    # the 0.95 fraction the perf overview says it often used leaves this row's limits as they are:
    # 485.69141 x 0.95 / 1.66797 = 276.63 -> 384
    often = rule.settings_for_row(row, rule.KV_FRACTION_OFTEN)
    assert often.requests == pytest.approx(276.63, rel=1e-4) and often.max_batch_size == 384


def test_trtllm_bench_rule_untuned_quant_and_rounding_steps():
    rule = _bench_rule()
    # gpt-oss's MXFP4 checkpoint is not in TUNED_QUANTS: BuildConfig's 2048 / 8192; without chunked prefill the
    # token budget still holds a whole 32,768-token prompt beside a full batch: 32,768 + 2048 = 34,816
    bench = rule.settings_for_row(_perf_overview_row("PO-gpt-oss-120b-H200-32768-1024"))
    assert (bench.max_batch_size, bench.max_num_tokens, bench.tuned, bench.requests) == (2048, 34816, False, None)
    # finetune_setting's steps, by hand: 58.2 requests at 1024/8192 -> multiple of 32, at least 64 -> 64; tokens
    # 58.2 x 1.125 = 65.5 -> at least 2048. 5000 requests -> capped at 4096 -> multiple of 256 = 4096; tokens
    # min(4096 x 2, 32768) = 8192 -> multiple of 1024 = 8192. 600 requests over pp 2 -> 300 -> multiple of 128 = 384;
    # tokens 300 x 9 = 2700 -> multiple of 256 = 2816.
    assert rule.finetune(58.2, 1024, 8192, 1) == (64, 2048)
    assert rule.finetune(5000.0, 1024, 1024, 1) == (4096, 8192)
    assert rule.finetune(600.0, 8192, 1024, 2) == (384, 2816)


def test_checkpoint_element_counts_match_published_counts():
    # param_count is the checkpoint's safetensors element count; the published counts of the checkpoints
    # (rounded as listed) check the storage layouts assumed for them
    rule = _bench_rule()
    models, _ = rule._catalogs()
    published = {("deepseek-r1", "fp8"): (685e9, 0.5e9),     # Hugging Face: 685B (671B + 14B MTP, DeepSeek-V3 README)
                 ("deepseek-r1", "nvfp4"): (393.6e9, 0.05e9),  # nvidia/DeepSeek-R1-0528-NVFP4-v2: 393.6B (llmrun.dev)
                 ("llama-3.3-70b", "fp8"): (71e9, 0.5e9),      # nvidia/Llama-3.3-70B-Instruct-FP8: 71B (Hugging Face)
                 ("llama-3.3-70b", "nvfp4"): (41e9, 0.5e9)}    # nvidia/Llama-3.3-70B-Instruct-NVFP4: 41B (Hugging Face)
    for (model, precision), (count, rounding) in published.items():
        assert abs(rule.checkpoint_elements(models[model], precision) - count) <= rounding, (model, precision)


def test_fidelity_row_takes_the_bench_rule():
    fidelity, _, _ = _fidelity_modules()
    row = _perf_overview_row("PO-deepseek-r1-H200-1024-1024")
    ruled, note = fidelity.with_batch_rule(row)
    assert ruled["planner_batch_cap"] == "3072" and ruled["planner_prefill_chunk"] == "2048"  # min(8192, 384 x 8)
    assert "384/rank x 8" in note
    argv = fidelity.estimate_argv(ruled, 8, "x.json")
    assert argv[argv.index("--prefill-chunk") + 1] == "2048"
    plain = dict(row, planner_batch_rule="")
    assert fidelity.with_batch_rule(plain) == (plain, "") and "--prefill-chunk" not in fidelity.estimate_argv(plain, 8, "x.json")
    with pytest.raises(ValueError):
        fidelity.with_batch_rule(dict(row, planner_batch_rule="vllm-bench"))


def test_gpt_oss_rows_run_the_checkpoint_as_published(tmp_path):
    # openai/gpt-oss-120b config.json: quantization_config mxfp4 with modules_to_not_convert = self_attn, router,
    # embed_tokens, lm_head, so only the experts are MXFP4 (4 bits + one 8-bit scale per 32 = 0.53125 B) and the
    # rest stays BF16. By hand from config.json (hidden 2880, 36 layers, 64 q / 8 kv heads of 64, biases, sinks,
    # 128 experts of 2880 with a fused gate/up of 5760, vocab 201,088, untied head):
    #   embedding + head 2 x 201,088 x 2880 = 1,158,266,880; per layer q 2880x4096+4096, k and v 2x(2880x512+512),
    #   o 4096x2880+2880, sinks 64, two norms 5760, router 2880x128+128 = 26,924,672; final norm 2880
    #   -> 2,127,557,952 BF16 values = 4,255,115,904 B on every attention-DP rank
    #   experts 36 x 128 x (2880x5760+5760 + 2880x2880+2880) = 114,701,598,720 x 0.53125 / EP4 = 15,233,806,080 B
    fidelity, _, _ = _fidelity_modules()
    row = _perf_overview_row("TRTPO-13")
    argv = fidelity.estimate_argv(row, 64, str(tmp_path / "e.json"))
    assert "--weights-precision" not in argv and fidelity.layout_text(row).endswith("native")
    from planner.cli.main import main as planner_main

    assert planner_main(argv[3:]) == 0
    record = json.loads((tmp_path / "e.json").read_text())
    assert (record["precisions"]["weights"], record["precisions"]["expert_weights"]) == ("bf16", "mxfp4")
    assert record["memory_bytes_per_accelerator"]["weights"] == pytest.approx(4_255_115_904 + 15_233_806_080, rel=1e-9)
