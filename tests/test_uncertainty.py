"""The stated range of a calibrated prediction: the wider of the kernel spread and the regime's
end-to-end spread (planner/physics/uncertainty.py), and the benchmark that measures that spread."""

import sys
from pathlib import Path

import numpy as np
import pytest

from planner.physics import uncertainty
from planner.physics.uncertainty import FIRST_TOKEN, RegimeSpread, regime_spread, widen

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_widen_takes_the_wider_side_of_each(monkeypatch):
    """Kernel spread [0.95, 1.05] against a regime measured at [0.87, 1.46]: the regime's on both
    sides; a derived part's wider kernel spread [0.6, 2.0] keeps its own."""
    monkeypatch.setattr(uncertainty, "regime_spread", lambda regime: RegimeSpread(0.87, 1.46, 18))
    low, high = widen(np.array([0.95, 0.6]), np.array([1.05, 2.0]), FIRST_TOKEN)
    assert low.tolist() == [0.87, 0.6] and high.tolist() == [1.46, 2.0]


def test_the_shipped_spread_file_reads_and_names_every_regime():
    for regime in (uncertainty.DECODE_DENSE, uncertainty.DECODE_MOE, FIRST_TOKEN):
        spread = regime_spread(regime)
        assert spread.rows > 0 and 0 < spread.p10 < spread.p90
    assert regime_spread("no such regime") == RegimeSpread()


def test_a_calibrated_estimate_states_at_least_the_regime_spread(run_estimate):
    from planner.modes import StepModel

    e = run_estimate("llama-3.1-70b", "hgx-h100", 64, 1024, 512, tp=4, weights="fp8", kv="fp8", step_model=StepModel.CALIBRATED)
    decode, first = regime_spread(uncertainty.DECODE_DENSE), regime_spread(FIRST_TOKEN)
    assert e.tpot_range_s[0] <= e.tpot_s * decode.p10 * (1 + 1e-12) and e.tpot_range_s[1] >= e.tpot_s * decode.p90 * (1 - 1e-12)
    assert e.ttft_range_s[0] <= e.ttft_s * first.p10 * (1 + 1e-12) and e.ttft_range_s[1] >= e.ttft_s * first.p90 * (1 - 1e-12)
    ideal = run_estimate("llama-3.1-70b", "hgx-h100", 64, 1024, 512, tp=4, weights="fp8", kv="fp8")
    assert ideal.tpot_range_s == (ideal.tpot_s, ideal.tpot_s)  # the roofline is a bound, not a prediction: no range


def test_the_spread_benchmark_on_hand_made_rows():
    """Time ratios: a latency row's measured / predicted, a rate's predicted / measured. Ten rows of
    one regime with ratios 0.8, 0.9, ..., 1.7: p10 0.89, p50 1.25, p90 1.61 (numpy's linear
    interpolation); two families of five, each outside the other's band at one end or both."""
    sys.path.insert(0, str(BENCHMARKS))
    import fidelity_spread

    rows = [{"unit": "output_tokens_per_s_per_accelerator", "mode": "inflight", "moe": True, "family": "a" if i < 5 else "b",
             "measured": 1000.0, "predicted": 1000.0 * (0.8 + 0.1 * i)} for i in range(10)]
    assert fidelity_spread.time_ratio({"unit": "ttft_s", "measured": 0.3, "predicted": 0.2}) == pytest.approx(1.5)
    spreads = fidelity_spread.regime_spreads(rows)
    s = spreads["decode_moe"]
    assert (s["p10"], s["p50"], s["p90"], s["rows"]) == (pytest.approx(0.89), pytest.approx(1.25), pytest.approx(1.61), 10)
    # family a (0.8-1.2) against b's band [1.34, 1.66]: none inside; b (1.3-1.7) against a's [0.84, 1.16]: none
    assert s["leave_one_family_out_coverage"] == 0.0
    text = fidelity_spread.spread_yaml(spreads, "python benchmarks/fidelity.py --all")
    assert "decode_moe: {p10: 0.89, p50: 1.25, p90: 1.61, rows: 10, leave_one_family_out_coverage: 0.0}" in text
