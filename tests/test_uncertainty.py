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


def _spread_module():
    sys.path.insert(0, str(BENCHMARKS))
    import fidelity_spread

    return fidelity_spread


def _rows(ratios, moe=True, family=lambda i: "a"):
    return [{"unit": "output_tokens_per_s_per_accelerator", "mode": "inflight", "moe": moe, "family": family(i),
             "measured": 1000.0, "predicted": 1000.0 * x} for i, x in enumerate(ratios)]


def test_the_spread_benchmark_on_hand_made_rows():
    """Time ratios: a latency row's measured / predicted, a rate's predicted / measured. Ten rows of
    one regime with ratios 0.8, 0.9, ..., 1.7: j = floor(0.1 * 11) = 1, so the band is the smallest
    and largest, [0.8, 1.7], median 1.25. Two families of five: each family's own band (j =
    floor(0.6) = 0, so again its whole range) holds none of the other's rows."""
    fidelity_spread = _spread_module()
    rows = _rows([0.8 + 0.1 * i for i in range(10)], family=lambda i: "a" if i < 5 else "b")
    assert fidelity_spread.time_ratio({"unit": "ttft_s", "measured": 0.3, "predicted": 0.2}) == pytest.approx(1.5)
    spreads = fidelity_spread.regime_spreads(rows)
    s = spreads["decode_moe"]
    assert (s["p10"], s["p50"], s["p90"], s["rows"], s["band_rows"]) == (pytest.approx(0.8), pytest.approx(1.25), pytest.approx(1.7), 10, 10)
    assert s["ks_p"] == 1.0  # no other regime to differ from
    # family a (0.8-1.2) against b's band [1.3, 1.7]: none inside; b (1.3-1.7) against a's [0.8, 1.2]: none
    assert s["leave_one_family_out_coverage"] == 0.0
    text = fidelity_spread.spread_yaml(spreads, "python benchmarks/fidelity.py --all")
    assert "decode_moe: {p10: 0.8, p50: 1.25, p90: 1.7, rows: 10, band_rows: 10, ks_p: 1.0, leave_one_family_out_coverage: 0.0}" in text


def test_the_band_is_the_split_conformal_order_statistic():
    """j = floor(0.1 (n + 1)): n = 18 gives j = 1 (the whole range), n = 19 gives j = 2, n = 105 gives
    j = 10 (the 10th smallest and the 96th)."""
    band = _spread_module().prediction_band
    assert band(range(1, 19)) == (1.0, 18.0)
    assert band(range(1, 20)) == (2.0, 18.0)
    assert band(range(1, 106)) == (10.0, 96.0)


def test_the_band_covers_80_percent_of_new_draws():
    """A new draw exchangeable with n = 9 others lands in [X(1), X(9)] with probability 8/10 exactly
    (its rank among the ten is uniform); 20,000 simulated trials agree within 1.5 points."""
    band = _spread_module().prediction_band
    rng = np.random.default_rng(7)
    draws = rng.lognormal(0.1, 0.3, size=(20_000, 10))
    inside = [band(d[:9])[0] <= d[9] <= band(d[:9])[1] for d in draws]
    assert np.mean(inside) == pytest.approx(0.8, abs=0.015)


def test_regimes_that_do_not_differ_share_one_band():
    """Two regimes interleaved (MoE 0.8, 1.0, ..., 2.6; dense 0.9, 1.1, ..., 2.7: KS distance 0.1, p
    near 1) share a band over all 20 rows: j = floor(2.1) = 2, the 2nd smallest (0.9) and the 2nd
    largest (2.6). Shifted to 3.0-3.9, the dense rows differ (KS distance 1; the exact two-sided
    p-value for 10 against 10 is 2 / C(20, 10) = 1.1e-5) and each regime gets its own band: j = 1,
    the smallest and the largest of its ten."""
    fidelity_spread = _spread_module()
    moe = _rows([0.8 + 0.2 * i for i in range(10)])
    shared = fidelity_spread.regime_spreads(moe + _rows([0.9 + 0.2 * i for i in range(10)], moe=False))
    for regime in ("decode_moe", "decode_dense"):
        assert (shared[regime]["p10"], shared[regime]["p90"], shared[regime]["band_rows"]) == (pytest.approx(0.9), pytest.approx(2.6), 20)
        assert shared[regime]["ks_p"] > 0.9
    apart = fidelity_spread.regime_spreads(moe + _rows([3.0 + 0.1 * i for i in range(10)], moe=False))
    assert apart["decode_moe"]["ks_p"] == 0.0  # rounded to three places in the file
    by_regime = {"decode_moe": [0.8 + 0.2 * i for i in range(10)], "decode_dense": [3.0 + 0.1 * i for i in range(10)]}
    assert fidelity_spread.distinct_p(by_regime)["decode_moe"] == pytest.approx(2 / 184_756, rel=0.01)
    assert (apart["decode_moe"]["p10"], apart["decode_moe"]["p90"], apart["decode_moe"]["band_rows"]) == (pytest.approx(0.8), pytest.approx(2.6), 10)
    assert (apart["decode_dense"]["p10"], apart["decode_dense"]["p90"]) == (pytest.approx(3.0), pytest.approx(3.9))
