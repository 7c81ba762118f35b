"""The probed curves against the shipped ones of the same part, end to end: the decode step of each
dense model the probe measured, at a few batches, estimated on the base part's catalog rack (its
shipped curves) and on the probed rack (the user catalog's curves), with the ratio per step term.
Printed by `planner calibrate <probe dir> --out DIR` when the part has shipped curves."""

from pathlib import Path

from rich.table import Table

from planner.cli.parser import build_parser
from planner.hardware.catalog import RackType
from planner.model.catalog import load_model_catalog
from planner.units import MS

__all__ = ["COMPARE_BATCHES", "compare_rows", "compare_table"]

COMPARE_BATCHES = (1, 16, 64)
TENSOR_PARALLEL = (1, 2, 4, 8)
DENSE_FALLBACK = "llama-3.1-8b"
TERMS = ("weights", "kv", "compute", "overhead")


def _decode_step(catalog: Path, rack: str, model: str, tp: int, batch: int):
    """The pure decode step of one estimate (None when it does not fit HBM)."""
    from planner.cli.estimate import estimate_inputs
    from planner.physics.estimate import estimate

    args = build_parser().parse_args(["estimate", "--model", model, "--rack", rack, "--tp", str(tp), "--batch", str(batch),
                                      "--kernel-catalog", str(catalog)])
    result = estimate(estimate_inputs(args))
    return result.decode_step if result.fits else None


def compare_rows(catalog: Path, shipped: RackType, probed: RackType, models: list[str]) -> list[tuple]:
    """(model, tp, batch, shipped step, probed step) per dense model and batch, at the smallest
    tensor-parallel degree (up to the rack's size) where the model fits both parts' HBM."""
    archs = load_model_catalog()
    dense = [m for m in models if m in archs and not archs[m].is_moe] or [DENSE_FALLBACK]
    rows = []
    for model in dense:
        for tp in (t for t in TENSOR_PARALLEL if t <= min(shipped.n_accelerators, probed.n_accelerators)):
            pairs = [(b, _decode_step(catalog, shipped.id, model, tp, b), _decode_step(catalog, probed.id, model, tp, b))
                     for b in COMPARE_BATCHES]
            if all(s is not None and p is not None for _, s, p in pairs):
                rows += [(model, tp, b, s, p) for b, s, p in pairs]
                break
    return rows


def compare_table(rows: list[tuple], key: str, base: str) -> Table:
    table = Table(title=f"decode step, probed {key} over shipped {base} curves (ms; ratio per term)")
    for column in ("model", "tp", "batch", "shipped ms", "probed ms", "ratio", *TERMS):
        table.add_column(column)
    for model, tp, batch, shipped, probed in rows:
        ratios = [f"{getattr(probed, f'{t}_s') / getattr(shipped, f'{t}_s'):.2f}" if getattr(shipped, f"{t}_s") > 0 else "-" for t in TERMS]
        table.add_row(model, str(tp), str(batch), f"{shipped.total_s / MS:.3f}", f"{probed.total_s / MS:.3f}",
                      f"{probed.total_s / shipped.total_s:.2f}", *ratios)
    return table
