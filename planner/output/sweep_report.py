"""Tables, CSV and JSON records for compare, frontier and curve."""

import csv
import io
from dataclasses import asdict

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from planner.studies.sweeps import FAST_MODE_SPEEDUP, BatchCurve, CompareRow, Frontier
from planner.units import MS, format_rate, format_seconds, format_usd

__all__ = ["compare_record", "curve_csv", "curve_record", "frontier_csv", "frontier_record", "frontier_summary", "render_compare",
           "render_curve", "render_frontier"]


def _usd(value: float | None) -> str:
    return "-" if value is None else format_usd(value)


def _time(value: float | None) -> str:
    return "-" if value is None else format_seconds(value)


def render_compare(rows: list[CompareRow], console: Console, title: str) -> None:
    several = len({r.workload for r in rows}) > 1
    table = Table(title=title, title_justify="left")
    names = ["rack", *(["workload"] if several else []), "$/M out", "tok/s/acc", "TPOT", "TTFT", "acc.", "racks", "$/h", "binds",
             "dominant", "plan"]
    for name in names:
        table.add_column(name, justify="left" if name in ("rack", "workload", "binds", "dominant", "plan") else "right",
                         no_wrap=name != "plan", min_width=24 if name == "plan" else None)
    for r in rows:
        head = [r.rack_id, *([r.workload] if several else [])]
        if r.usd_per_million_output_tokens is None:
            table.add_row(*head, "-", "-", "-", "-", "-", "-", "-", "-", "-", f"[red]{escape(r.status)}[/red]: {escape(r.note)}")
            continue
        table.add_row(*head, format_usd(r.usd_per_million_output_tokens),
                      format_rate(r.output_tokens_per_s_per_accelerator).removesuffix("/s"), format_seconds(r.tpot_s),
                      format_seconds(r.ttft_s), str(r.accelerators), str(r.racks_used), format_usd(r.usd_per_hour), r.binding, r.dominant,
                      escape(r.layouts))
    console.print(table)
    solved = [r for r in rows if r.usd_per_million_output_tokens is not None]
    for w in dict.fromkeys(r.workload for r in rows):
        mine = [r for r in solved if r.workload == w]
        if len(mine) >= 2:
            best = min(mine, key=lambda r: r.usd_per_million_output_tokens)
            worst = max(mine, key=lambda r: r.usd_per_million_output_tokens)
            console.print(f"{escape(w)}: cheapest on {best.rack_id} ({format_usd(best.usd_per_million_output_tokens)}/M output tokens); "
                          f"the dearest, {worst.rack_id}, costs {worst.usd_per_million_output_tokens / best.usd_per_million_output_tokens:.1f}x "
                          "as much per token")
            demand = mine[0].demand_output_tokens_per_s
            fleet = min(mine, key=lambda r: r.usd_per_hour)
            if demand is not None and fleet is not best:
                console.print(f"{escape(w)}: for its demand of {format_rate(demand)} output tokens the cheapest fleet is on {fleet.rack_id} "
                              f"({format_usd(fleet.usd_per_hour)}/h against {format_usd(best.usd_per_hour)}/h on {best.rack_id}): whole "
                              "replicas round the demand up, and a small replica that just covers it beats a cheaper-per-token large one")
    console.print("Prices are catalog estimates (`planner catalog accelerators`); override them in the problem file.")


def compare_record(rows: list[CompareRow]) -> dict:
    return {"rows": [asdict(r) for r in rows]}


def render_frontier(frontier: Frontier, console: Console) -> None:
    table = Table(title=f"Cost against speed: {frontier.model}, workload {frontier.workload} (TPOT limit swept, CP-SAT per point)",
                  title_justify="left")
    speedup = FAST_MODE_SPEEDUP
    for name in ("TPOT limit", "TPOT", "tok/s per user", "$/M out", f"price of {speedup:g}x speed", "$/h", "accel.", "frontier",
                 "warm start", "plan"):
        table.add_column(name, justify="left" if name in ("plan", "frontier", "warm start") else "right")
    for p in frontier.points:
        if p.tpot_s is None:
            table.add_row(format_seconds(p.tpot_limit_s), "-", "-", "-", "-", "-", "-", "", "", f"[red]{p.status}[/red]")
            continue
        multiple = frontier.price_multiple(p) if p.on_frontier else None
        table.add_row(format_seconds(p.tpot_limit_s), format_seconds(p.tpot_s), f"{p.tokens_per_s_per_user:.1f}",
                      format_usd(p.usd_per_million_output_tokens), "-" if multiple is None else f"{multiple:.1f}x",
                      format_usd(p.usd_per_hour), str(p.accelerators),
                      "[green]yes[/green]" if p.on_frontier else "[dim]no[/dim]", "hint" if p.hinted else "", escape(p.plan))
    console.print(table)
    for line in frontier_summary(frontier):
        console.print(line)


