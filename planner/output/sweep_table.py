"""What `planner sweep` writes: the tidy table (CSV, and Parquet when pyarrow is installed), two
charts (cost per token by rack generation; cost against TPOT with its Pareto front) and a summary of
what wins where."""

import csv
import io
import math
from collections import Counter, defaultdict
from pathlib import Path

from planner.units import MS

__all__ = ["columns_of", "pareto", "summary_lines", "table_csv", "write_charts", "write_tables"]

COST = "usd_per_million_output_tokens"


def columns_of(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(key for row in rows for key in row))


def write_tables(rows: list[dict], out_dir: Path, name: str) -> list[Path]:
    """`<name>.csv` always; `<name>.parquet` with pyarrow (the `sweep` extra)."""
    columns = columns_of(rows)
    paths = [out_dir / f"{name}.csv"]
    with open(paths[0], "w", newline="") as f:
        f.write(table_csv(rows))
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return paths
    table = pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows])
    pq.write_table(table, out_dir / f"{name}.parquet")
    return [*paths, out_dir / f"{name}.parquet"]


def table_csv(rows: list[dict]) -> str:
    """The table as CSV text: a column per key any row has, in the order they first appear."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns_of(rows), extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def _planned(rows: list[dict]) -> list[dict]:
    return [r for r in rows if isinstance(r.get(COST), float) and math.isfinite(r[COST])]


def pareto(rows: list[dict]) -> list[dict]:
    """Rows no other row beats on both TPOT and cost per token, fastest first."""
    front, best = [], math.inf
    for row in sorted(_planned(rows), key=lambda r: (r["tpot_s"], r[COST])):
        if row[COST] < best:
            front.append(row)
            best = row[COST]
    return front


def _group_key(rows: list[dict], axes: list[str]) -> str:
    return "racks" if "racks" in axes else "rack_id"


def summary_lines(rows: list[dict], axes: list[str]) -> list[str]:
    """Which rack generation is cheapest per token in each setting of the other axes."""
    planned = _planned(rows)
    statuses = Counter(r["status"] for r in rows)
    lines = [f"{len({r['point'] for r in rows})} problems, {len(rows)} rows: " + ", ".join(f"{n} {s}" for s, n in statuses.most_common())]
    if not planned:
        return [*lines, "no point has a plan"]
    contender = _group_key(rows, axes)
    others = [a for a in axes if a != contender] + ["workload"]
    settings: dict[tuple, list[dict]] = defaultdict(list)
    for row in planned:
        settings[tuple(row.get(a) for a in others)].append(row)
    wins = Counter(min(group, key=lambda r: r[COST])[contender] for group in settings.values())
    lines.append(f"cheapest per output token, over {len(settings)} settings of {', '.join(others)}: "
                 + "; ".join(f"{k} in {n}" for k, n in wins.most_common()))
    for axis in [a for a in others if a != "workload"]:
        by_value: dict[str, Counter] = defaultdict(Counter)
        for key, group in settings.items():
            by_value[key[others.index(axis)]][min(group, key=lambda r: r[COST])[contender]] += 1
        lines.append(f"by {axis}: " + "; ".join(f"{value}: {c.most_common(1)[0][0]}" for value, c in by_value.items()))
    best = min(planned, key=lambda r: r[COST])
    lines.append(f"cheapest row: {best['id']} ({', '.join(f'{a}={best.get(a)}' for a in axes)}, workload {best['workload']}) "
                 f"at ${best[COST]:.4g}/M output tokens on {best['rack_id']}, {best['layouts']}")
    for workload in dict.fromkeys(r["workload"] for r in planned):
        front = pareto([r for r in planned if r["workload"] == workload])
        lines.append(f"Pareto front of {workload} (cost against TPOT): {len(front)} rows, from {front[0]['tpot_s'] / MS:.3g} ms at "
                     f"${front[0][COST]:.4g}/M ({front[0]['rack_id']}) to {front[-1]['tpot_s'] / MS:.3g} ms at ${front[-1][COST]:.4g}/M "
                     f"({front[-1]['rack_id']})")
    return lines


def write_charts(rows: list[dict], axes: list[str], out_dir: Path, name: str) -> list[Path]:
    """Cost per token by rack generation (every row a dot, the median a bar) and cost against TPOT."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    planned = _planned(rows)
    if not planned:
        return []
    contender = _group_key(rows, axes)
    groups = list(dict.fromkeys(r[contender] for r in planned))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(groups)), 4.2))
    for i, g in enumerate(groups):
        costs = sorted(r[COST] for r in planned if r[contender] == g)
        ax.scatter([i] * len(costs), costs, s=12, alpha=0.6)
        ax.hlines(costs[len(costs) // 2], i - 0.3, i + 0.3, color="black")
    ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("USD per million output tokens")
    ax.set_title(f"{name}: cost per token by {contender} (dots: points; bars: medians)")
    fig.tight_layout()
    by_rack = out_dir / f"{name}-cost-by-rack.png"
    fig.savefig(by_rack, dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for g in groups:
        mine = [r for r in planned if r[contender] == g]
        ax.scatter([r["tpot_s"] / MS for r in mine], [r[COST] for r in mine], s=12, alpha=0.6, label=g)
    for workload in dict.fromkeys(r["workload"] for r in planned):  # a front per workload: its points are comparable
        front = pareto([r for r in planned if r["workload"] == workload])
        ax.plot([r["tpot_s"] / MS for r in front], [r[COST] for r in front], color="black", lw=0.8)
        ax.annotate(workload, (front[-1]["tpot_s"] / MS, front[-1][COST]), fontsize=6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("TPOT (ms)")
    ax.set_ylabel("USD per million output tokens")
    ax.set_title(f"{name}: cost against TPOT (lines: each workload's Pareto front)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    front_path = out_dir / f"{name}-pareto.png"
    fig.savefig(front_path, dpi=110)
    plt.close(fig)
    return [by_rack, front_path]
