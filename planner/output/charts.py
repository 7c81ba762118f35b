"""PNG charts for compare, frontier and curve (matplotlib, headless Agg backend).

Every chart has a title and axes with units; the numbers drawn are those the commands print.
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from planner.studies.sweeps import FAST_MODE_SPEEDUP, BatchCurve, CompareRow, Frontier
from planner.units import MS

__all__ = ["plot_compare", "plot_curve", "plot_frontier"]

DPI = 130


PLAIN = FuncFormatter(lambda value, _: f"{value:g}")  # 20, 100, 0.5 rather than 2x10^1


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() not in (".png", ".pdf", ".svg"):
        plt.close(fig)
        from planner.errors import InputIssue, PlannerInputError

        raise PlannerInputError(InputIssue("--plot", f"{path.name}: charts are written as .png, .pdf or .svg", "end the file name with .png"))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_compare(rows: list[CompareRow], path: str | Path, title: str) -> Path:
    """Two panels per workload row: cost per million output tokens and output tokens/s per accelerator."""
    workloads = list(dict.fromkeys(r.workload for r in rows))
    racks = list(dict.fromkeys(r.rack_id for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(racks) * len(workloads) + 2.0), sharey=True)
    height = 0.8 / len(workloads)
    for k, w in enumerate(workloads):
        mine = {r.rack_id: r for r in rows if r.workload == w}
        y = [i + k * height for i in range(len(racks))]
        cost = [mine[r].usd_per_million_output_tokens or 0.0 for r in racks]
        rate = [mine[r].output_tokens_per_s_per_accelerator or 0.0 for r in racks]
        axes[0].barh(y, cost, height=height, label=w)
        axes[1].barh(y, rate, height=height, label=w)
        for yi, r in zip(y, racks, strict=True):
            if mine[r].usd_per_million_output_tokens is None:
                axes[0].text(0, yi, "  no plan", va="center", fontsize=8, color="firebrick")
    axes[0].set_yticks([i + 0.4 - height / 2 for i in range(len(racks))], racks)
    axes[0].invert_yaxis()
    axes[0].set_xlabel("cost per million output tokens (USD)")
    axes[1].set_xlabel("output tokens/s per accelerator")
    axes[0].set_title("cost per token (lower is better)")
    axes[1].set_title("throughput per accelerator (higher is better)")
    if len(workloads) > 1:
        axes[1].legend(title="workload")
    fig.suptitle(title)
    return _save(fig, path)


def plot_frontier(frontier: Frontier, path: str | Path, title: str) -> Path:
    """Cost per token against per-user speed, log-log; dominated points in grey."""
    fig, ax = plt.subplots(figsize=(8, 5.5))
    solved = [p for p in frontier.points if p.tpot_s is not None]
    off = [p for p in solved if not p.on_frontier]
    front = sorted(frontier.frontier, key=lambda p: p.tokens_per_s_per_user)
    if off:
        ax.scatter([p.tokens_per_s_per_user for p in off], [p.usd_per_million_output_tokens for p in off], color="0.7",
                   label="dominated / repeated plan", zorder=2)
    ax.plot([p.tokens_per_s_per_user for p in front], [p.usd_per_million_output_tokens for p in front], "o-", color="tab:blue",
            label="Pareto frontier", zorder=3)
    priced = [(p, frontier.price_multiple(p)) for p in front]
    priced = [(p, m) for p, m in priced if m is not None]
    for p, m in priced[:: max(1, len(priced) // 3)]:  # a few "2.5x speed" arrows along the frontier
        x0, y0 = p.tokens_per_s_per_user, p.usd_per_million_output_tokens
        x1 = x0 * FAST_MODE_SPEEDUP
        ax.annotate("", xy=(x1, frontier.cost_at_speed(x1)), xytext=(x0, y0), arrowprops={"arrowstyle": "->", "color": "tab:red"})
        ax.annotate(f"{FAST_MODE_SPEEDUP:g}x speed: {m:.1f}x price", xy=(x0, y0), xytext=(6, -14), textcoords="offset points",
                    color="tab:red", fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(PLAIN)
    ax.yaxis.set_major_formatter(PLAIN)
    ax.set_xlabel("per-user speed (output tokens/s per user = 1 / TPOT)")
    ax.set_ylabel("cost per million output tokens (USD)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_curve(curve: BatchCurve, path: str | Path, title: str) -> Path:
    """Cost per token and TPOT against the decode batch, with the plan's batch and the limits marked."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    b = curve.table.batches
    fits = curve.table.fits
    top.plot(b[fits], curve.usd_per_million_output_tokens[fits], "-", color="tab:blue", label="fits HBM")
    if (~fits).any():
        top.plot(b[~fits], curve.usd_per_million_output_tokens[~fits], ":", color="0.6", label="exceeds HBM")
    bottom.plot(b[fits], curve.table.tpot_s[fits] / MS, "-", color="tab:orange")
    if (~fits).any():
        bottom.plot(b[~fits], curve.table.tpot_s[~fits] / MS, ":", color="0.6")
    for ax in (top, bottom):
        ax.axvline(curve.chosen_batch, color="tab:green", linestyle="--", label=f"plan: batch {curve.chosen_batch} ({curve.batch_limit}-bound)")
        if curve.hbm_limit_batch:
            ax.axvline(curve.hbm_limit_batch, color="tab:red", linestyle=":", label=f"HBM full at batch {curve.hbm_limit_batch}")
        ax.axvline(curve.critical_batch, color="tab:purple", linestyle="-.", alpha=0.6,
                   label=f"compute = weight fetch, B* = {curve.critical_batch:.0f}")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(PLAIN)
    if curve.tpot_limit_s is not None:
        bottom.axhline(curve.tpot_limit_s / MS, color="tab:red", label=f"TPOT limit {curve.tpot_limit_s / MS:g} ms")
    top.set_yscale("log")
    top.yaxis.set_major_formatter(PLAIN)
    top.set_ylabel("cost per million output tokens (USD)")
    bottom.set_ylabel("TPOT (ms)")
    bottom.set_xlabel("decode batch per replica (sequences)")
    top.legend(fontsize=8)
    bottom.legend(fontsize=8)
    top.set_title(title)
    return _save(fig, path)
