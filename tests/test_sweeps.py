"""compare, frontier and curve: consistency with the catalog and the limits, optimality of each
frontier point, warm starts that change nothing but the search, and the CLI's files."""

import csv
import json
import math

import pytest

from planner.cli.main import main
from planner.errors import PlannerInputError
from planner.paths import data_dir
from planner.problem.resolve import resolve_problem
from planner.problem.schema import load_problem
from planner.solver.search import solve_data
from planner.solver.solve import prepare
from planner.studies.sweeps import (
    _one_workload,
    _with_tpot_limit,
    batch_curve,
    compare_racks,
    sweep_frontier,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _problem(name):
    return load_problem(data_dir("problems") / f"{name}.yaml")


@pytest.fixture(scope="module")
def frontier():
    return sweep_frontier(_problem("deepseek-v3-gb200-nvl72"), points=8)


def test_compare_rows_agree_with_the_catalog_and_the_limits(hw):
    problem = _problem("llama-3.1-70b-hgx-h100")  # 8.5k output tokens/s, TPOT <= 50 ms
    rows = compare_racks(problem, ["hgx-h100", "gb200-nvl72", "mi300x-8"])
    assert [r.rack_id for r in rows] == ["hgx-h100", "gb200-nvl72", "mi300x-8"]
    for r in rows:
        price = hw.racks[r.rack_id].accelerator.price_usd_per_hour
        assert r.usd_per_hour == pytest.approx(r.accelerators * price)
        served = r.output_tokens_per_s_per_accelerator * r.accelerators
        assert served >= 8_500 * (1 - 1e-9) and r.tpot_s <= 0.050 * (1 + 1e-9)
        assert r.usd_per_million_output_tokens == pytest.approx(r.usd_per_hour / 3600 / served * 1e6)
        assert r.racks_used >= 1 and set(r.binding.split(", ")) <= {"hbm", "tpot", "ttft", "max_batch"}


def test_compare_explains_a_rack_that_cannot_serve():
    rows = compare_racks(_problem("deepseek-v3-gb200-nvl72"), ["hgx-h100"], count=1)
    (row,) = rows
    assert row.status == "INFEASIBLE" and row.usd_per_million_output_tokens is None
    assert "671 GB" in row.note and "684 GB" in row.note  # weights against one box's HBM (8 x 81,559 MiB)



def test_compare_with_a_demand_names_the_cheapest_fleet_too(capsys):
    """Kimi K2 at 3k output tokens/s: a small GB200 replica covers the demand for less per hour than
    the NVL576 replica that is cheapest per token at full use; the summary must say both."""
    from rich.console import Console

    from planner.output.sweep_report import render_compare

    rows = compare_racks(_problem("kimi-k2-hgx-h100"), ["gb200-nvl72", "rubin-ultra-nvl576"])
    assert all(r.demand_output_tokens_per_s == 3000 for r in rows)
    per_token = min(rows, key=lambda r: r.usd_per_million_output_tokens)
    per_hour = min(rows, key=lambda r: r.usd_per_hour)
    assert per_token.rack_id != per_hour.rack_id  # the case this test is about
    render_compare(rows, Console(width=300), "kimi")
    out = capsys.readouterr().out
    assert f"cheapest on {per_token.rack_id}" in out and f"the cheapest fleet is on {per_hour.rack_id}" in out

def test_compare_names_unknown_racks():
    with pytest.raises(PlannerInputError, match="did you mean 'gb200-nvl72'"):
        compare_racks(_problem("deepseek-v3-gb200-nvl72"), ["gb200-nvl7"])


def test_frontier_points_meet_their_limits_and_are_optimal(frontier):
    problem, _ = _one_workload(_problem("deepseek-v3-gb200-nvl72"), None)
    limits = [p.tpot_limit_s for p in frontier.points]
    assert limits == sorted(limits)  # tightest first
    for p in frontier.points:
        assert p.status == "OPTIMAL" and p.tpot_s <= p.tpot_limit_s * (1 + 1e-9)
        # no demand: the cheapest candidate per token that meets the limit, by enumeration
        data, _ = prepare(resolve_problem(_with_tpot_limit(problem, p.tpot_limit_s)))
        assert p.usd_per_million_output_tokens == pytest.approx(min(c.usd_per_million_output_tokens for c in data.candidates))


def test_frontier_trades_speed_for_price(frontier):
    front = sorted(frontier.frontier, key=lambda p: p.tokens_per_s_per_user)
    assert len(front) >= 5
    costs = [p.usd_per_million_output_tokens for p in front]
    assert costs == sorted(costs)  # faster is never cheaper on the frontier
    assert front[0].batch > 100 * front[-1].batch  # speed comes from smaller batches
    assert costs[-1] / costs[0] > 50
    for p in front:
        assert frontier.cost_at_speed(p.tokens_per_s_per_user) == pytest.approx(p.usd_per_million_output_tokens)
    # claim 10: the price of 2.5x speed grows with the baseline speed; past ~100 tokens/s per user
    # it is several times the speed-up
    multiples = [(p.tokens_per_s_per_user, frontier.price_multiple(p)) for p in front if frontier.price_multiple(p) is not None]
    assert multiples[0][1] < 2.0 and max(m for _, m in multiples) > 5.0


def test_warm_starts_change_the_search_not_the_answer(frontier):
    assert any(p.hinted for p in frontier.points)
    problem, _ = _one_workload(_problem("deepseek-v3-gb200-nvl72"), None)
    previous = next(p for p in frontier.points if p.hinted)
    k = frontier.points.index(previous)
    before = frontier.points[k - 1]
    data_before, _ = prepare(resolve_problem(_with_tpot_limit(problem, before.tpot_limit_s)))
    chosen = solve_data(data_before).chosen
    keys = {(data_before.candidates[j].rack_id, data_before.candidates[j].layout): r for j, r in chosen.items()}
    data, _ = prepare(resolve_problem(_with_tpot_limit(problem, previous.tpot_limit_s)))
    index = {(c.rack_id, c.layout): j for j, c in enumerate(data.candidates)}
    hint = {index[key]: r for key, r in keys.items()}
    assert solve_data(data, hint=hint).objective == solve_data(data).objective


def test_batch_curve_falls_like_one_over_b_then_flattens(hw):
    curve = batch_curve(_problem("llama-3.1-70b-hgx-h100"))
    t = curve.table
    fits = t.fits
    cost = curve.usd_per_million_output_tokens
    assert all(a > b for a, b in zip(cost[fits][:-1], cost[fits][1:], strict=True))  # bigger batches are cheaper per token
    i = list(map(int, t.batches)).index(curve.chosen_batch)
    assert t.tpot_s[i] <= 0.050 and (curve.batch_limit != "tpot" or t.tpot_s[i + 1] > 0.050 or not t.fits[i + 1])
    price = hw.racks[curve.rack_id].accelerator.price_usd_per_hour
    g = curve.layout.n_accelerators
    assert cost[i] == pytest.approx(price * g / 3600 / t.sustained_output_tokens_per_s[i] * 1e6)
    # small batches: the step is the weight fetch, fixed, so the cost per token halves when B doubles;
    # near the plan the KV fetch grows with B and the curve flattens
    per_doubling = [(cost[k] / cost[k + 1]) ** (1 / math.log2(t.batches[k + 1] / t.batches[k])) for k in range(len(cost) - 1)]
    assert per_doubling[0] == pytest.approx(2.0, rel=0.1)
    assert per_doubling[i - 1] < 1.4
    assert curve.hbm_limit_batch >= curve.chosen_batch


def test_sweep_commands_write_their_files(tmp_path, capsys):
    png, csv_path, js = tmp_path / "f.png", tmp_path / "f.csv", tmp_path / "f.json"
    assert main(["frontier", "deepseek-v3-gb200-nvl72", "--points", "5", "--plot", str(png), "--csv", str(csv_path), "--json", str(js)]) == 0
    assert png.read_bytes()[:8] == PNG_MAGIC
    rows = list(csv.DictReader(csv_path.open()))
    assert len(rows) == 5 and {"tpot_ms", "usd_per_million_output_tokens", "on_frontier"} <= set(rows[0])
    assert len(json.loads(js.read_text())["points"]) == 5
    assert "Fast mode" in capsys.readouterr().out
    assert main(["compare", "llama-3.1-70b-hgx-h100", "--racks", "hgx-h100,hgx-b200", "--plot", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG_MAGIC
    assert "cheapest on" in capsys.readouterr().out
    assert main(["curve", "llama-3.1-70b-hgx-h100", "--plot", str(tmp_path / "k.png"), "--csv", str(tmp_path / "k.csv")]) == 0
    assert (tmp_path / "k.png").read_bytes()[:8] == PNG_MAGIC
    assert "plan (" in capsys.readouterr().out
    assert main(["frontier", "mixed-fleet-three-models"]) == 2  # several workloads: name one
    assert "--workload" in capsys.readouterr().err
