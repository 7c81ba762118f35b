"""The fidelity benchmark by source family and by regime, and against issue 21's targets.

A row's family is its CSV `family` column, or for the CSVs that have none, a name from its id prefix.
Its regimes (a row may be in several): TTFT (measured unit ttft_s), batch<=8 (the batch per replica
it ran at), MoE or dense (whether the estimate touched experts), speculative (measured with draft tokens).
"""

import math
import statistics

FAMILY_OF_PREFIX = {"TRT061": "trtllm-static-v0.6.1", "TRTPO": "trtllm-perf-overview", "PO": "trtllm-perf-overview",
                    "SG": "sglang-large-ep-h100"}
SMALL_BATCH = 8
REGIMES = ("TTFT", f"batch<={SMALL_BATCH}", "MoE", "dense", "speculative")

# Issue 21's done-when on the project's own published rows (not constants of the planner).
TARGET_MEDIAN = 0.15
TARGET_FAMILY = 0.25
TARGET_TTFT = 0.30
TARGET_SMALL_BATCH = 0.25
TARGET_COVERAGE = 0.80
TARGET_WIDTH = 1.8


def family_of(row: dict) -> str:
    return row.get("family") or FAMILY_OF_PREFIX.get(row["id"].split("-")[0], row["id"].split("-")[0])


def regimes_of(out: dict, row: dict) -> list[str]:
    """The regimes of an evaluated (or skipped) row."""
    names = []
    if row.get("measured_unit") == "ttft_s":
        names.append("TTFT")
    batch = out["batch"] if out["batch"] is not None else _as_int(row.get("planner_batch", ""))
    if batch is not None and batch <= SMALL_BATCH:
        names.append(REGIMES[1])
    if out["moe"] is not None:
        names.append("MoE" if out["moe"] else "dense")
    if (_as_int(row.get("planner_speculative_tokens") or "") or 0) > 0:
        names.append("speculative")
    return names


def _as_int(text: str) -> int | None:
    return int(text) if text and text.strip() else None


def group_stats(results: list[dict]) -> dict:
    """Rows, evaluated, skipped, median |error|, median predicted/measured, range coverage and the
    median width of the stated range (high / low of the prediction)."""
    done = [r for r in results if r["ratio"] is not None]
    ranged = [r for r in done if r["range_covers"] is not None]
    widths = [r["range_width"] for r in ranged if r["range_width"] is not None and math.isfinite(r["range_width"])]
    return {"rows": len(results), "evaluated": len(done), "skipped": sum(r["skipped"] is not None for r in results),
            "median_abs_error": statistics.median(r["abs_error"] for r in done) if done else None,
            "median_ratio": statistics.median(r["ratio"] for r in done) if done else None,
            "rows_with_range": len(ranged),
            "range_coverage": sum(r["range_covers"] for r in ranged) / len(ranged) if ranged else None,
            "median_range_width": statistics.median(widths) if widths else None}


def by_family(results: list[dict]) -> dict[str, dict]:
    names = sorted({r["family"] for r in results})
    return {n: group_stats([r for r in results if r["family"] == n]) for n in names}


def by_regime(results: list[dict]) -> dict[str, dict]:
    return {n: group_stats([r for r in results if n in r["regimes"]]) for n in REGIMES}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_groups(title: str, groups: dict[str, dict]) -> None:
    head = f"{title:<26} {'rows':>5} {'eval':>5} {'skip':>5} {'med |err|':>9} {'med ratio':>9} {'covers':>12} {'med width':>9}"
    print(head)
    print("-" * len(head))
    for name, s in groups.items():
        covers = "-" if s["range_coverage"] is None else f"{_pct(s['range_coverage'])} of {s['rows_with_range']}"
        print(f"{name:<26} {s['rows']:>5} {s['evaluated']:>5} {s['skipped']:>5} {_pct(s['median_abs_error']):>9} "
              f"{_num(s['median_ratio'], '.2f'):>9} {covers:>12} {_num(s['median_range_width'], '.2f') + 'x':>9}")


def targets(results: list[dict]) -> list[tuple[str, str, bool | None]]:
    """Issue 21's targets: (what, where it stands, met?); None where no row measures it."""
    overall, families, regimes = group_stats(results), by_family(results), by_regime(results)
    worst = max(((n, s["median_abs_error"]) for n, s in families.items() if s["median_abs_error"] is not None),
                key=lambda t: t[1], default=(None, None))

    def check(value, limit, below=True):
        return None if value is None else (value <= limit if below else value >= limit)

    return [
        (f"median |error| <= {_pct(TARGET_MEDIAN)}", _pct(overall["median_abs_error"]), check(overall["median_abs_error"], TARGET_MEDIAN)),
        (f"every family <= {_pct(TARGET_FAMILY)}", f"worst {worst[0]} {_pct(worst[1])}", check(worst[1], TARGET_FAMILY)),
        (f"TTFT rows <= {_pct(TARGET_TTFT)}", _pct(regimes["TTFT"]["median_abs_error"]), check(regimes["TTFT"]["median_abs_error"], TARGET_TTFT)),
        (f"batch <= {SMALL_BATCH} rows <= {_pct(TARGET_SMALL_BATCH)}", _pct(regimes[REGIMES[1]]["median_abs_error"]),
         check(regimes[REGIMES[1]]["median_abs_error"], TARGET_SMALL_BATCH)),
        (f"range coverage >= {_pct(TARGET_COVERAGE)}", _pct(overall["range_coverage"]), check(overall["range_coverage"], TARGET_COVERAGE, below=False)),
        (f"median range width <= {TARGET_WIDTH}x", _num(overall["median_range_width"], ".2f") + "x",
         check(overall["median_range_width"], TARGET_WIDTH)),
    ]


def print_breakdown(results: list[dict]) -> None:
    """By family, by regime, then the targets with met / missed."""
    print()
    print_groups("family", by_family(results))
    print()
    print_groups("regime", by_regime(results))
    print("\nissue 21 targets: " + "; ".join(f"{what}: {where} {'-' if met is None else ('met' if met else 'MISSED')}"
                                          for what, where, met in targets(results)))
    skipped = [r for r in results if r["skipped"]]
    if skipped:
        print("skipped: " + "; ".join(f"{r['id']} ({r['skipped']})" for r in skipped))
