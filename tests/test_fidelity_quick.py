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
           "mapping_flags": "kv_precision_assumed;speculative_decoding", "family": "f"}
    out = fidelity.evaluate(row)  # no planner call: the reason is known from the flags
    assert out["skipped"] == metrics.SKIP_FLAGS["speculative_decoding"] and out["predicted"] is None
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
    # a batch-1 TTFT row, a TPOT row, a static-latency row and a skipped one, through the CLI
    out_json = tmp_path / "broad.json"
    ids = "TRT05-TTFT-05,NIM-05,AMD-LAT-01,TRTDS-05"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--published", str(ROOT / "benchmarks" / "published_broad.csv"),
                           "--ids", ids, "--json", str(out_json)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out_json.read_text())
    rows = {r["id"]: r for r in record["rows"]}
    assert rows["TRTDS-05"]["skipped"] and rows["TRTDS-05"]["predicted"] is None
    for rid in ("TRT05-TTFT-05", "NIM-05", "AMD-LAT-01"):
        assert rows[rid]["error"] is None and rows[rid]["predicted"] > 0 and "batch<=8" in rows[rid]["regimes"]
    assert "TTFT" in rows["TRT05-TTFT-05"]["regimes"] and rows["TRT05-TTFT-05"]["compared"] == "ttft_s - queue_wait_s"
    assert record["summary"]["evaluated"] == 3 and record["summary"]["skipped"] == 1
    assert set(record["summary"]["by_family"]) == {"trtllm-v0.5", "nvidia-nim", "amd-rocm-vllm", "trtllm-deepseek-guides"}
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
