"""End-to-end solving: plans pass the independent check, runs are reproducible, time limits return
the best plan with its gap, and infeasible problems are explained with numbers."""

import json
import math
import re

import pytest

from planner.cli.main import main
from planner.output.plan_report import solve_record
from planner.output.validate import check_plan, score_plan
from planner.paths import data_dir
from planner.problem.resolve import resolve_problem
from planner.problem.schema import load_problem, parse_problem
from planner.solver.findings import TIE_FRACTION
from planner.solver.solve import solve

FEASIBLE = sorted(p for p in data_dir("problems").glob("*.yaml") if not p.stem.startswith("infeasible"))


def _solve(raw_or_path, **kwargs):
    resolved = resolve_problem(load_problem(raw_or_path)) if not isinstance(raw_or_path, dict) else resolve_problem(parse_problem(raw_or_path))
    return resolved, solve(resolved, **kwargs)


@pytest.fixture(scope="module")
def solved(solved_bundled):
    return solved_bundled


@pytest.mark.parametrize("name", [p.stem for p in FEASIBLE])
def test_bundled_plans_pass_the_independent_check(solved, name):
    resolved, result = solved[name]
    assert result.status == "OPTIMAL" and result.stats.gap == 0.0
    record = solve_record(result)
    assert check_plan(resolved, record, placement=True) == []
    score = score_plan(resolved, record)
    assert score.usd_per_hour == pytest.approx(result.usd_per_hour, rel=1e-9)
    if result.data.has_demand:  # the objective is the fleet's cost per hour, up to micro-dollar rounding: each
        # candidate's cost per hour (accelerators and prompt-cache storage) is rounded up to a micro-dollar once and
        # counted per replica (model_builder.fleet_cost), so the objective exceeds the cost by under 1e-6 per replica
        assert result.stats.objective == pytest.approx(score.usd_per_hour, abs=1e-6 * sum(d.replicas for d in result.deployments))


def test_a_corrupted_plan_is_caught(solved):
    resolved, result = solved["llama-3.1-70b-hgx-h100"]
    record = solve_record(result)
    for d in record["deployments"]:
        d["replicas"] = 1  # serves far less than the demand
    record["deployments"][0]["tpot_s"] = 0.001  # and claims a figure the roofline does not give
    problems = [str(v) for v in check_plan(resolved, record)]
    assert any("demand" in p or "demanded" in p for p in problems)
    assert any("tpot_s" in p for p in problems)
    record = solve_record(result)
    record["deployments"][0]["batch_per_replica"] = 100_000  # far beyond HBM
    assert any("HBM" in str(v) for v in check_plan(resolved, record))


def test_same_input_seed_and_workers_give_the_same_plan():
    path = data_dir("problems") / "mixed-fleet-three-models.yaml"
    plans = []
    for workers in (2, 2, 1):
        _, result = _solve(path, seed=7, workers=workers, explain=False)
        record = solve_record(result)
        plans.append([(d["workload"], d["rack"], d["tp"], d["ep"], d["pp"], d["dp_attn"], d["batch_per_replica"], d["replicas"])
                      for d in record["deployments"]])
    assert plans[0] == plans[1]
    assert plans[0] == plans[2]  # the canonical tie-break makes the proven optimum independent of the worker count


def _big_problem(n_workloads: int = 10) -> dict:
    models = ["llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b", "qwen3-32b", "mixtral-8x7b", "gpt-oss-120b", "deepseek-v3",
              "llama-4-scout", "qwen3-235b-a22b", "gpt-oss-20b"]
    return {
        "name": "big",
        "models": {m: m for m in models[:n_workloads]},
        "precisions": {"weights": "fp8", "kv_cache": "fp8"},
        "cluster": {"racks": [{"type": "gb200-nvl72", "count": 20}, {"type": "hgx-h100", "count": 120},
                              {"type": "hgx-b200", "count": 60}, {"type": "mi300x-8", "count": 40}]},
        "workloads": [{"name": f"w{i}", "model": m, "input_tokens": 2048, "output_tokens": 512, "tpot_limit_ms": 60,
                       "ttft_limit_ms": 3000, "demand": {"output_tokens_per_s": 20000 + 7000 * i}}
                      for i, m in enumerate(models[:n_workloads])],
    }


