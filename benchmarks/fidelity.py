"""Fidelity benchmark: published serving measurements against `planner estimate`.

Each row of `benchmarks/published.csv` carries a published throughput and machine-readable mapping
columns (`planner_*`, `measured_*`) saying how it maps onto `planner estimate`. For every row this
script runs `planner estimate ... --json PATH` through the CLI's entry point (so it depends on the
CLI and its JSON, not on internal APIs; in worker processes, or as a subprocess per call with
`--subprocess`), turns the JSON into the measured quantity and prints predicted against measured.

Modes (README of the validation set):
  inflight      aggregated replica; output tokens/s per accelerator
  decode_pool   `--role decode` replica; output tokens/s per accelerator
  prefill_pool  `--role prefill` replica; input tokens/s per accelerator
  static        B prompts prefilled, then OSL decode steps:
                time = B x ISL / prefill rate + OSL x B / decode-only rate; B x OSL / time / G
Columns beyond the original ones (optional; benchmarks/published_broad.csv has them): `family` (the
source family the report groups by; by id prefix where absent), `planner_arrivals` (TTFT rows: closed
or poisson), `measured_statistic` (mean, p90, ...), and for rows measured with speculative decoding
`planner_speculative_tokens` (draft tokens per step) and `planner_acceptance_length` (the source's
own accepted tokens per step; empty: the model catalog's published acceptance).
Rows whose `measured_unit` is a time (ttft_s, tpot_s, request_latency_s) or tokens/s per user are
read as `fidelity_metrics.py` says (TTFT by how the requests arrived: `planner_arrivals`).
An empty `planner_*_precision` cell leaves that format to the model's native one (the checkpoint as published:
gpt-oss ships MXFP4 experts with BF16 attention, router, embeddings and LM head). An empty `planner_batch` means
the largest batch that fits (exit code 3 = does not fit), at most `planner_batch_cap`. `planner_batch_rule` names an engine's own batch rule that also bounds it: `trtllm-bench` (rows run
with trtllm-bench without --max_batch_size) caps the batch at trtllm-bench's max_batch_size per attention rank x ranks
and passes its max_num_tokens as `--prefill-chunk` (`trtllm_bench_rule.py`). An optional `planner_prefill_chunk`
column sets `--prefill-chunk` directly. Where the JSON has `<field>_range` = [low, high], the prediction is also
computed at both ends and the benchmark reports whether that range covers the measurement, and
the range's width (high / low). Rows flagged with a feature the planner lacks are skipped with the
reason. After the rows it prints the figures by source family and by regime (`fidelity_groups.py`).

`--published` takes one CSV or several, comma-separated; `--all` runs published.csv, the held-out
perf-overview rows, the broader set (published_broad.csv), the vLLM set (published_vllm.csv), the deployment set (published_deploy.csv) and earlier perf-overview revisions (published_po_history.csv) together.

Usage: python benchmarks/fidelity.py [--quick] [--published CSV[,CSV]] [--all] [--ids A,B] [--json OUT] [--csv OUT] [--jobs N] [--subprocess]
Exit code 0 unless the benchmark itself fails.
"""

import argparse
import contextlib
import csv
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from expert_placement_rule import placement_argv
from fidelity_groups import (
    by_family,
    by_regime,
    family_of,
    print_breakdown,
    regimes_of,
    targets,
)
from fidelity_metrics import (
    LATENCY_UNITS,
    compared_key,
    field,
    latency_metric,
    skip_reason,
    static_time_s,
)
from fidelity_spread import print_spreads, regime_spreads, spread_yaml
from trtllm_bench_rule import RULE as TRTLLM_BENCH_RULE
from trtllm_bench_rule import replica_batch_limit, settings_for_row

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PUBLISHED_CSV = HERE / "published.csv"
ALL_CSVS = (PUBLISHED_CSV, HERE / "published_perf_overview.csv", HERE / "published_broad.csv", HERE / "published_vllm.csv",
            HERE / "published_deploy.csv", HERE / "published_po_history.csv")
QUICK_IDS = ("TRT061-01", "TRT061-05", "SG-03", "SG-04")  # one planner call each, every mode but inflight
EXIT_DOES_NOT_FIT = 3
WITHIN = 0.20  # the "within +-20%" band
MS_PER_S = 1000  # printing only: times below a second are shown in ms
DEFAULT_BATCH_CAP = 1 << 16  # search limit for the largest fitting batch when the row names none


