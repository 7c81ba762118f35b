"""Smoke test of the fidelity benchmark: `benchmarks/fidelity.py --quick` runs `planner estimate` on a
few published rows and produces well-formed output. It does not judge the planner's accuracy."""

import json
import math
import subprocess
import sys
from pathlib import Path

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
