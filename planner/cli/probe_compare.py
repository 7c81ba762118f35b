"""The probed curves against the shipped ones of the same part, end to end: the decode step of each
dense model, estimated on the base part's catalog rack (its shipped curves) and on the probed rack
(the user catalog's curves), with the ratio per step term, and beside them the whole decode step
the probe measured (CUDA graph) where it did. Printed by `planner calibrate <probe dir> --out DIR`."""

from pathlib import Path

import pandas as pd
from rich.table import Table

from planner.cli.parser import build_parser
from planner.hardware.catalog import RackType
from planner.model.catalog import load_model_catalog
from planner.units import MS

__all__ = ["COMPARE_BATCHES", "COMPARE_CONTEXT", "Point", "compare_rows", "compare_table", "measured_points"]

COMPARE_BATCHES = (1, 16, 64)
COMPARE_CONTEXT = 2048
TENSOR_PARALLEL = (1, 2, 4, 8)
DENSE_FALLBACK = "llama-3.1-8b"
TERMS = ("weights", "kv", "compute", "overhead")
STEP_TABLE = "decode_step_perf.parquet"

Point = tuple[str, int, int, int, float | None]  # model, tp, batch, context, measured step seconds (None: not measured)


def _decode_step(catalog: Path, rack: str, point: Point, engine: str):
    """The pure decode step of one estimate at the point's mean context under `engine`'s curves (None
    when it does not fit HBM)."""
    from planner.cli.estimate import estimate_inputs
    from planner.physics.estimate import estimate

    model, tp, batch, context, _ = point
    # two output tokens after context - 1 prompt tokens: the decode step reads a mean context of `context`
    args = build_parser().parse_args(["estimate", "--model", model, "--rack", rack, "--tp", str(tp), "--batch", str(batch),
                                      "--isl", str(context - 1), "--osl", "2", "--engine", engine, "--kernel-catalog", str(catalog)])
    result = estimate(estimate_inputs(args))
    return result.decode_step if result.fits else None


def measured_points(probe_dir: Path) -> list[Point]:
    """The whole decode steps a (non-smoke) probe measured, at tensor parallelism 1."""
    found = sorted(Path(probe_dir).glob(f"probe/step/*/*/{STEP_TABLE}"))
    if not found:
        return []
    rows = pd.read_parquet(found[-1])
    return [(str(r.model), 1, int(r.batch_size), int(r.context), float(r.latency) * MS) for r in rows.itertuples()]


def default_points(models: list[str], n_accelerators: int) -> list[tuple[str, list[Point]]]:
    """Per dense model, its points at each tensor-parallel degree up to the rack's size (the first that fits is kept)."""
    archs = load_model_catalog()
    dense = [m for m in models if m in archs and not archs[m].is_moe] or [DENSE_FALLBACK]
    return [(m, [(m, tp, b, COMPARE_CONTEXT, None) for b in COMPARE_BATCHES]) for m in dense
            for tp in TENSOR_PARALLEL if tp <= n_accelerators]


def compare_rows(catalog: Path, shipped: RackType, probed: RackType, points: list[Point], engine: str) -> list[tuple]:
    """(point, shipped step, probed step) per point where the model fits both parts' HBM, both under the
    curves of `engine` (the one the probed curves were written under: like for like)."""
    rows = []
    for point in points:
        steps = _decode_step(catalog, shipped.id, point, engine), _decode_step(catalog, probed.id, point, engine)
        if None not in steps:
            rows.append((point, *steps))
    return rows


def first_fitting(catalog: Path, shipped: RackType, probed: RackType, candidates: list[tuple[str, list[Point]]], engine: str) -> list[tuple]:
    """Per model, the rows of its smallest tensor-parallel degree at which every batch fits."""
    rows, done = [], set()
    for model, points in candidates:
        if model in done:
            continue
        found = compare_rows(catalog, shipped, probed, points, engine)
        if len(found) == len(points):
            rows += found
            done.add(model)
    return rows


def compare_table(rows: list[tuple], key: str, base: str) -> Table:
    table = Table(title=f"decode step, probed {key} over shipped {base} curves (ms; ratio per term; measured: the probe's CUDA-graph step)")
    for column in ("model", "tp", "batch", "context", "shipped ms", "probed ms", "ratio", *TERMS, "measured ms"):
        table.add_column(column)
    for (model, tp, batch, context, measured_s), shipped, probed in rows:
        ratios = [f"{getattr(probed, f'{t}_s') / getattr(shipped, f'{t}_s'):.2f}" if getattr(shipped, f"{t}_s") > 0 else "-" for t in TERMS]
        table.add_row(model, str(tp), str(batch), str(context), f"{shipped.total_s / MS:.3f}", f"{probed.total_s / MS:.3f}",
                      f"{probed.total_s / shipped.total_s:.2f}", *ratios, "-" if measured_s is None else f"{measured_s / MS:.3f}")
    return table