def load_rows(path: Path | tuple[Path, ...] = PUBLISHED_CSV, ids: tuple[str, ...] | None = None) -> list[dict]:
    """Rows of the published CSV (or CSVs, one after the other), optionally only the given ids (in file order)."""
    rows = []
    for one in (path,) if isinstance(path, (str, Path)) else path:
        with open(one, newline="") as f:
            rows += list(csv.DictReader(f))
    return [r for r in rows if ids is None or r["id"] in ids]


def _as_int(text: str) -> int | None:
    return int(text) if text.strip() else None


def estimate_argv(row: dict, batch: int, json_path: str) -> list[str]:
    """The `planner estimate` command line of a row at `batch`."""
    argv = [sys.executable, "-m", "planner", "estimate", "--model", row["planner_model"], "--rack", row["planner_rack"],
            "--batch", str(batch), "--isl", row["planner_isl"], "--osl", row["planner_osl"], "--json", json_path]
    for flag in ("tp", "ep", "pp", "dp_attn"):
        argv += [f"--{flag.replace('_', '-')}", row[f"planner_{flag}"]]
    for kind in ("weights", "kv", "activations", "compute"):  # an empty cell: the model's native format (its checkpoint)
        argv += [f"--{kind}-precision", row[f"planner_{kind}_precision"]] if row[f"planner_{kind}_precision"] else []
    role = "aggregated" if row["planner_mode"] == "static" else row["planner_role"]
    argv += ["--engine", row["planner_engine"], "--overlap", row["planner_overlap"]]
    argv += ["--redundant-experts", row.get("planner_redundant_experts") or "0"]
    argv += placement_argv(row)
    if row.get("planner_prefill_chunk"):
        argv += ["--prefill-chunk", row["planner_prefill_chunk"]]
    if row.get("planner_speculative_tokens"):  # acceptance: the row's own measured length, else the model catalog's rates
        argv += ["--speculative-tokens", row["planner_speculative_tokens"]]
        argv += ["--acceptance-length", row["planner_acceptance_length"]] if row.get("planner_acceptance_length") else []
    return argv + ["--role", role]


def with_batch_rule(row: dict) -> tuple[dict, str]:
    """The row with its engine's batch rule applied (`planner_batch_rule`): the batch cap lowered to what the rule
    lets a replica hold, the rule's token budget as the prefill chunk; and a note saying so ("" without a rule)."""
    rule = row.get("planner_batch_rule") or ""
    if not rule:
        return row, ""
    if rule != TRTLLM_BENCH_RULE:
        raise ValueError(f"{row['id']}: unknown planner_batch_rule {rule!r}")
    bench = settings_for_row(row)
    limit = replica_batch_limit(row, bench)
    cap = min(_as_int(row["planner_batch_cap"]) or DEFAULT_BATCH_CAP, limit)
    note = (f"trtllm-bench max_batch_size {bench.max_batch_size}/rank x {limit // bench.max_batch_size}, "
            f"max_num_tokens {bench.max_num_tokens}" + ("" if bench.tuned else " (untuned defaults)"))
    return dict(row, planner_batch_cap=str(cap), planner_prefill_chunk=str(bench.max_num_tokens)), note


SUBPROCESS = False  # --subprocess: one `python -m planner` per call instead of the entry point in this process


