"""A prefill pool and a decode pool serve the smaller of their two rates: the decode pool makes
tokens only as fast as the prefill pool hands it prompts. Served rates, headroom and the plan's
record count it; numbers below are worked by hand from the candidates' rates."""

from dataclasses import replace

import pytest

from planner.modes import ServingRole
from planner.output.plan_report import solve_record
from planner.output.validate import score_plan
from planner.solver.candidates import served_tokens_per_s
from planner.solver.explain import _fleet


def _pools(result):
    decode = next(d for d in result.deployments if d.candidate.role is ServingRole.DECODE)
    prefill = next(d for d in result.deployments if d.candidate.role is ServingRole.PREFILL)
    return decode, prefill


def _with_rates(result, decode_rate: float, decode_replicas: int, prefill_rate: float, prefill_replicas: int):
    """The solved plan with its pools replaced by one decode and one prefill deployment of the given
    per-replica rates (output tokens per second made, or fed by the prompts prefilled)."""
    decode, prefill = _pools(result)
    deployments = [replace(decode, candidate=replace(decode.candidate, output_tokens_per_s=decode_rate), replicas=decode_replicas),
                   replace(prefill, candidate=replace(prefill.candidate, output_tokens_per_s=prefill_rate), replicas=prefill_replicas)]
    return replace(result, deployments=deployments, explanation=None, placement=None)


@pytest.fixture(scope="module")
def split(solved_bundled):
    resolved, result = solved_bundled["disaggregation-wins-long-prompts"]
    assert result.is_split("summarise"), "the bundled problem is meant to split prefill and decode"
    return resolved, result


def test_a_pair_serves_the_smaller_of_its_two_rates(split):
    # Issue 21's figures: two decode replicas of 1,450 tokens/s make 2,900/s; four prefill replicas
    # whose prompts feed 500 output tokens/s each hand over 2,000/s. The pair serves 2,000/s.
    _, result = split
    decode, prefill = _pools(result)
    assert served_tokens_per_s([(replace(decode.candidate, output_tokens_per_s=1450.0), 2),
                                (replace(prefill.candidate, output_tokens_per_s=500.0), 4)]) == pytest.approx(2000.0)
    # prefill feeding more than decode makes: decode sets the rate (2 x 1,450 = 2,900 < 8 x 500 = 4,000)
    assert served_tokens_per_s([(replace(decode.candidate, output_tokens_per_s=1450.0), 2),
                                (replace(prefill.candidate, output_tokens_per_s=500.0), 8)]) == pytest.approx(2900.0)
    # aggregated replicas alone: what they make (3 x 1,450)
    assert served_tokens_per_s([(replace(decode.candidate, inputs=replace(decode.candidate.inputs, role=ServingRole.AGGREGATED),
                                        output_tokens_per_s=1450.0), 3)]) == \
        pytest.approx(4350.0)


def test_headroom_counts_what_the_prefill_pool_feeds(split):
    # A demand of 5,000/s (the problem's) met by 4 x 1,450 = 5,800/s of decode and 11 x 460 = 5,060/s
    # of prefill: the plan serves 5,060/s, 5,060 / 5,000 - 1 = +1% headroom (not +16%).
    _, result = split
    assert result.problem.workloads[0].output_tokens_per_s == 5000.0
    worked = _with_rates(result, 1450.0, 4, 460.0, 11)
    assert worked.served_output_tokens_per_s("summarise") == pytest.approx(5060.0)
    assert worked.fed_output_tokens_per_s("summarise") == pytest.approx(5060.0)
    line = next(line for line in _fleet(worked) if "headroom" in line)
    assert "serves 5.06k/s" in line and "(+1% headroom" in line
    assert "the decode pool makes 5.8k/s, the prefill pool feeds 5.06k/s: the prefill pool sets the rate" in line
    record = next(r for r in solve_record(worked)["served"] if r["workload"] == "summarise")
    assert record["served_output_tokens_per_s"] == pytest.approx(5060.0)
    assert record["made_output_tokens_per_s"] == pytest.approx(5800.0)
    # cost per output token over what is served: the fleet's $/h over 5,060 tokens/s
    usd_per_hour = sum(d.usd_per_hour for d in worked.deployments)
    assert worked.workload_usd_per_million_output_tokens("summarise") == pytest.approx(usd_per_hour / 3600 / 5060.0 * 1e6)


def test_the_recomputed_score_counts_the_prefill_pool(split):
    # score_plan recomputes each deployment from the catalog: a prefill replica prefills
    # prefill_tokens_per_s prompt tokens, each request input_tokens of them, and each request makes
    # output_tokens; so its prompts feed prefill_tokens_per_s x output / input output tokens per second.
    resolved, result = split
    w = resolved.workloads[0]
    _pools(result)  # the plan has both pools
    made = sum(d.replicas * d.estimate.sustained_output_tokens_per_s for d in result.of_workload(w.name, ServingRole.DECODE))
    fed = sum(d.replicas * d.estimate.prefill_tokens_per_s * w.output_tokens / w.input_tokens
              for d in result.of_workload(w.name, ServingRole.PREFILL))
    score = score_plan(resolved, solve_record(result))
    assert score.output_tokens_per_s[w.name] == pytest.approx(min(made, fed), rel=1e-9)
    assert result.served_output_tokens_per_s(w.name) == pytest.approx(min(made, fed), rel=1e-9)
