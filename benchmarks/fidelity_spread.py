"""The end-to-end spread the planner states beside its kernel spread (planner/physics/uncertainty.py):
per regime, an 80% prediction band of measured time over predicted time on the published rows, and
how well a band built without a source family covers that family (leave one family out).
`fidelity.py --write-spread PATH` writes it as `topologies/model_spread.yaml`.

Time ratios: a latency row's measured / predicted; a throughput row's predicted / measured (its
time per token is the inverse of its rate). Regimes: first_token (TTFT rows and prefill pools),
decode_moe and decode_dense (every other row: TPOT, per-user speed, decode and in-flight
throughput, static batches, whose time is mostly decode).

The band is a split-conformal prediction interval: of n rows, the j-th smallest and the j-th largest
ratio with j = floor(0.1 (n + 1)). A new row exchangeable with them falls inside with probability
(n + 1 - 2j) / (n + 1) >= 80%, whatever the ratios' distribution; the 10th and 90th percentiles
(numpy's interpolation), which the band was before, cover a new row less often than 80% and covered
79% of their own rows.

Which rows build a regime's band: a regime whose ratios differ from the other regimes' (two-sample
Kolmogorov-Smirnov, p < 0.05) gets a band of its own rows; the regimes that do not differ share one
band of all their rows. On the 231 rows of 2026-11-26 the three regimes do not differ (p 0.06-0.18; the
source families do, Kruskal-Wallis p 0.001), so one band serves them all. On the first 166 rows
per-regime percentile bands estimated the tails from 18-105 rows where 166 describe the same
distribution, and on families they never saw they covered 68% of rows against 82% for a shared band.
"""

import datetime
import math

import numpy as np
from scipy.stats import ks_2samp

LATENCY_TIME_UNITS = ("ttft_s", "tpot_s", "request_latency_s")
COVERAGE = 0.8  # the stated range is p10-p90: a band meant to hold 80% of new measurements
DISTINCT_P = 0.05  # a regime whose ratios differ from the rest at this level gets a band of its own


def time_ratio(result: dict) -> float:
    """Measured time over predicted time of an evaluated row."""
    if result["unit"] in LATENCY_TIME_UNITS:
        return result["measured"] / result["predicted"]
    return result["predicted"] / result["measured"]  # a rate: time per unit is its inverse


def spread_regime(result: dict) -> str:
    if result["unit"] == "ttft_s" or result["mode"] == "prefill_pool":
        return "first_token"
    return "decode_moe" if result["moe"] else "decode_dense"


def _evaluated(results: list[dict]) -> list[dict]:
    return [r for r in results if r.get("predicted") and r.get("measured") and not r.get("skipped") and not r.get("error")]


def prediction_band(values, coverage: float = COVERAGE) -> tuple[float, float]:
    """The split-conformal band of `values`: the j-th smallest and j-th largest, j = floor((1 -
    coverage) / 2 * (n + 1)); with fewer rows than that needs (j = 0), their whole range."""
    x = np.sort(np.asarray(values, dtype=float))
    j = max(1, math.floor(round((1.0 - coverage) / 2.0 * (len(x) + 1), 9)))  # round: 0.1 * 20 is 1.99... in floats
    return float(x[j - 1]), float(x[len(x) - j])


def distinct_p(by_regime: dict[str, list[float]]) -> dict[str, float]:
    """Per regime, the two-sample Kolmogorov-Smirnov p-value of its ratios against every other
    regime's (1.0 where there is no other regime)."""
    out = {}
    for regime, values in by_regime.items():
        rest = [x for other, xs in by_regime.items() if other != regime for x in xs]
        out[regime] = float(ks_2samp(values, rest).pvalue) if rest else 1.0
    return out


def regime_bands(by_regime: dict[str, list[float]]) -> dict[str, dict]:
    """Per regime: its band (low, high), the median and count of the rows that built it, and its
    Kolmogorov-Smirnov p-value against the other regimes."""
    p = distinct_p(by_regime)
    shared = [x for regime, xs in by_regime.items() if p[regime] >= DISTINCT_P for x in xs]
    out = {}
    for regime, values in by_regime.items():
        rows = values if p[regime] < DISTINCT_P else shared
        low, high = prediction_band(rows)
        out[regime] = {"low": low, "median": float(np.median(rows)), "high": high, "band_rows": len(rows), "ks_p": p[regime]}
    return out