def frontier_summary(frontier: Frontier) -> list[str]:
    """The fast-mode trade in words: the price of 2.5x speed from slow, middle and fast baselines."""
    front = sorted(frontier.frontier, key=lambda p: p.tokens_per_s_per_user)
    if len(front) < 2:
        return ["The frontier has fewer than two points: widen the TPOT range (--min-tpot-ms, --max-tpot-ms)."]
    lines = []
    priced = [(p, frontier.price_multiple(p)) for p in front]
    priced = [(p, m) for p, m in priced if m is not None]
    if priced:
        parts = [f"x{m:.1f} from {p.tokens_per_s_per_user:.0f} tokens/s (batch {p.batch})" for p, m in priced[:: max(1, len(priced) // 4)]]
        lines.append(f"Fast mode: {FAST_MODE_SPEEDUP:g}x the per-user speed costs " + ", ".join(parts) +
                     "; the faster the baseline, the steeper the price (smaller batches amortise the weights over fewer tokens)")
    slowest, fastest = front[0], front[-1]
    lines.append(f"Whole frontier: {fastest.tokens_per_s_per_user / slowest.tokens_per_s_per_user:.0f}x speed for "
                 f"{fastest.usd_per_million_output_tokens / slowest.usd_per_million_output_tokens:.0f}x price "
                 f"(TPOT {format_seconds(slowest.tpot_s)} -> {format_seconds(fastest.tpot_s)}, batch {slowest.batch} -> {fastest.batch})")
    return lines


def frontier_csv(frontier: Frontier) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["tpot_limit_ms", "status", "tpot_ms", "tokens_per_s_per_user", "usd_per_million_output_tokens", "usd_per_hour",
                     "accelerators", "batch", "on_frontier", "warm_started", "plan"])
    for p in frontier.points:
        writer.writerow([f"{p.tpot_limit_s / MS:.6g}", p.status, "" if p.tpot_s is None else f"{p.tpot_s / MS:.6g}",
                         "" if p.tpot_s is None else f"{p.tokens_per_s_per_user:.6g}",
                         "" if p.usd_per_million_output_tokens is None else f"{p.usd_per_million_output_tokens:.6g}",
                         "" if p.usd_per_hour is None else f"{p.usd_per_hour:.6g}", p.accelerators, p.batch, int(p.on_frontier),
                         int(p.hinted), p.plan])
    return out.getvalue()


def frontier_record(frontier: Frontier) -> dict:
    return {"workload": frontier.workload, "model": frontier.model,
            "points": [asdict(p) | {"tokens_per_s_per_user": p.tokens_per_s_per_user} for p in frontier.points]}


def _curve_rows(curve: BatchCurve, max_rows: int = 14) -> list[int]:
    """Indices to print: an even spread in log batch, plus the plan's batch and the cheapest one."""
    n = len(curve.table.batches)
    step = max(1, n // max_rows)
    keep = set(range(0, n, step)) | {n - 1, curve.min_cost_index}
    keep |= {i for i, b in enumerate(curve.table.batches) if int(b) in (curve.chosen_batch, curve.hbm_limit_batch)}
    return sorted(keep)


def render_curve(curve: BatchCurve, console: Console) -> None:
    t = curve.table
    table = Table(title=f"Cost and TPOT against batch: {curve.model} on {curve.rack_id}, {curve.layout.describe()}", title_justify="left")
    for name in ("batch", "$/M out", "TPOT", "compute", "weights", "KV", "comm", "overhead", "HBM", "note"):
        table.add_column(name, justify="left" if name == "note" else "right")
    for i in _curve_rows(curve):
        b = int(t.batches[i])
        notes = []
        if b == curve.chosen_batch:
            notes.append(f"[green]plan ({curve.batch_limit}-bound)[/green]")
        if i == curve.min_cost_index and b != curve.chosen_batch:
            notes.append("cheapest that fits HBM")
        if not t.fits[i]:
            notes.append("[red]exceeds HBM[/red]")
        if curve.tpot_limit_s is not None and t.tpot_s[i] > curve.tpot_limit_s:
            notes.append("over the TPOT limit")
        table.add_row(str(b), format_usd(float(curve.usd_per_million_output_tokens[i])), format_seconds(float(t.tpot_s[i])),
                      *(format_seconds(float(term[i])) for term in t.serving_step), f"{t.used_bytes[i] / t.memory.capacity_bytes:.0%}", ", ".join(notes))
    console.print(table)
    first = float(curve.usd_per_million_output_tokens[0])
    chosen = float(curve.usd_per_million_output_tokens[list(map(int, t.batches)).index(curve.chosen_batch)])
    console.print(f"Batch {int(t.batches[0])} costs {first / chosen:.0f}x the plan's batch {curve.chosen_batch} per token; compute equals "
                  f"weight fetch near B* = {curve.critical_batch:.0f} sequences (claim 2, achievable rates).")


def curve_csv(curve: BatchCurve) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["batch", "usd_per_million_output_tokens", "tpot_ms", "compute_ms", "weights_ms", "kv_ms", "comm_ms", "overhead_ms", "hbm_fill", "fits_hbm"])
    t = curve.table
    for i, b in enumerate(t.batches):
        writer.writerow([int(b), f"{curve.usd_per_million_output_tokens[i]:.6g}", f"{t.tpot_s[i] / MS:.6g}", *(f"{term[i] / MS:.6g}" for term in t.serving_step),
                         f"{t.used_bytes[i] / t.memory.capacity_bytes:.4f}", int(t.fits[i])])
    return out.getvalue()


def curve_record(curve: BatchCurve) -> dict:
    t = curve.table
    return {"workload": curve.workload, "model": curve.model, "rack": curve.rack_id, "layout": curve.layout.describe(),
            "chosen_batch": curve.chosen_batch, "batch_limit": curve.batch_limit, "hbm_limit_batch": curve.hbm_limit_batch,
            "critical_batch": curve.critical_batch, "tpot_limit_s": curve.tpot_limit_s,
            "batches": t.batches.tolist(), "usd_per_million_output_tokens": curve.usd_per_million_output_tokens.tolist(),
            "tpot_s": t.tpot_s.tolist(), "fits_hbm": t.fits.tolist()}
