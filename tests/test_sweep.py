"""`planner sweep`: expansion of a sweep file, rows equal to solving each point alone, resume after an
interruption, a failing point as a row, and the same table from local workers and from Ray."""

import csv
import json

import pytest
import yaml

from planner.cli.main import main
from planner.errors import PlannerInputError
from planner.paths import data_dir
from planner.problem.resolve import resolve_problem
from planner.problem.schema import parse_problem
from planner.solver.solve import solve
from planner.studies.sweep import SweepSpec, expand_sweep, set_field
from planner.studies.sweep_run import ROWS_FILE, RUN_DEPENDENT, run_sweep

BASE = yaml.safe_load((data_dir("problems") / "llama-3.1-70b-hgx-h100.yaml").read_text())
SPEC = {"name": "t", "base": "llama-3.1-70b-hgx-h100", "racks": ["hgx-h100", "hgx-b200"],
        "axes": [{"field": "workloads[0].tpot_limit_ms", "values": [30, 60]}], "time_limit_s": 5}


def test_set_field_follows_paths():
    doc = {"a": [{"b": 1}], "c": {}}
    set_field(doc, "a[0].b", 2)
    set_field(doc, "c.d.e", 3)
    set_field(doc, "cluster.price_overrides_usd_per_hour.h100-sxm", 2.5)
    assert doc == {"a": [{"b": 2}], "c": {"d": {"e": 3}}, "cluster": {"price_overrides_usd_per_hour": {"h100-sxm": 2.5}}}
    with pytest.raises(KeyError):
        set_field(doc, "a[3].b", 1)


def test_a_product_sweep_has_every_combination_in_a_fixed_order():
    spec = SweepSpec.model_validate({**SPEC, "models": ["llama-3.1-70b", "qwen3-32b"]})
    points = expand_sweep(spec, BASE)
    assert len(points) == 2 * 2 * 2  # models x racks x TPOT limits
    assert [p.labels["model"] for p in points[:4]] == ["llama-3.1-70b"] * 4  # the first axis varies slowest
    assert points[5].labels == {"model": "qwen3-32b", "racks": "hgx-h100", "workloads[0].tpot_limit_ms": "60"}
    assert points[5].problem["cluster"]["racks"] == [{"type": "hgx-h100"}] and points[5].problem["workloads"][0]["tpot_limit_ms"] == 60
    assert BASE == yaml.safe_load((data_dir("problems") / "llama-3.1-70b-hgx-h100.yaml").read_text())  # the base is not modified
    zipped = expand_sweep(SweepSpec.model_validate({**SPEC, "mode": "zip"}), BASE)
    assert [(p.labels["racks"], p.labels["workloads[0].tpot_limit_ms"]) for p in zipped] == [("hgx-h100", "30"), ("hgx-b200", "60")]


def test_a_sweep_naming_a_missing_list_item_is_refused_by_axis():
    spec = SweepSpec.model_validate({**SPEC, "axes": [{"field": "workloads[5].input_tokens", "values": [1]}]})
    with pytest.raises(PlannerInputError, match=r"axes\[workloads\[5\].input_tokens\]"):
        expand_sweep(spec, BASE)


def _strip(rows):
    return [{k: v for k, v in r.items() if k not in RUN_DEPENDENT} for r in rows]


def test_rows_equal_solving_each_point_alone_and_a_sweep_resumes(tmp_path):
    spec = SweepSpec.model_validate(SPEC)
    points = expand_sweep(spec, BASE)
    rows = run_sweep(points, tmp_path, data_dir("problems"), spec.time_limit_s, spec.seed)
    assert len(rows) == 4 and all(r["status"] == "OPTIMAL" for r in rows)
    for point, row in zip(points, rows, strict=True):  # the same figure as planning the point on its own
        alone = solve(resolve_problem(parse_problem(point.problem)), time_limit_s=5, seed=0, workers=1, explain=False)
        assert row["usd_per_million_output_tokens"] == pytest.approx(alone.workload_usd_per_million_output_tokens("chat"), rel=1e-12)
    lines = (tmp_path / ROWS_FILE).read_text().splitlines()
    (tmp_path / ROWS_FILE).write_text("\n".join(lines[:2]) + "\n" + lines[2][:17])  # interrupted while writing the third
    solved = []
    again = run_sweep(points, tmp_path, data_dir("problems"), spec.time_limit_s, spec.seed, progress=lambda d, t: solved.append(d))
    assert solved == [2, 3, 4] and _strip(again) == _strip(rows)  # only the two missing points were solved


def test_a_failing_point_is_a_row_not_the_end_of_the_sweep(tmp_path):
    spec = SweepSpec.model_validate({**SPEC, "racks": None, "axes": [{"field": "workloads[0].input_tokens", "values": [1024, -5]}]})
    rows = run_sweep(expand_sweep(spec, BASE), tmp_path, data_dir("problems"), 5, 0)
    assert [r["status"] for r in rows] == ["OPTIMAL", "INVALID"]
    assert "workloads[0].input_tokens" in rows[1]["reason"]


def test_the_cli_writes_the_table_charts_and_summary(tmp_path, capsys):
    spec_path = tmp_path / "sweep.yaml"
    spec_path.write_text(yaml.safe_dump(SPEC))
    out = tmp_path / "out"
    assert main(["sweep", str(spec_path), "--out", str(out)]) == 0
    with open(out / "t.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 4 and {"racks", "workloads[0].tpot_limit_ms", "usd_per_million_output_tokens", "status"} <= set(table[0])
    assert (out / "t-cost-by-rack.png").stat().st_size > 0 and (out / "t-pareto.png").stat().st_size > 0
    assert "cheapest per output token" in (out / "summary.md").read_text()
    other = dict(SPEC, time_limit_s=4)  # another sweep into the same directory is refused, not mixed in
    spec_path.write_text(yaml.safe_dump(other))
    assert main(["sweep", str(spec_path), "--out", str(out)]) == 2
    assert "holds the rows of another sweep" in capsys.readouterr().err
    assert json.loads((out / "sweep.json").read_text())["points"] == 4


def test_local_workers_and_ray_give_the_same_table(tmp_path):
    ray = pytest.importorskip("ray")
    spec = SweepSpec.model_validate(SPEC)
    points = expand_sweep(spec, BASE)
    local = run_sweep(points, tmp_path / "local", data_dir("problems"), 5, 0, workers=2)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = run_sweep(points, tmp_path / "ray", data_dir("problems"), 5, 0, ray_address="local")
    finally:
        ray.shutdown()
    assert _strip(local) == _strip(on_ray) and len(local) == 4
