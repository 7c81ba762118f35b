"""Small things a new user hit (issue 22, point 9), each with the test that would have caught it."""

import _thread
import csv
import json
import math
import multiprocessing
import re
import sys
import threading
import time

import pytest
import yaml

from planner.cli.main import main
from planner.errors import PlannerInputError
from planner.paths import data_dir
from planner.physics.deployment import Layout
from planner.problem.resolve import resolve_problem
from planner.problem.schema import parse_problem
from planner.solver.solve import solve
from planner.studies.sweep import SweepSpec, expand_sweep
from planner.studies.sweep_run import ROWS_FILE, run_sweep


def _bundled(name: str) -> dict:
    return yaml.safe_load((data_dir("problems") / f"{name}.yaml").read_text())


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_solve_prints_the_hbm_use_the_readme_promises(tmp_path, capsys):
    # The README said `solve` prints HBM use; it printed none.
    plan = tmp_path / "plan.json"
    assert main(["solve", "llama-3.1-70b-hgx-h100", "--json", str(plan)]) == 0
    out = _one_line(capsys.readouterr().out)
    memory = json.loads(plan.read_text())["deployments"][0]["memory_bytes_per_accelerator"]
    used = memory["weights"] + memory["kv"] + memory["activations"]
    assert "HBM per accelerator" in out
    assert f"{used / 1e9:.3g} GB of {memory['capacity'] / 1e9:.3g} GB ({used / memory['capacity']:.0%})" in out
    assert f"weights {memory['weights'] / 1e9:.3g} GB" in out


def test_a_number_with_its_unit_gets_the_fix_drop_the_unit():
    # The hint for tpot_limit_ms: "40ms" talked about YAML exponents.
    raw = _bundled("llama-3.1-70b-hgx-h100")
    raw["workloads"][0]["tpot_limit_ms"] = "40ms"
    with pytest.raises(PlannerInputError) as info:
        parse_problem(raw)
    assert "drop the unit: tpot_limit_ms: 40" in str(info.value)
    raw["workloads"][0]["tpot_limit_ms"] = "0.04 s"  # another unit than the field's: the value must change too
    with pytest.raises(PlannerInputError, match=r"write the number in ms"):
        parse_problem(raw)


