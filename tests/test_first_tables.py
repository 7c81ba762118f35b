"""How far a layout's first batch table reaches (batch_search.Reach) is a matter of speed only: the
enumeration finds the same candidates and chains, row for row and bit for bit, as with first tables
of HEAD_MULTIPLES multiples throughout (the split before Reach). A table of one row at one stage sums
its GEMM shapes in another order than a table of several (numpy reduces a contiguous axis of eight
or more values pairwise), so the tables of one row are the same ones too."""

import numpy as np
import pytest

from planner.paths import data_dir
from planner.problem.resolve import resolve_problem
from planner.problem.schema import load_problem, parse_problem
from planner.solver import batch_search, shared_tables
from planner.solver.solve import prepare


def _enumerated(resolved, monkeypatch):
    lone = set()  # the tables of one row at one stage: (layout, role, batch)
    evaluate = shared_tables.evaluate_batches

    def recorded(inp, batches, links=None, fixed=None):
        if len(batches) == 1 and inp.layout.pp == 1:
            lone.add((inp.layout, inp.role, float(batches[0])))
        return evaluate(inp, batches, links, fixed)

    monkeypatch.setattr(shared_tables, "evaluate_batches", recorded)
    data, analyses = prepare(resolved)
    monkeypatch.setattr(shared_tables, "evaluate_batches", evaluate)
    chains = [chain for key in sorted(analyses) for chain in analyses[key].chains]
    return data.candidates, [c for key in sorted(analyses) for c in analyses[key].candidates], chains, lone


def _assert_same(grown, fixed):
    candidates, listed, chains, lone = grown
    assert lone == fixed[3]
    assert candidates == fixed[0] and listed == fixed[1]
    assert len(chains) == len(fixed[2])
    for a, b in zip(chains, fixed[2], strict=True):
        assert a.reason == b.reason and np.array_equal(a.members, b.members)
        for name in ("batches", "tpot_s", "ttft_p90_s", "used_bytes", "sustained_output_tokens_per_s"):
            assert np.array_equal(getattr(a.table, name), getattr(b.table, name)), name


def _problem(max_batch: int | None = None, objective: str | None = None):
    """DeepSeek-V3 (eight dense GEMM shapes per stage), aggregated or disaggregated (a decode table is
    not stacked with mixed steps: a table of one batch is one row)."""
    raw = {"name": "first-tables", "model": "deepseek-v3", "precisions": {"weights": "fp8", "kv_cache": "fp8"},
           "cluster": {"racks": [{"type": "gb200-nvl72", "count": 1}]},
           "workloads": [{"name": "chat", "input_tokens": 1024, "output_tokens": 256, "tpot_limit_ms": 60, "ttft_limit_ms": 2000,
                          "demand": {"output_tokens_per_s": 20000}, "serving": "auto"}]}
    if max_batch is not None:
        raw["solver"] = {"max_batch_per_replica": max_batch}
    if objective is not None:
        raw |= {"objective": objective, "cost_cap_usd_per_hour": 5000}
    return resolve_problem(parse_problem(raw))


@pytest.mark.parametrize("case", ["bundled", "cap 33 per stage and rank", "cap 192", "latency ladder"])
def test_first_table_reach_changes_no_number(monkeypatch, case):
    resolved = {"bundled": lambda: resolve_problem(load_problem(data_dir("problems") / "deepseek-v3-gb200-nvl72.yaml")),
                "cap 33 per stage and rank": lambda: _problem(33),  # a HEAD_MULTIPLES table leaves one row for a second table
                "cap 192": lambda: _problem(192),  # a grown table leaves one row (its chain ends at the cap)
                "latency ladder": lambda: _problem(objective="min_tpot")}[case]()
    grown = _enumerated(resolved, monkeypatch)
    assert grown[0]
    monkeypatch.setattr(batch_search, "MAX_HEAD_MULTIPLES", batch_search.HEAD_MULTIPLES)
    _assert_same(grown, _enumerated(resolved, monkeypatch))
