"""Correction grids for `planner calibrate`: measured rows brought onto a log-spaced node grid, the
nodes no row measured filled from their neighbours, and the leave-one-out error of the result.

A grid stores log(measured / parametric) (the forms of `kernel_forms.py`, fitted first). Its nodes
are measured values of each axis; a row between nodes is left out of the grid and predicted by
interpolation, so it is held out by construction. Leave-one-out: a row held out between nodes is
predicted from the grid; a row at a node is predicted with that row left out, from the other rows
of its node where there are any (shapes that differ only in what the grid does not resolve), else as
the mean of the one-dimensional interpolations between its measured neighbours along each axis. Rows at the edge of every axis (no neighbours on both sides)
are outside the grid's range and not scored.
"""

from dataclasses import dataclass

import numpy as np

from planner.hardware.kernel_grids import interpolate

__all__ = ["AxisSpec", "GridBuild", "build_grid", "loo_error", "thin_nodes"]


@dataclass(frozen=True)
class AxisSpec:
    """One grid axis: the rows' coordinates on it and its nodes."""

    coords: np.ndarray
    nodes: np.ndarray


@dataclass(frozen=True)
class GridBuild:
    """A built grid: node values, measured-row counts per node, and each row's leave-one-out log error
    (predicted - measured log correction; NaN where the row is not scored)."""

    values: np.ndarray
    counts: np.ndarray
    loo_log_error: np.ndarray
    predicted_log: np.ndarray  # each row's leave-one-out prediction of its log correction (NaN: not scored)


def thin_nodes(values: np.ndarray, min_ratio: float) -> np.ndarray:
    """Distinct positive `values`, thinned so that neighbouring nodes differ by at least `min_ratio`
    (the smallest and largest are always kept)."""
    distinct = np.unique(np.asarray(values, dtype=float))
    kept = [distinct[0]]
    for v in distinct[1:-1]:
        if v >= kept[-1] * min_ratio:
            kept.append(v)
    if len(distinct) > 1:
        if distinct[-1] < kept[-1] * min_ratio and len(kept) > 1:
            kept[-1] = distinct[-1]
        else:
            kept.append(distinct[-1])
    return np.array(kept)


def _locate(axis: AxisSpec) -> tuple[np.ndarray, np.ndarray]:
    """Nearest node of each row and whether the row sits on it."""
    log_nodes, log_x = np.log(axis.nodes), np.log(axis.coords)
    nearest = np.abs(log_x[:, None] - log_nodes[None, :]).argmin(axis=1)
    return nearest, np.isclose(axis.nodes[nearest], axis.coords, rtol=1e-9)


def _fill(values: np.ndarray, log_axes: list[np.ndarray]) -> np.ndarray:
    """Nodes without a measurement, filled along each axis in turn by interpolation between (and
    constant beyond) the measured nodes of their line; any still empty get 0 (no correction)."""
    out = values.copy()
    for _ in range(len(log_axes)):
        for axis, nodes in enumerate(log_axes):
            moved = np.moveaxis(out, axis, -1)
            for index in np.ndindex(moved.shape[:-1]):
                line = moved[index]
                known = ~np.isnan(line)
                if known.any() and not known.all():
                    line[~known] = np.interp(nodes[~known], nodes[known], line[known])
    return np.nan_to_num(out, nan=0.0)


def _neighbour_estimates(raw: np.ndarray, counts: np.ndarray, log_axes: list[np.ndarray], nodes: tuple[np.ndarray, ...]) -> np.ndarray:
    """Per listed node: the mean over axes of the interpolation between its measured neighbours on
    that axis (NaN where no axis has measured neighbours on both sides)."""
    total, used = np.zeros(len(nodes[0])), np.zeros(len(nodes[0]))
    for axis, axis_nodes in enumerate(log_axes):
        i = nodes[axis]
        inner = (i > 0) & (i < len(axis_nodes) - 1)
        low = list(nodes)
        high = list(nodes)
        low[axis], high[axis] = np.clip(i - 1, 0, None), np.clip(i + 1, None, len(axis_nodes) - 1)
        ok = inner & (counts[tuple(low)] > 0) & (counts[tuple(high)] > 0)
        span = axis_nodes[high[axis]] - axis_nodes[low[axis]]
        w = np.where(ok, (axis_nodes[i] - axis_nodes[low[axis]]) / np.where(span > 0, span, 1.0), 0.0)
        estimate = np.nan_to_num(raw[tuple(low)]) * (1 - w) + np.nan_to_num(raw[tuple(high)]) * w
        total += np.where(ok, estimate, 0.0)
        used += ok
    return np.where(used > 0, total / np.maximum(used, 1.0), np.nan)


def build_grid(axes: list[AxisSpec], log_correction: np.ndarray) -> GridBuild:
    """The grid of `log_correction` (one value per row) over `axes`, and its leave-one-out errors."""
    log_axes = [np.log(a.nodes) for a in axes]
    located = [_locate(a) for a in axes]
    index = tuple(i for i, _ in located)
    on_node = np.logical_and.reduce([on for _, on in located])
    shape = tuple(len(a.nodes) for a in axes)
    sums, counts = np.zeros(shape), np.zeros(shape)
    node_rows = tuple(i[on_node] for i in index)
    np.add.at(sums, node_rows, log_correction[on_node])
    np.add.at(counts, node_rows, 1.0)
    raw = np.where(counts > 0, sums / np.maximum(counts, 1.0), np.nan)
    values = _fill(raw, log_axes)
    predicted = np.full(len(log_correction), np.nan)
    off = ~on_node
    if off.any():
        inside = np.logical_and.reduce([(a.coords[off] >= a.nodes[0]) & (a.coords[off] <= a.nodes[-1]) for a in axes])
        guess = interpolate(tuple(log_axes), values, tuple(np.log(a.coords[off]) for a in axes))
        predicted[np.flatnonzero(off)[inside]] = guess[inside]
    rows = np.flatnonzero(on_node)
    n = counts[node_rows]
    others = (sums[node_rows] - log_correction[rows]) / np.maximum(n - 1, 1.0)
    predicted[rows] = np.where(n > 1, others, _neighbour_estimates(raw, counts, log_axes, node_rows))
    return GridBuild(values, counts, predicted - log_correction, predicted)


def loo_error(measured_s: np.ndarray, predicted_s: np.ndarray) -> tuple[list[float], list[float], int]:
    """([median, p90] of |predicted / measured - 1|, [p10, p50, p90] of measured / predicted, rows
    scored) over the rows with a prediction."""
    ok = np.isfinite(predicted_s) & (predicted_s > 0)
    if not ok.any():
        return [float("nan")] * 2, [1.0, 1.0, 1.0], 0
    error = np.abs(predicted_s[ok] / measured_s[ok] - 1.0)
    ratio = measured_s[ok] / predicted_s[ok]
    return [float(q) for q in np.quantile(error, [0.5, 0.9])], [float(q) for q in np.quantile(ratio, [0.1, 0.5, 0.9])], int(ok.sum())
