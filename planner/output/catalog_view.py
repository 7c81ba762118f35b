"""`planner catalog`: the built-in accelerators, racks, models and KV-cache tiers as terminal tables."""

from rich.console import Console
from rich.table import Table

from planner.units import BILLION, GB, TB, TFLOP, format_bytes, format_seconds

__all__ = ["render_catalog"]


def _accelerators(rows: list[dict]) -> Table:
    table = Table(title="Accelerators (dense FLOP/s; bandwidths per direction; prices are estimates)", title_justify="left")
    for name in ("id", "HBM", "HBM TB/s", "BF16 TF/s", "FP8 TF/s", "FP4 TF/s", "scale-up GB/s", "scale-out GB/s", "$/h"):
        table.add_column(name, justify="left" if name == "id" else "right")
    for a in sorted(rows, key=lambda r: r["id"]):
        flops = a["dense_flops_per_s"]
        table.add_row(
            a["id"], format_bytes(a["hbm_capacity_bytes"]), f"{a['hbm_bandwidth_bytes_per_s'] / TB:.2f}",
            *(f"{flops[f] / TFLOP:,.0f}" if f in flops else "-" for f in ("bf16", "fp8", "fp4")),
            f"{a['scale_up_bandwidth_bytes_per_s'] / GB:,.0f}", f"{a['scale_out_bandwidth_bytes_per_s'] / GB:,.1f}",
            f"{a['price_usd_per_hour']:.2f}",
        )
    return table


def _racks(rows: list[dict]) -> Table:
    table = Table(title="Racks / scale-up units", title_justify="left")
    for name in ("id", "accelerator", "count", "topology", "HBM per domain"):
        table.add_column(name, justify="right" if name in ("count", "HBM per domain") else "left")
    for r in sorted(rows, key=lambda r: r["id"]):
        shape = r["topology"] + (" " + "x".join(map(str, r["dims"])) if r["dims"] else "")
        table.add_row(r["id"], r["accelerator"], str(r["accelerators"]), shape, format_bytes(r["domain_hbm_bytes"]))
    return table


def _models(rows: list[dict]) -> Table:
    table = Table(title="Models (active = matmul parameters per token)", title_justify="left")
    for name in ("id", "total", "active", "layers", "attention", "experts", "KV B/token bf16", "max context"):
        table.add_column(name, justify="left" if name in ("id", "attention") else "right")
    for m in sorted(rows, key=lambda r: r["id"]):
        experts = f"{m['experts_per_token']}/{m['routed_experts']}" if m["routed_experts"] else "dense"
        table.add_row(m["id"], f"{m['total_params'] / BILLION:,.1f}B", f"{m['active_params'] / BILLION:,.1f}B", str(m["layers"]),
                      m["attention"], experts, f"{m['kv_bytes_per_token_bf16']:,.0f}", f"{m['max_context_tokens']:,}")
    return table


def _kv_tiers(rows: list[dict]) -> Table:
    table = Table(title="KV-cache tiers for prompt caching (per accelerator; hbm, host_link, scale_out: the accelerator's own figures)",
                  title_justify="left")
    for name in ("id", "capacity", "read bandwidth", "first byte", "cost", "sources"):
        table.add_column(name, justify="right" if name == "first byte" else "left")
    for r in rows:
        table.add_row(r["id"], r["capacity"], r["read_bandwidth"], format_seconds(r["first_byte_latency_s"]), r["cost"],
                      ", ".join(sorted(set(r["sources"].values()))) or "-")
    return table


def render_catalog(record: dict, console: Console, section: str | None = None) -> None:
    if section in (None, "accelerators"):
        console.print(_accelerators(record["accelerators"]))
    if section in (None, "racks"):
        console.print(_racks(record["racks"]))
    if section in (None, "models"):
        console.print(_models(record["models"]))
    if section in (None, "kv-tiers"):
        console.print(_kv_tiers(record["kv_tiers"]))