def run_estimate(row: dict, batch: int) -> tuple[bool, dict]:
    """Run the planner at `batch`: (fits in HBM, JSON record). Raises on any other failure."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "estimate.json")
        argv = estimate_argv(row, batch, path)
        if SUBPROCESS:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
            proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
            code, message = proc.returncode, proc.stderr or proc.stdout
        else:
            if str(ROOT) not in sys.path:
                sys.path.insert(0, str(ROOT))
            from planner.cli.main import main as planner_main

            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = planner_main(argv[3:])
            message = err.getvalue() or out.getvalue()
        if code not in (0, EXIT_DOES_NOT_FIT):
            raise RuntimeError(f"planner exit {code}: {message.strip()[-400:]}")
        with open(path) as f:
            return code == 0, json.load(f)


def batch_unit(row: dict) -> int:
    """Batches must split into pp x dp_attn micro-batches."""
    return int(row["planner_pp"]) * int(row["planner_dp_attn"])


def largest_fitting_batch(row: dict) -> tuple[int | None, dict | None]:
    """The largest batch (a multiple of the unit, at most the cap) that fits, and its record.

    A first guess comes from the JSON at one unit (free HBM over KV bytes per unit); the bracket
    [last fit, first miss] is then closed by bisection on the exit code."""
    unit = batch_unit(row)
    cap = (_as_int(row["planner_batch_cap"]) or DEFAULT_BATCH_CAP) // unit
    fits, record = run_estimate(row, unit)
    if not fits:
        return None, None
    mem = record["memory_bytes_per_accelerator"]
    guess = int((mem["free"] + mem["kv"]) // mem["kv"]) if mem["kv"] > 0 else cap
    lo, hi, best = 1, cap + 1, record  # lo fits, hi does not (or is past the cap)
    for probe in (min(max(guess, 1), cap), min(max(guess, 1), cap) + 1):
        if lo < probe < hi:
            lo, hi, best = _narrow(row, probe, unit, lo, hi, best)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi, best = _narrow(row, mid, unit, lo, hi, best)
    return lo * unit, best


def _narrow(row: dict, units: int, unit: int, lo: int, hi: int, best: dict) -> tuple[int, int, dict]:
    """One bisection probe at `units` x `unit`: move the fitting or the failing end of the bracket."""
    fits, record = run_estimate(row, units * unit)
    return (units, hi, record) if fits else (lo, units, best)


def predicted(row: dict, record: dict, bound: str = "mid") -> float | None:
    """The row's measured quantity as the planner predicts it (or an end of its range)."""
    if row.get("measured_unit") in LATENCY_UNITS:
        return latency_metric(row, record, bound)
    n = record["accelerators"]
    mode = row["planner_mode"]
    if mode in ("inflight", "decode_pool"):
        return field(record, "output_tokens_per_s_per_accelerator", bound)
    if mode == "prefill_pool":
        rate = field(record, "input_tokens_per_s_per_replica", bound)
        return None if rate is None else rate / n
    if mode == "static":
        return static_throughput(record, bound)
    raise ValueError(f"{row['id']}: unknown planner_mode {mode!r}")


def static_throughput(record: dict, bound: str) -> float | None:
    """Static batching: B x OSL output tokens over the batch's time (`static_time_s`), per accelerator."""
    time_s = static_time_s(record, bound)
    if time_s is None:
        return None
    return record["batch_per_replica"] * record["output_tokens"] / time_s / record["accelerators"]


STEP_OF_MODE = {"prefill_pool": "prefill_chunk_step_time_s", "decode_pool": "decode_only_step_time_s",
                "static": "decode_only_step_time_s", "inflight": "step_time_s"}


def roofline_side(terms: dict) -> str:
    """The side of a roofline step (compute, memory = weights + KV, communication) that is largest,
    as a share of the step total."""
    sides = {"compute": terms["compute"], "memory": terms["weights"] + terms["kv"], "comm": terms["comm"]}
    name = max(sides, key=sides.get)
    text = f"{name} {sides[name] / terms['total']:.0%}"
    if name == "memory":
        text += f" (kv {terms['kv'] / terms['total']:.0%}, weights {terms['weights'] / terms['total']:.0%})"
    return text


def driver(row: dict, record: dict) -> str:
    """What sets the prediction: the largest side of the step the mode runs on; for static batching
    the phase (prefill or decode) that takes most of the time, and its largest side."""
    if row.get("measured_unit") == "ttft_s" and row["planner_mode"] != "static":
        return "prefill pass: " + roofline_side(record["prefill_chunk_step_time_s"])
    if row["planner_mode"] != "static":
        return roofline_side(record[STEP_OF_MODE[row["planner_mode"]]])
    batch, isl = record["batch_per_replica"], record["input_tokens"]
    prefill_s = batch * isl / record["prefill_only_tokens_per_s_per_replica"]
    decode_s = record["output_tokens"] * batch / record["decode_only_tokens_per_s_per_replica"]
    share = prefill_s / (prefill_s + decode_s)
    if share > 0.5:
        return f"prefill {share:.0%} of time: {roofline_side(record['prefill_chunk_step_time_s'])}"
    return f"decode {1 - share:.0%} of time: {roofline_side(record['decode_only_step_time_s'])}"


