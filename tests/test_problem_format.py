"""Problem files: bundled problems load; bad input gets field / problem / fix messages."""

import textwrap
from pathlib import Path

import pytest

from planner.errors import PlannerInputError
from planner.paths import data_dir
from planner.problem.resolve import resolve_problem
from planner.problem.schema import load_problem, parse_problem, problem_json_schema

MINIMAL = {
    "model": "llama-3.1-8b",
    "cluster": {"racks": [{"type": "hgx-h100", "count": 1}]},
    "workloads": [{"name": "chat", "input_tokens": 1024, "output_tokens": 128}],
}


def _issues(raw: dict) -> str:
    with pytest.raises(PlannerInputError) as info:
        resolve_problem(parse_problem(raw))
    return info.value.render()


@pytest.mark.parametrize("path", sorted(data_dir("problems").glob("*.yaml")), ids=lambda p: p.stem)
def test_bundled_problems_load_and_resolve(path: Path):
    resolved = resolve_problem(load_problem(path), base_dir=path.parent, source=str(path))
    assert resolved.workloads and resolved.rack_counts


def test_minimal_problem_resolves_to_si_units():
    raw = dict(MINIMAL, workloads=[{"name": "chat", "input_tokens": 1024, "output_tokens": 128,
                                    "tpot_limit_ms": 50, "ttft_limit_ms": 800, "demand": {"requests_per_s": 10}}])
    resolved = resolve_problem(parse_problem(raw))
    w = resolved.workloads[0]
    assert w.tpot_limit_s == pytest.approx(0.05) and w.ttft_limit_s == pytest.approx(0.8)
    assert w.output_tokens_per_s == pytest.approx(10 * 128)


def test_unknown_model_suggests_close_names():
    text = _issues(dict(MINIMAL, model="llama-3.1-7b"))
    assert "model: unknown model 'llama-3.1-7b'" in text and "did you mean" in text and "llama-3.1-8b" in text


def test_unknown_rack_suggests_close_names():
    raw = dict(MINIMAL, cluster={"racks": [{"type": "gb200-nvl36", "count": 1}]})
    text = _issues(raw)
    assert "cluster.racks[0].type" in text and "gb200-nvl72" in text


def test_latency_in_seconds_is_caught():
    raw = dict(MINIMAL, workloads=[{"name": "chat", "input_tokens": 1, "output_tokens": 1, "tpot_limit_ms": 0.05}])
    text = _issues(raw)
    assert "workloads[0]" in text and "looks like seconds" in text and "50" in text


def test_unknown_field_and_missing_field():
    raw = dict(MINIMAL, workloads=[{"name": "chat", "input_tokens": 1, "output_tokens": 1, "tpot_ms": 50}])
    text = _issues(raw)
    assert "workloads[0].tpot_ms" in text and "did you mean 'tpot_limit_ms'" in text and "or remove it" in text
    raw = {k: v for k, v in MINIMAL.items() if k != "workloads"}
    assert "workloads" in _issues(raw) and "add this field" in _issues(raw)


def test_context_longer_than_the_model_allows():
    raw = dict(MINIMAL, model="qwen3-32b", workloads=[{"name": "long", "input_tokens": 262144, "output_tokens": 1024}])
    assert "exceed qwen3-32b's 40960-token context" in _issues(raw)


def test_yaml_syntax_error_reports_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(textwrap.dedent("""\
        model: llama-3.1-8b
        cluster:
          racks: [{type: hgx-h100, count: 1}
        workloads: []
    """))
    with pytest.raises(PlannerInputError) as info:
        load_problem(path)
    assert "line 4" in info.value.render()


def test_several_models_need_keys():
    raw = dict(MINIMAL)
    raw.pop("model")
    raw["models"] = {"a": "llama-3.1-8b", "b": "qwen3-32b"}
    assert "several models are defined" in _issues(raw)
    raw["workloads"] = [{"name": "chat", "model": "c", "input_tokens": 1, "output_tokens": 1}]
    assert "unknown model key 'c'" in _issues(raw)


def test_schema_describes_every_top_level_field():
    schema = problem_json_schema()
    assert {"model", "models", "precisions", "cluster", "workloads", "objective", "solver"} <= set(schema["properties"])


def test_readme_reference_matches_the_schema():
    """The README's problem-file reference is `planner schema --markdown`, byte for byte."""
    from pathlib import Path

    from planner.problem.schema_doc import README_BEGIN, README_END, schema_markdown

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    inside = readme.split(README_BEGIN, 1)[1].split(README_END, 1)[0]
    assert inside.strip() == schema_markdown().strip(), "regenerate it: planner schema --markdown"


def test_anticipated_mistakes_get_one_line_each_with_a_fix():
    from planner.errors import PlannerInputError
    from planner.problem.schema import parse_problem

    base = {"name": "x", "model": "deepseek-v3", "cluster": {"racks": [{"type": "gb200-nvl72", "count": 1}]}}
    with pytest.raises(PlannerInputError) as exc:  # a misspelt field gets the real name
        parse_problem(base | {"workloads": [{"name": "w", "input_tokens": 10, "output_tokens": 10, "tpot_limit": 50}]})
    (issue,) = exc.value.issues
    assert issue.field == "workloads[0].tpot_limit" and "did you mean 'tpot_limit_ms'" in issue.problem
    gpu = {"id": "mine", "name": "Mine", "vendor": "me", "hbm_capacity_gb": 80e9, "hbm_bandwidth_tb_per_s": 3350,
           "dense_tflop_per_s": {"bf16": 1000}, "scale_up_gb_per_s": 0.45, "scale_out_gb_per_s": 50, "price_usd_per_hour": 2,
           "price_basis": "mine", "sources": {k: "DERIVED" for k in ("hbm_capacity_gb", "hbm_bandwidth_tb_per_s", "dense_tflop_per_s",
                                                                      "scale_up_gb_per_s", "scale_out_gb_per_s", "price_usd_per_hour")}}
    cluster = base["cluster"] | {"custom_accelerators": [gpu]}
    workloads = [{"name": "w", "input_tokens": 10, "output_tokens": 10, "tpot_limit_ms": 0.05,
                  "prefix_cache": {"hit_rate": 90, "retention_minutes": 5}}]
    with pytest.raises(PlannerInputError) as exc:  # every unit mistake at once, each on its field
        parse_problem(base | {"cluster": cluster, "workloads": workloads})
    found = {i.field.rsplit(".", 1)[-1]: i for i in exc.value.issues}
    assert "looks like bytes" in found["hbm_capacity_gb"].problem and "80 for 80 GB" in found["hbm_capacity_gb"].fix
    assert "looks like GB/s" in found["hbm_bandwidth_tb_per_s"].problem
    assert "looks like TB/s" in found["scale_up_gb_per_s"].problem
    assert "looks like seconds" in found["tpot_limit_ms"].problem and "50" in found["tpot_limit_ms"].fix
    assert "looks like a percentage" in found["hit_rate"].problem and "0.9" in found["hit_rate"].fix