def test_a_time_limit_returns_the_best_plan_with_its_gap():
    """A limit far below what the problem needs: whatever the machine's speed, the result is either
    the best plan found with a consistent bound and gap, or no plan with status UNKNOWN (the limit
    ran out before any plan), never a plan without its gap nor an INFEASIBLE claim."""
    resolved, result = _solve(_big_problem(), time_limit_s=0.05, explain=False)
    s = result.stats
    assert result.status in ("OPTIMAL", "FEASIBLE", "UNKNOWN")
    if result.status == "UNKNOWN":
        assert not result.has_plan and result.deployments == () and s.objective is None
        return
    assert s.objective is not None and s.best_bound is not None and s.gap is not None
    assert s.best_bound <= s.objective + 1e-9 and s.gap >= 0.0
    assert check_plan(resolved, solve_record(result)) == []


def test_an_unproven_plan_says_how_far_the_optimum_may_be_and_what_to_raise(solved):
    from dataclasses import replace

    from rich.console import Console

    from planner.output.plan_report import render_solve

    result = solved["deepseek-v3-gb200-nvl72"][1]
    stats = replace(result.stats, status="FEASIBLE", best_bound=result.stats.objective * (1 - 0.00012), gap=0.00012, time_limit_s=10.0)
    console = Console(record=True, width=300)
    render_solve(replace(result, status="FEASIBLE", stats=stats), console)
    text = console.export_text()
    assert "Not proven optimal within the 10 s limit: the optimum is at most 0.012% better than this plan" in text
    assert "--time-limit" in text
    console = Console(record=True, width=300)
    render_solve(result, console)
    assert "Not proven" not in console.export_text()


def test_explanations_name_binding_limits_dominant_terms_and_the_runner_up(solved):
    _, result = solved["mixed-fleet-three-models"]
    lines = result.explanation.lines()
    assert all(any(w in line for line in lines) for w in ("chat", "assistant", "summarise"))
    assert any("binds" in d.binding for d in result.explanation.deployments)
    assert any("is the largest term of the decode step" in d.dominant for d in result.explanation.deployments)
    alternative = result.explanation.alternative
    assert alternative is not None and alternative.delta_fraction >= 0.0  # the plan was optimal



def test_a_tied_runner_up_is_reported_as_a_tie_not_a_rejection(solved):
    """Over every bundled plan: an alternative with the plan's objective is called an equally good
    alternative (a tie broken canonically), one with a worse objective a rejected one, never the reverse."""
    for _, result in solved.values():
        alternative = result.explanation.alternative if result.explanation else None
        if alternative is None:
            continue
        line = next(line for line in result.explanation.lines() if "alternative" in line)
        delta = alternative.delta_fraction  # None when the alternative has no objective of its own to compare
        assert alternative.ties == (delta is not None and abs(delta) < TIE_FRACTION)  # CP-SAT's objective resolution
        if alternative.ties:
            assert line.startswith("an equally good alternative") and "canonical choice among ties" in line
        else:
            assert line.startswith("best rejected alternative") and (delta is None or delta > 0)

def test_infeasible_demand_against_racks_names_both_with_numbers():
    _, result = _solve(data_dir("problems") / "infeasible-llama-3.1-70b-demand.yaml")
    assert result.status == "INFEASIBLE" and not result.deployments
    (conflict,) = result.infeasibility.conflicts
    assert conflict.families == ("demand[chat]", "racks[hgx-h100]")
    assert [(f.kind, f.subject) for f in conflict.families] == [("demand", "chat"), ("racks", "hgx-h100")]  # fields, not parsed text
    assert "20k/s" in conflict.message and "32 accelerators" in conflict.message
    fix = next(r for r in conflict.relax if "count" in r)
    needed = int(fix.rsplit(" ", 1)[1])
    raw = load_problem(data_dir("problems") / "infeasible-llama-3.1-70b-demand.yaml").model_dump(mode="json", exclude_none=True)
    for count, feasible in ((needed, True), (needed - 1, False)):  # the suggested fix is the least that works
        raw["cluster"]["racks"][0]["count"] = count
        assert _solve(raw, explain=False)[1].has_plan == feasible