def evaluate(row: dict) -> dict:
    """Run one row: the planner's prediction next to the measurement, or the error that stopped it."""
    out = {"id": row["id"], "family": family_of(row), "model": row["planner_model"], "hardware": row["planner_rack"],
           "mode": row["planner_mode"], "layout": layout_text(row), "measured": float(row["measured_value"]),
           "unit": row["measured_unit"], "statistic": row.get("measured_statistic") or "", "flags": row["mapping_flags"],
           "batch": None, "fits": None, "predicted": None, "ratio": None, "abs_error": None, "range": None,
           "range_covers": None, "range_width": None, "compared": "", "moe": None, "regimes": [], "driver": "",
           "batch_rule": "", "skipped": skip_reason(row), "error": None}
    if out["skipped"]:
        out["regimes"] = regimes_of(out, row)
        return out
    try:
        row, out["batch_rule"] = with_batch_rule(row)
        batch = _as_int(row["planner_batch"])
        if batch is None:
            batch, record = largest_fitting_batch(row)
            fits = batch is not None
        else:
            fits, record = run_estimate(row, batch)
        if record is None:
            out["error"] = "does not fit at any batch"
            return out
        out.update(batch=batch, fits=fits, driver=driver(row, record), moe=record.get("expert_touch_fraction", 0) > 0)
        _compare(out, row, record)
    except (RuntimeError, KeyError, ValueError, OSError, json.JSONDecodeError) as exc:
        out["error"] = str(exc)
    out["regimes"] = regimes_of(out, row)
    return out


def _compare(out: dict, row: dict, record: dict) -> None:
    """Fill predicted, ratio, |error| and the range check."""
    value = predicted(row, record)
    out.update(predicted=value, ratio=value / out["measured"], abs_error=abs(value / out["measured"] - 1))
    if row.get("measured_unit") in LATENCY_UNITS:
        out["compared"] = compared_key(row, record)
    low, high = predicted(row, record, "low"), predicted(row, record, "high")
    if low is not None and high is not None:
        low, high = min(low, high), max(low, high)
        out.update(range=[low, high], range_covers=low <= out["measured"] <= high,
                   range_width=high / low if low > 0 else math.inf)


def layout_text(row: dict) -> str:
    parts = [f"TP{row['planner_tp']}"]
    parts += [f"{k.upper()}{row['planner_' + k]}" for k in ("ep", "pp") if row["planner_" + k] != "1"]
    if row["planner_dp_attn"] != "1":
        parts.append(f"DPA{row['planner_dp_attn']}")
    return " ".join(parts) + f" {row['planner_weights_precision'] or 'native'}"


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 1]."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lower = math.floor(pos)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (pos - lower)