def _ratios_by_regime(rows: list[dict]) -> dict[str, list[float]]:
    by_regime: dict[str, list[float]] = {}
    for r in rows:
        by_regime.setdefault(spread_regime(r), []).append(time_ratio(r))
    return by_regime


def leave_one_family_out(rows: list[dict]) -> dict[str, float]:
    """Per regime, the share of its rows inside the band built, by the same rule, from the other
    source families' rows alone."""
    inside: dict[str, list[bool]] = {}
    for family in sorted({r["family"] for r in rows}):
        rest = _ratios_by_regime([r for r in rows if r["family"] != family])
        if sum(len(v) for v in rest.values()) < 2:
            continue
        bands = regime_bands(rest)
        for r in rows:
            regime = spread_regime(r)
            if r["family"] == family and regime in bands:
                inside.setdefault(regime, []).append(bands[regime]["low"] <= time_ratio(r) <= bands[regime]["high"])
    return {regime: float(np.mean(v)) for regime, v in inside.items()}


def regime_spreads(results: list[dict]) -> dict[str, dict]:
    """Per regime: the band (p10, p90), the median of its rows, the rows of the regime and of its
    band, the KS p-value against the other regimes and the leave-one-family-out coverage."""
    rows = _evaluated(results)
    by_regime = _ratios_by_regime(rows)
    bands = regime_bands(by_regime)
    lofo = leave_one_family_out(rows)
    out = {}
    for regime in sorted(by_regime):
        b = bands[regime]
        out[regime] = {"p10": round(b["low"], 4), "p50": round(b["median"], 4), "p90": round(b["high"], 4),
                       "rows": len(by_regime[regime]), "band_rows": b["band_rows"], "ks_p": round(b["ks_p"], 3),
                       **({"leave_one_family_out_coverage": round(lofo[regime], 3)} if regime in lofo else {})}
    return out


def spread_yaml(spreads: dict[str, dict], command: str) -> str:
    """The text of topologies/model_spread.yaml."""
    lines = ["# End-to-end spread of the calibrated step model: measured time / predicted time on the project's published",
             "# serving measurements. p10 and p90 bound a split-conformal 80% prediction band (of n rows, the j-th smallest and",
             "# largest, j = floor(0.1 (n + 1))); p50 is the median of the same rows. The planner states each prediction's",
             "# p10-p90 as the wider of its kernel spread and this (planner/physics/uncertainty.py); medians are never moved.",
             "# A regime whose ratios differ from the others' (Kolmogorov-Smirnov ks_p < 0.05) has a band of its own rows;",
             "# the others share one band of all their rows (band_rows). rows: the regime's own rows.",
             f"# Generated by `{command}`: do not edit by hand.",
             "# leave_one_family_out_coverage: the share of the regime's rows inside the band built, by the same rule, without",
             "# their source family (how the band fares on measurements it never saw).",
             (f"source: {{benchmark: benchmarks/fidelity.py, date: '{datetime.date.today().isoformat()}', "
             f"rows: '{sum(s['rows'] for s in spreads.values())}'}}"),
             "regimes:"]
    for regime, s in spreads.items():
        fields = ", ".join(f"{k}: {v}" for k, v in s.items())
        lines.append(f"  {regime}: {{{fields}}}")
    return "\n".join(lines) + "\n"


def print_spreads(spreads: dict[str, dict]) -> None:
    print("\nend-to-end spread (measured / predicted time): an 80% split-conformal band per regime")
    print(f"  {'regime':<14} {'p10':>5}  {'p50':>5}  {'p90':>5}  {'width':>5} {'rows':>5}  {'band of':>8}  {'KS p vs rest':>12}"
          "  leave-one-family-out coverage")
    for regime, s in spreads.items():
        lofo = s.get("leave_one_family_out_coverage")
        width = s["p90"] / s["p10"] if s["p10"] > 0 else math.inf
        print(f"  {regime:<14} {s['p10']:5.2f}  {s['p50']:5.2f}  {s['p90']:5.2f}  {width:4.2f}x {s['rows']:5d}  "
              f"{s['band_rows']:>4} rows  {s['ks_p']:12.2f}  " + ("-" if lofo is None else f"{lofo:.0%}"))
    covered = [(s["rows"], s["leave_one_family_out_coverage"]) for s in spreads.values() if "leave_one_family_out_coverage" in s]
    if covered:
        total = sum(n for n, _ in covered)
        print(f"  leave-one-family-out coverage over all {total} rows: {sum(n * c for n, c in covered) / total:.0%}")