def test_estimate_of_a_prefill_replica_needs_no_batch(tmp_path, capsys):
    # `estimate --role prefill` refused to run without --batch.
    out = tmp_path / "prefill.json"
    assert main(["estimate", "deepseek-v3-gb200-nvl72", "--ep", "8", "--role", "prefill", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    # 4,096-token prompts, the 8,192-token pass budget: 2 whole prompts per attention rank, 8 attention ranks, 1 stage
    assert record["batch_per_replica"] == 2 * 8 * 1
    assert any("no --batch" in note for note in record["assumptions"])
    assert main(["estimate", "deepseek-v3-gb200-nvl72", "--ep", "8", "--role", "decode"]) == 2  # a decode batch is the decision


@pytest.mark.parametrize(("layout", "name"), [
    (Layout(tp=1, ep=1, pp=1, dp_attn=4), "TP1 x DPattn4 x EP1 x ETP4"),  # attention split 4 ways, every expert cut 4 ways
    (Layout(tp=1, ep=8, pp=1, dp_attn=8), "TP1 x DPattn8 x EP8"),  # each rank holds whole experts
    (Layout(tp=4, ep=4, pp=1, dp_attn=2), "TP4 x DPattn2 x EP4 x ETP2"),  # 8 ranks, 4 expert groups of 2
    (Layout(tp=8, ep=1, pp=2, dp_attn=1), "TP8 x PP2"),  # attention and MLP split alike: nothing more to say
])
def test_a_layout_says_how_the_experts_are_split(layout, name):
    # "TP1 x DPattn4" did not say how the experts were split.
    assert layout.name == name


def test_the_runner_up_counts_replicas_not_racks(capsys):
    # "14 x gb200-nvl72 TP2 = 2 accelerators" read as 14 racks.
    assert main(["solve", "llama-3.1-70b-hgx-h100"]) == 0
    out = _one_line(capsys.readouterr().out)
    found = re.search(r"alternative: (\d+) replicas? of hgx-h100 TP(\d+) \((\d+) accelerators? each\)", out)
    assert found is not None, out
    assert int(found.group(3)) == int(found.group(2))  # a TP-only layout: its degree is its accelerators
    assert not re.search(r"alternative: \d+ x hgx-h100", out)


def test_a_demand_conflict_counts_both_pools_against_the_fleet():
    # "needs at least 7 accelerators; the fleet has 16": the count took the prefill pool's rate alone.
    raw = _bundled("disaggregation-loses-chat")
    raw["workloads"][0].update(serving="disaggregated", demand={"output_tokens_per_s": 20000})
    feasible = solve(resolve_problem(parse_problem(raw)))
    rates = {str(d.candidate.role): d.output_tokens_per_s / d.replicas / d.candidate.layout.n_accelerators for d in feasible.deployments}
    raw["workloads"][0]["demand"] = {"output_tokens_per_s": 100000}
    raw["cluster"]["racks"][0]["count"] = 2
    result = solve(resolve_problem(parse_problem(raw)))
    assert not result.has_plan
    message = _one_line(" ".join(c.message for c in result.infeasibility.conflicts))
    decode, prefill = (math.ceil(100000 / rates[role]) for role in ("decode", "prefill"))
    assert decode + prefill > 16  # what really conflicts with the 2 x 8 accelerators
    assert f"at least {decode} + {prefill} = {decode + prefill} accelerators" in message
    assert "the fleet has 2 x hgx-h100 (16 accelerators)" in message


SPEC = {"name": "t", "base": "llama-3.1-70b-hgx-h100", "racks": ["hgx-h100"],
        "axes": [{"field": "workloads[0].tpot_limit_ms", "values": [2, 60]}], "time_limit_s": 5}


def test_a_sweeps_infeasible_row_says_why_as_solve_does(tmp_path):
    # Its rows said only "INFEASIBLE".
    spec = SweepSpec.model_validate(SPEC)
    points = expand_sweep(spec, _bundled("llama-3.1-70b-hgx-h100"))
    rows = run_sweep(points, tmp_path, data_dir("problems"), spec.time_limit_s, spec.seed)
    assert [r["status"] for r in rows] == ["INFEASIBLE", "OPTIMAL"]
    alone = solve(resolve_problem(parse_problem(points[0].problem)), time_limit_s=5, workers=1)
    conflict = alone.infeasibility.conflicts[0]
    detail = _one_line(conflict.message.split(":", 1)[1])  # what `planner solve` prints under its first line
    assert detail in rows[0]["reason"] and "TPOT" in rows[0]["reason"]
    assert conflict.relax[0] in rows[0]["reason"]


def test_a_sweep_without_pyarrow_says_so_and_writes_csv(tmp_path, capsys, monkeypatch):
    # A plain install wrote no Parquet file and said nothing.
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` now raises ImportError
    spec_path, out = tmp_path / "sweep.yaml", tmp_path / "out"
    spec_path.write_text(yaml.safe_dump({**SPEC, "axes": [{"field": "workloads[0].tpot_limit_ms", "values": [60]}]}))
    assert main(["sweep", str(spec_path), "--out", str(out)]) == 0
    printed = _one_line(capsys.readouterr().out)
    assert "no Parquet table: pyarrow is not installed" in printed and f"wrote {out / 't.csv'}" in printed
    assert (out / "t.csv").exists() and not (out / "t.parquet").exists()


def test_ctrl_c_stops_the_sweep_workers_at_once_and_keeps_finished_rows(tmp_path, capsys):
    # Ctrl-C to the parent alone waited for the workers (42 s), then discarded what they had finished.
    spec = {**SPEC, "racks": ["hgx-h100", "hgx-b200", "gb200-nvl72"],
            "axes": [{"field": "workloads[0].tpot_limit_ms", "values": [30, 40, 50, 60, 70, 80]}]}
    spec_path, out = tmp_path / "sweep.yaml", tmp_path / "out"
    spec_path.write_text(yaml.safe_dump(spec))
    sent = {}

    def interrupt_after_the_first_row():
        while not ((out / ROWS_FILE).exists() and (out / ROWS_FILE).read_text().count("\n") >= 1):
            time.sleep(0.02)
        sent["at"] = time.perf_counter()
        _thread.interrupt_main()  # SIGINT to this process (the sweep's parent) only

    watcher = threading.Thread(target=interrupt_after_the_first_row, daemon=True)
    watcher.start()
    code = main(["sweep", str(spec_path), "--out", str(out), "--workers", "2"])
    stopped_s = time.perf_counter() - sent["at"]
    watcher.join()
    assert code == 130
    assert stopped_s < 5.0  # the 17 points left take longer on two workers: they were stopped, not run to the end
    assert multiprocessing.active_children() == []
    kept = [json.loads(line) for line in (out / ROWS_FILE).read_text().splitlines()]
    assert 1 <= len(kept) < 18
    with open(out / "t.csv") as f:  # the finished points, written as a table too
        assert len(list(csv.DictReader(f))) == sum(len(k["rows"]) for k in kept)
    assert "interrupted after" in capsys.readouterr().out