def summarize(results: list[dict]) -> dict:
    """Median and 90th-percentile |error|, share within +-20%, median ratio, range coverage."""
    done = [r for r in results if r["ratio"] is not None]
    errors = [r["abs_error"] for r in done]
    ranged = [r for r in done if r["range_covers"] is not None]
    skipped = sum(r.get("skipped") is not None for r in results)
    return {
        "rows": len(results), "evaluated": len(done), "skipped": skipped, "failed": len(results) - len(done) - skipped,
        "median_abs_error": statistics.median(errors) if errors else None,
        "p90_abs_error": percentile(errors, 0.9) if errors else None,
        "share_within_20pct": sum(e <= WITHIN for e in errors) / len(errors) if errors else None,
        "median_ratio": statistics.median(r["ratio"] for r in done) if done else None,
        "rows_with_range": len(ranged),
        "range_coverage": sum(r["range_covers"] for r in ranged) / len(ranged) if ranged else None,
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _value(value: float | None, unit: str) -> str:
    """A measured or predicted value in the row's unit: tokens/s as integers, times in ms below a second."""
    if value is None:
        return "-"
    if unit.endswith("_s") and not unit.startswith(("output_tokens", "input_tokens")):
        return f"{value * MS_PER_S:,.1f}ms" if value < 1 else f"{value:,.2f}s"
    return f"{value:,.0f}"


def print_report(results: list[dict], summary: dict) -> None:
    """The per-row table and the overall figures."""
    head = f"{'id':<10} {'model':<16} {'hardware':<9} {'layout':<18} {'mode':<12} {'batch':>6} " \
           f"{'predicted':>10} {'measured':>9} {'ratio':>6} {'|err|':>7} {'range':>5}  driver / flags"
    print("Fidelity: planner estimate vs published (tokens/s per accelerator: output, or input for prefill pools; "
          "times in ms or s, tokens/s per user, as each row's unit)")
    print(head)
    print("-" * len(head))
    for r in results:
        covers = "-" if r["range_covers"] is None else ("yes" if r["range_covers"] else "no")
        tail = r["error"] or (f"SKIPPED: {r['skipped']}" if r["skipped"] else
                              r["driver"] + ("" if r["fits"] in (True, None) else "; DOES NOT FIT"))
        tail += f" ({r['unit']} {r['statistic']} vs {r['compared']})" if r["compared"] else ""
        tail += f" [{r['flags']}]" if r["flags"] else ""
        tail += f" [{r['batch_rule']}]" if r.get("batch_rule") else ""
        print(f"{r['id']:<10} {r['model']:<16} {r['hardware']:<9} {r['layout']:<18} {r['mode']:<12} "
              f"{_fmt(r['batch'], 'd'):>6} {_value(r['predicted'], r['unit']):>10} {_value(r['measured'], r['unit']):>9} "
              f"{_fmt(r['ratio'], '.2f'):>6} {_fmt(r['abs_error'] and 100 * r['abs_error'], '.0f') + '%':>7} {covers:>5}  {tail}")
    s = summary
    coverage = "n/a (the JSON has no *_range fields)" if s["range_coverage"] is None else \
        f"{s['range_coverage']:.0%} of {s['rows_with_range']} rows"
    skipped = f" ({s['skipped']} skipped)" if s.get("skipped") else ""
    print(f"\nrows {s['evaluated']}/{s['rows']} evaluated{skipped}; median |error| {_fmt(s['median_abs_error'] and 100 * s['median_abs_error'], '.0f')}%, "
          f"90th percentile {_fmt(s['p90_abs_error'] and 100 * s['p90_abs_error'], '.0f')}%, "
          f"within +-{WITHIN:.0%}: {_fmt(s['share_within_20pct'], '.0%')}, median ratio {_fmt(s['median_ratio'], '.2f')}, "
          f"range coverage: {coverage}")


def write_outputs(results: list[dict], summary: dict, json_out: str | None, csv_out: str | None) -> None:
    if json_out:
        Path(json_out).write_text(json.dumps({"rows": results, "summary": summary}, indent=2) + "\n")
    if csv_out:
        with open(csv_out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(results[0]) if results else ["id"], lineterminator="\n")
            writer.writeheader()
            writer.writerows({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()} for r in results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_IDS)} (for the test suite)")
    parser.add_argument("--published", default=str(PUBLISHED_CSV), help="published measurements CSV, or several comma-separated")
    parser.add_argument("--all", action="store_true", help="published.csv, published_perf_overview.csv, published_broad.csv, published_vllm.csv, published_deploy.csv and published_po_history.csv together")
    parser.add_argument("--json", metavar="OUT", help="write rows and summary as JSON")
    parser.add_argument("--csv", metavar="OUT", help="write one CSV line per row")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="rows evaluated in parallel")
    parser.add_argument("--subprocess", action="store_true", help="one `python -m planner` process per planner call (slower)")
    parser.add_argument("--ids", help="only these comma-separated row ids")
    parser.add_argument("--write-spread", metavar="YAML", help="write the end-to-end spread per regime (topologies/model_spread.yaml)")
    args = parser.parse_args(argv)
    ids = tuple(args.ids.split(",")) if args.ids else QUICK_IDS if args.quick else None
    paths = ALL_CSVS if args.all else tuple(Path(p) for p in args.published.split(","))
    rows = load_rows(paths, ids)
    global SUBPROCESS
    SUBPROCESS = args.subprocess
    executor = ThreadPoolExecutor if args.subprocess else ProcessPoolExecutor
    with executor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(evaluate, rows))
    summary = summarize(results)
    summary.update(by_family=by_family(results), by_regime=by_regime(results),
                   targets=[{"target": t, "value": v, "met": m} for t, v, m in targets(results)])
    spreads = regime_spreads(results)
    summary.update(spread=spreads)
    print_report(results, summary)
    print_breakdown(results)
    print_spreads(spreads)
    write_outputs(results, summary, args.json, args.csv)
    if args.write_spread:
        Path(args.write_spread).write_text(spread_yaml(spreads, "python benchmarks/fidelity.py " + " ".join(argv if argv is not None else sys.argv[1:])))
        print(f"wrote {args.write_spread}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