def test_infeasible_hbm_says_how_big_the_weights_and_the_domain_are():
    raw = {"model": "deepseek-v3", "precisions": {"weights": "bf16"}, "cluster": {"racks": [{"type": "hgx-h100", "count": 1}]},
           "workloads": [{"name": "chat", "input_tokens": 1024, "output_tokens": 128}]}
    _, result = _solve(raw)
    (conflict,) = result.infeasibility.conflicts
    assert conflict.families == ("hbm",)
    # 671.03e9 parameters x 2 bytes = 1.34 TB; 8 x 81,559 MiB = 684 GB
    assert "1.34 TB" in conflict.message and "684 GB" in conflict.message


def test_infeasible_tpot_says_how_far_the_limit_is():
    raw = {"model": "llama-3.1-70b", "cluster": {"racks": [{"type": "hgx-h100", "count": 1}]},
           "workloads": [{"name": "chat", "input_tokens": 1024, "output_tokens": 128, "tpot_limit_ms": 2}]}
    _, result = _solve(raw)
    (conflict,) = result.infeasibility.conflicts
    assert conflict.families == ("tpot[chat]",)
    assert "raise workloads[chat].tpot_limit_ms to at least" in conflict.relax[0]


def test_cli_solve_writes_the_documented_json(tmp_path):
    out = tmp_path / "plan.json"
    assert main(["solve", "llama-3.1-70b-hgx-h100", "--json", str(out), "--seed", "3", "--workers", "2"]) == 0
    record = json.loads(out.read_text())
    assert record["status"] == "OPTIMAL"
    assert {"wall_time_s", "objective", "best_bound", "gap"} <= set(record["solver"])
    for d in record["deployments"]:
        assert {"workload", "model", "rack", "accelerator", "tp", "ep", "pp", "replicas", "batch_per_replica", "accelerators",
                "tpot_s", "ttft_s", "output_tokens_per_s_per_accelerator", "usd_per_million_output_tokens", "step_time_s",
                "memory_bytes_per_accelerator"} <= set(d)
    assert main(["solve", "infeasible-llama-3.1-70b-demand", "--json", str(out)]) == 3
    assert json.loads(out.read_text())["infeasibility"]["conflicts"]
    assert main(["solve", "no-such-problem"]) == 2


def test_groups_span_domains_only_when_allowed_and_then_pay_scale_out():
    from planner.solver.solve import prepare

    found = {}
    for allowed in (False, True):
        raw = {"model": "deepseek-v3", "precisions": {"weights": "fp8", "kv_cache": "fp8"},
               "cluster": {"racks": [{"type": "hgx-h100", "count": 4}], "allow_spanning_domains": allowed},
               "workloads": [{"name": "chat", "input_tokens": 2048, "output_tokens": 256, "tpot_limit_ms": 100}]}
        _, analyses = prepare(resolve_problem(parse_problem(raw)))
        found[allowed] = [c for c in analyses[("chat", "hgx-h100")].candidates if c.spans_domains]
    assert found[False] == []
    assert found[True] and all(c.stage_size > 8 for c in found[True])
    # an EP16 group over two boxes moves half of its token copies over 50 GB/s NICs: at the same
    # tokens per GPU its exchange takes longer than an EP8 group's inside one box
    from planner.quick import evaluate

    across = evaluate("deepseek-v3", "hgx-h100", 512, 2048, 256, ep=16, weights="fp8", kv_cache="fp8")
    inside = evaluate("deepseek-v3", "hgx-h100", 256, 2048, 256, ep=8, weights="fp8", kv_cache="fp8")
    assert across.links.stage.link_kind == "scale_out" and inside.links.stage.link_kind == "scale_up"
    assert across.decode_step.comm_s > 1.2 * inside.decode_step.comm_s


