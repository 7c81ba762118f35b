"""`planner schema` and `catalog`: the problem format and the built-in catalogs."""

import argparse
import json
import sys

from rich.console import Console

from planner.cli.common import EXIT_OK, write_json, write_text
from planner.hardware.catalog import load_hardware_catalog
from planner.model.architecture import kv_bytes_per_token, param_counts
from planner.model.catalog import load_model_catalog
from planner.physics.kv_cache import load_tier_specs
from planner.problem.schema import (
    problem_json_schema,
)

__all__ = ["catalog_command", "catalog_record", "schema_command"]


def schema_command(args: argparse.Namespace, console: Console) -> int:
    if getattr(args, "plan", False):
        from planner.output.plan import plan_json_schema

        text = json.dumps(plan_json_schema(), indent=2)
    elif getattr(args, "sweep", False):
        from planner.studies.sweep import SweepSpec

        text = json.dumps(SweepSpec.model_json_schema(), indent=2)
    elif args.markdown:
        from planner.problem.schema_doc import schema_markdown

        text = schema_markdown().rstrip("\n")
    else:
        text = json.dumps(problem_json_schema(), indent=2)
    if args.output:
        write_text(args.output, text + "\n")
    else:
        sys.stdout.write(text + "\n")
    return EXIT_OK


def catalog_record() -> dict:
    hardware, models = load_hardware_catalog(), load_model_catalog()
    accelerators = [{
        "id": a.id, "name": a.name, "hbm_capacity_bytes": a.hbm_capacity_bytes, "hbm_bandwidth_bytes_per_s": a.hbm_bandwidth_bytes_per_s,
        "dense_flops_per_s": {str(k): v for k, v in a.dense_flops_per_s.items()},
        "scale_up_bandwidth_bytes_per_s": a.scale_up_bandwidth_bytes_per_s, "scale_out_bandwidth_bytes_per_s": a.scale_out_bandwidth_bytes_per_s,
        "price_usd_per_hour": a.price_usd_per_hour, "price_basis": a.price_basis,
    } for a in hardware.accelerators.values()]
    racks = [{
        "id": r.id, "name": r.name, "accelerator": r.accelerator.id, "accelerators": r.n_accelerators,
        "topology": r.topology.kind, "dims": list(r.topology.dims), "domain_hbm_bytes": r.n_accelerators * r.accelerator.hbm_capacity_bytes,
    } for r in hardware.racks.values()]
    model_rows = []
    for m in models.values():
        counts = param_counts(m)
        model_rows.append({
            "id": m.id, "name": m.name, "total_params": counts.total, "active_params": counts.active_matmul,
            "layers": m.n_layers, "attention": str(m.attention.kind),
            "routed_experts": m.moe.n_routed_experts if m.moe else 0, "experts_per_token": m.moe.experts_per_token if m.moe else 0,
            "kv_bytes_per_token_bf16": kv_bytes_per_token(m, 2.0), "max_context_tokens": m.max_context_tokens,
        })
    tiers = [{
        "id": s.id, "name": s.name,
        "capacity": s.capacity or f"{s.capacity_gb_per_accelerator:g} GB per accelerator",
        "read_bandwidth": (f"{s.read_bandwidth} x {s.read_fraction:g}" if s.read_fraction else s.read_bandwidth) if s.read_bandwidth
        else f"{s.read_gb_per_s_per_accelerator:g} GB/s per accelerator",
        "first_byte_latency_s": s.first_byte_latency_ms / 1e3,
        "cost": s.cost or f"{s.usd_per_gb_month:g} USD per GB-month", "sources": dict(s.sources),
    } for s in load_tier_specs()]
    return {"accelerators": accelerators, "racks": racks, "models": model_rows, "kv_tiers": tiers}


def catalog_command(args: argparse.Namespace, console: Console) -> int:
    from planner.output.catalog_view import render_catalog

    record = catalog_record()
    if args.json:
        write_json(args.json, record)
    render_catalog(record, console, args.section)
    return EXIT_OK
