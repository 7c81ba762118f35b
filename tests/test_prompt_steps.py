"""How an aggregated replica's prompts share its steps (physics/serving_steps.py), checked against
relations worked out by hand from the engines' scheduling, not against the code's own numbers.

- One request at a time: its prompt is prefilled once, before its first token, in one chunk (the
  prompt fits the 8,192-token budget), and every later step is a pure decode step. So a request's
  cycle is OSL x (mean step per token) = OSL x (pure decode step) + (extra time of the step that
  carries the prompt). The extra time does not depend on the output length: the prompt is the same.
  Spreading the prompt evenly over the decode steps (the ideal roofline's schedule) breaks this,
  because the riders' cost per step is not linear in their number.
- The user's TPOT at one request is the pure decode step: its own prompt is not between its tokens.
- At a large batch the user's step and the mean step differ by the share (B - 1) / B of the prompt
  carrying, i.e. almost nothing.
"""

import pytest

from planner.modes import ServingRole, StepModel


def _pair(run_estimate, batch: int, isl: int, osl: int, **kwargs):
    common = dict(tp=2, weights="fp8", kv="fp8", step_model=StepModel.CALIBRATED, **kwargs)
    aggregated = run_estimate("llama-3.1-70b", "hgx-h100", batch, isl, osl, **common)
    decode_only = run_estimate("llama-3.1-70b", "hgx-h100", batch, isl, osl, role=ServingRole.DECODE, **common)
    return aggregated, decode_only


def test_one_request_pays_its_prompt_once_whatever_its_output_length(run_estimate):
    extra = []
    for osl in (128, 512, 2048):
        agg, dec = _pair(run_estimate, 1, 4096, osl)
        assert agg.tpot_s == pytest.approx(dec.tpot_s, rel=1e-9)  # its own prompt is not between its tokens
        extra.append(osl * (agg.mean_step_per_token_s - dec.tpot_s))
    assert extra[0] > 4096 * 2 * 70e9 / (2 * 1979e12)  # no less than the prompt's FLOPs at the fp8 peak of 2 H100s
    assert extra[1] == pytest.approx(extra[0], rel=1e-6)
    assert extra[2] == pytest.approx(extra[0], rel=1e-6)


def test_a_user_waits_on_the_other_prompts_only(run_estimate):
    agg, dec = _pair(run_estimate, 64, 2048, 256)
    carried = agg.mean_step_per_token_s - dec.tpot_s  # the prompts' share of the mean step
    assert carried > 0
    assert agg.tpot_s - dec.tpot_s == pytest.approx(carried * 63 / 64, rel=1e-6)


def test_the_ideal_roofline_spreads_the_prompts_evenly(run_estimate):
    """Under the roofline the prompts ride every step at their mean rate (no chunk steps): the mean
    step then costs less than one pure step plus the prompt's whole pass spread over the outputs."""
    kwargs = {"tp": 2, "weights": "fp8", "kv": "fp8", "step_model": StepModel.ROOFLINE}
    agg = run_estimate("llama-3.1-70b", "hgx-h100", 1, 4096, 512, **kwargs)
    dec = run_estimate("llama-3.1-70b", "hgx-h100", 1, 4096, 512, role=ServingRole.DECODE, **kwargs)
    flops_time = 4096 * 2 * 70e9 / (2 * 989.5e12 * 0.803)  # the prompt's FLOPs at the MAMF rate of 2 GPUs
    assert 0 < 512 * (agg.mean_step_per_token_s - dec.tpot_s) < flops_time