def test_confidence_high_holds_the_limits_at_the_slow_end_of_the_range(tmp_path):
    """The same problem planned at the median and at the slow end: with --confidence high every
    deployment's p90 TPOT and TTFT stay within the limits (50 ms, 2 s), at the median some would not,
    and the plan never costs less than the median one. (The bundled problem's four boxes cannot hold
    the demand at the slow end, whose p90 is 1.6x the median TPOT: eight are offered here.)"""
    problem = tmp_path / "problem.yaml"
    problem.write_text((data_dir("problems") / "llama-3.1-70b-hgx-h100.yaml").read_text().replace("count: 4", "count: 8"))
    plans = {}
    for level in ("median", "high"):
        out = tmp_path / f"{level}.json"
        assert main(["solve", str(problem), "--confidence", level, "--json", str(out)]) == 0
        plans[level] = json.loads(out.read_text())
    for d in plans["high"]["deployments"]:
        assert d["tpot_s_range"][1] <= 0.050 * (1 + 1e-9) and d["ttft_s_range"][1] <= 2.0 * (1 + 1e-9)
    assert any(d["tpot_s_range"][1] > 0.050 for d in plans["median"]["deployments"])
    assert plans["high"]["fleet"]["usd_per_hour"] >= plans["median"]["fleet"]["usd_per_hour"] * (1 - 1e-9)


def test_a_layout_cheaper_per_token_but_not_chosen_says_what_ruled_it_out(solved):
    """deepseek-v3-wide-ep-skewed: a GB200 layout is cheaper per token than the plan's, but whole replicas
    of it overshoot the 60k tokens/s asked for: the explanation names the rounding, not a vague rejection,
    and its figures add up: ceil(60k / rate per replica) replicas x accelerators per replica x $4.50/h
    (the catalog's GB200 price) costs no less than the plan (a tie goes to the canonical choice)."""
    _, result = solved["deepseek-v3-wide-ep-skewed"]
    cheaper = [r for r in result.explanation.racks if r.relative_to_chosen is not None and r.relative_to_chosen < 1]
    assert cheaper and all(r.not_chosen_because for r in cheaper)
    (r,) = cheaper
    found = re.match(r"whole replicas round the demand up: (\d+) x ([\d.]+)k/s for 60k/s costs \$([\d.]+)/h against the plan's "
                     r"\$([\d.]+)/h", r.not_chosen_because)
    assert found, r.not_chosen_because
    replicas, rate_k, cost, plan = int(found[1]), float(found[2]), float(found[3]), float(found[4])
    accelerators = int(re.search(r"= (\d+) accelerators", r.best)[1])
    assert replicas == math.ceil(60 / rate_k)
    assert cost == pytest.approx(replicas * accelerators * 4.50)
    assert plan == pytest.approx(result.usd_per_hour, rel=0.01) and cost >= plan
    assert result.usd_per_hour == pytest.approx(4.50 * round(result.usd_per_hour / 4.50))  # whole GB200s at $4.50/h


def test_a_pipeline_is_explained_by_the_weights_that_do_not_fit_one_box(solved_bundled):
    # Llama 3.1 405B in bf16: 405e9 x 2 bytes = 810 GB (plus embeddings) against 8 x 80 GiB = 684 GB in one HGX H100.
    _, result = solved_bundled["llama-3.1-405b-pipeline"]
    piped = [d for d in result.deployments if d.candidate.layout.pp > 1]
    assert piped, "the bundled problem is meant to need a pipeline on H100"
    lines = result.explanation.lines()
    assert any("pipeline stages because the weights (8" in line and "exceed the HBM of one hgx-h100 (684 GB)" in line for line in lines)


