"""Smoke runs of the speed benchmarks (`--quick`): they run end to end on this checkout and print
their figures. Speed targets are read from their full runs, never asserted here."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(script: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_solve_benchmark_quick_run_reports_status_gap_and_times():
    out = _run("bench_solve.py")
    rows = [line for line in out.splitlines() if re.match(r"^\S+\s+(OPTIMAL|FEASIBLE)\s", line)]
    assert len(rows) == 3, out
    assert "median over problems" in out and "generated fleet: 230 racks" in out
    # the generated fleet at a 2 s limit: a plan on an idle machine; on a loaded one the wall-clock guard
    # can stop CP-SAT first (UNKNOWN, no plan), which the benchmark must report as such
    assert re.search(r"at the 2 s limit: status ((OPTIMAL|FEASIBLE), objective .* gap [\d.]+%|UNKNOWN, no plan)", out), out


def test_expert_benchmark_quick_run_reports_imbalance_for_each_method():
    out = _run("bench_experts.py")
    methods = {m.group(1): float(m.group(2)) for m in re.finditer(r"^deepseek-v3\s+32\s+58 (eplb|ours)\s+([\d.]+)", out, re.MULTILINE)}
    assert set(methods) == {"eplb", "ours"}
    assert all(value >= 1.0 for value in methods.values())  # the hottest rank is never below the mean
    assert "re-placement after drift" in out