def test_shared_batch_grids_change_no_candidate(monkeypatch):
    # Workloads of one model and lengths are analysed together and share their batch tables (one
    # evaluation over the union of the batches each asks for); analysed one by one, every candidate,
    # every figure and every rejection must come out the same.
    from planner.solver import solve as solve_module
    from planner.solver.solve import prepare

    raw = {"name": "sharing", "models": {"a": "llama-3.1-70b", "b": "qwen3-30b-a3b"},
           "cluster": {"racks": [{"type": "hgx-h100"}, {"type": "hgx-b200"}]},
           "workloads": [{"name": f"w{i}", "model": "ab"[i % 2], "input_tokens": 2048, "output_tokens": 256,
                          "tpot_limit_ms": [30, 50, 80][i % 3], "demand": {"output_tokens_per_s": 5000}} for i in range(6)]}
    resolved = resolve_problem(parse_problem(raw))
    shared, shared_analyses = prepare(resolved)
    monkeypatch.setattr(solve_module, "SHARE_TABLES", False)
    alone, alone_analyses = prepare(resolved)
    assert len(shared.candidates) == len(alone.candidates) > 0
    for a, b in zip(shared.candidates, alone.candidates, strict=True):
        assert a == b and a.tpot_s == b.tpot_s and a.ttft_s == b.ttft_s and a.output_tokens_per_s == b.output_tokens_per_s
        assert a.inputs == b.inputs and a.batch_limit == b.batch_limit
    assert shared_analyses.keys() == alone_analyses.keys()
    for key, analysis in shared_analyses.items():
        other = alone_analyses[key]
        assert (analysis.rejected, analysis.layouts_tried, analysis.min_tpot_s, analysis.min_ttft_s, analysis.min_hbm_need_bytes) == \
            (other.rejected, other.layouts_tried, other.min_tpot_s, other.min_ttft_s, other.min_hbm_need_bytes)


def test_enumeration_over_processes_gives_the_serial_candidates(monkeypatch):
    # A large enumeration is shared out over forked processes by (model, lengths) group; the merged
    # candidates must be exactly those of one process, in the same canonical order.
    from planner.solver import solve as solve_module
    from planner.solver.solve import prepare

    raw = {"name": "forked", "models": {"a": "llama-3.1-70b", "b": "qwen3-30b-a3b"},
           "cluster": {"racks": [{"type": "hgx-h100"}, {"type": "hgx-b200"}]},
           "workloads": [{"name": f"w{i}", "model": "ab"[i % 2], "input_tokens": [1024, 2048][(i // 2) % 2],
                          "output_tokens": 256, "tpot_limit_ms": [30, 50, 80][i % 3], "demand": {"output_tokens_per_s": 5000}}
                         for i in range(6)]}
    resolved = resolve_problem(parse_problem(raw))
    serial, serial_analyses = prepare(resolved, workers=1)
    monkeypatch.setattr(solve_module, "PARALLEL_MIN_ANALYSES", 2)
    forked, forked_analyses = prepare(resolved, workers=2)
    assert len(forked.candidates) == len(serial.candidates) > 0
    for a, b in zip(forked.candidates, serial.candidates, strict=True):
        assert a == b and a.tpot_s == b.tpot_s and a.ttft_s == b.ttft_s and a.output_tokens_per_s == b.output_tokens_per_s
    assert forked_analyses.keys() == serial_analyses.keys()
    assert all(forked_analyses[k].rejected == serial_analyses[k].rejected for k in serial_analyses)


def test_the_solve_seed_and_workers_reach_cpsat_expert_placement(monkeypatch):
    """`planner solve --seed/--workers` also drive `placement.method: cpsat` (before, the final
    expert placement always ran with seed 0 on one worker whatever the solve was given)."""
    import yaml

    import planner.solver.solve as solve_module

    calls = []
    real = solve_module.place_experts

    def recording(*args, **kwargs):
        calls.append((kwargs.get("method"), kwargs.get("seed"), kwargs.get("workers")))
        return real(*args, **kwargs)

    monkeypatch.setattr(solve_module, "place_experts", recording)
    raw = yaml.safe_load((data_dir("problems") / "deepseek-v3-gb200-nvl72.yaml").read_text())
    raw["placement"] = {"method": "cpsat", "time_limit_s": 1.0}
    _, result = _solve(raw, seed=11, workers=2, explain=False)
    assert any(d.experts is not None for d in result.deployments)
    assert ("cpsat", 11, 2) in calls
