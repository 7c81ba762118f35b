"""Correction grids for `planner calibrate`: measured rows brought onto a log-spaced node grid, the
nodes no row measured filled from their neighbours, and the leave-one-out error of the result.

A grid stores log(measured / parametric) (the forms of `kernel_forms.py`, fitted first). Its nodes
are measured values of each axis; a row between nodes is left out of the grid and predicted by
interpolation, so it is held out by construction. Leave-one-out: a row held out between nodes is
predicted from the grid; a row at a node is predicted with that row left out, from the other rows
of its node where there are any (shapes that differ only in what the grid does not resolve), else as
the mean of the one-dimensional interpolations between its measured neighbours along each axis.
Rows at the edge of every axis (no neighbours on both sides) are outside the grid's range and not
scored.

Noisy tables. Some tables scatter more from one node to the next than they trend: vLLM's DeepEP
low-latency combine on B200 wanders between 35 and 120 us at 1-128 tokens with no trend, NCCL's
all-gather on 8 H200s zig-zags by 20% between neighbouring message sizes. A grid through the raw
nodes reproduces that scatter, and a shape between two nodes takes the noise of both. So every grid
is also built smoothed: each node along the first axis (tokens, GEMM rows, sequences, message bytes)
replaced by the median of the measured nodes within SMOOTH_HALF_WIDTH places on either side, itself
included, reaching as far on both sides (a running median: robust to a lone outlier, a monotone run
and the end nodes stay as measured). Its leave-one-out leaves the row out of the smoothing as well: a row
alone at its node is predicted by the median of the measured nodes around it, its own node left out;
a row sharing its node, by the median with its node holding the mean of the other rows; where no
other node is within reach, from the smoothed neighbours along the other axes as above. Rows between
nodes are predicted by interpolating the smoothed grid, which they took no part in. Both grids are
scored on the same rows; calibrate_classes.py keeps per grid (a grid set as a whole) the one with the
smaller mean absolute log error of its leave-one-out predictions (the L1 loss, which a lone outlier
does not decide), the raw grid on a tie; kernels.yaml marks the smoothed ones `smoothed: true`.
Choosing between two candidates by their own leave-one-out errors flatters the chosen one's error
slightly (the lesser of two estimates). The smoother itself (a median over two places, not a local
line or a wider window) and the loss (not the root-mean-square, which chases the tails and raised the
median error of many grids) were picked by looking at these candidates' leave-one-out errors on
aiconfigurator-core 0.12.0's tables.
"""

from dataclasses import dataclass

import numpy as np

from planner.hardware.kernel_grids import interpolate

__all__ = ["SMOOTH_HALF_WIDTH", "AxisSpec", "GridBuild", "build_grid", "loo_error", "smooth_first_axis", "thin_nodes"]

SMOOTH_HALF_WIDTH = 2  # a smoothed node: the median of the measured nodes within two places of it on the first axis


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
    if not np.isnan(out).any():
        return out
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


def _windows(values: np.ndarray, half_width: int) -> np.ndarray:
    """Each node's neighbourhood along axis 0, stacked first: out[half_width + d][j] = values[j + d]
    for |d| <= min(half_width, j, last - j) (the same reach on both sides: an end node is its own
    neighbourhood, so the ends stay as measured and a monotone run stays as it is), NaN elsewhere."""
    n = len(values)
    out = np.full((2 * half_width + 1, *values.shape), np.nan)
    reach = np.minimum(np.minimum(np.arange(n), n - 1 - np.arange(n)), half_width)
    for place, step in enumerate(range(-half_width, half_width + 1)):
        lo, hi = max(0, -step), min(n, n - step)
        out[place, lo:hi] = values[lo + step:hi + step]
        out[place, reach < abs(step)] = np.nan
    return out


def _median(stack: np.ndarray) -> np.ndarray:
    """Median over axis 0 ignoring NaN (the mean of the two middle values of an even count); NaN where
    every value is. np.nanmedian gives the same, slower on the many small grids of a table."""
    ordered = np.sort(stack, axis=0)  # NaN last
    count = (~np.isnan(stack)).sum(axis=0)
    low = np.take_along_axis(ordered, np.maximum((count - 1) // 2, 0)[None], axis=0)[0]
    high = np.take_along_axis(ordered, (count // 2)[None], axis=0)[0] if len(stack) else low
    return np.where(count > 0, (low + high) / 2.0, np.nan)


def smooth_first_axis(raw: np.ndarray, half_width: int = SMOOTH_HALF_WIDTH) -> np.ndarray:
    """`raw` (NaN: not measured) with each node replaced by the median of the measured nodes within
    `half_width` places of it along axis 0, itself included (NaN where there are none)."""
    return _median(_windows(raw, half_width))


def _smoothed_estimates(windows: np.ndarray, smoothed: np.ndarray, counts: np.ndarray, others: np.ndarray, log_axes: list[np.ndarray],
                        node_rows: tuple[np.ndarray, ...]) -> np.ndarray:
    """Leave-one-out estimates, on the smoothed grid, of rows at nodes: the median of the measured
    nodes within reach along axis 0 with the row's own node left out (a lone row) or holding the mean
    of its other rows; where no other node is within reach, the smoothed neighbours along each axis.
    `windows`: the raw grid's `_windows`."""
    around = windows[(slice(None), *node_rows)]
    n = counts[node_rows]
    around[SMOOTH_HALF_WIDTH] = np.where(n > 1, others, np.nan)
    estimate = _median(around)
    missing = np.isnan(estimate)
    if missing.any():
        estimate[missing] = _neighbour_estimates(smoothed, counts, log_axes, tuple(i[missing] for i in node_rows))
    return estimate


def build_grid(axes: list[AxisSpec], log_correction: np.ndarray) -> tuple[GridBuild, GridBuild]:
    """The grids of `log_correction` (one value per row) over `axes`, raw and smoothed along the first
    axis, each with its leave-one-out errors, scored on the same rows (those the raw grid scores)."""
    log_axes = [np.log(a.nodes) for a in axes]
    located = [_locate(a) for a in axes]
    on_node = np.logical_and.reduce([on for _, on in located])
    node_rows = tuple(i[on_node] for i, _ in located)
    shape = tuple(len(a.nodes) for a in axes)
    sums, counts = np.zeros(shape), np.zeros(shape)
    np.add.at(sums, node_rows, log_correction[on_node])
    np.add.at(counts, node_rows, 1.0)
    raw = np.where(counts > 0, sums / np.maximum(counts, 1.0), np.nan)
    rows, n = np.flatnonzero(on_node), counts[node_rows]
    others = (sums[node_rows] - log_correction[rows]) / np.maximum(n - 1, 1.0)
    builds, windows = [], _windows(raw, SMOOTH_HALF_WIDTH)
    for smoothed in (None, _median(windows)):
        values = _fill(raw if smoothed is None else smoothed, log_axes)
        predicted = _held_out(axes, log_axes, values, on_node)
        if smoothed is None:
            predicted[rows] = np.where(n > 1, others, _neighbour_estimates(raw, counts, log_axes, node_rows))
        else:
            predicted[rows] = _smoothed_estimates(windows, smoothed, counts, others, log_axes, node_rows)
            predicted[np.isnan(builds[0].predicted_log)] = np.nan
        builds.append(GridBuild(values, counts, predicted - log_correction, predicted))
    return builds[0], builds[1]


def _held_out(axes: list[AxisSpec], log_axes: list[np.ndarray], values: np.ndarray, on_node: np.ndarray) -> np.ndarray:
    """Predictions of the rows between nodes (held out by construction) inside the grid's range from
    the grid `values`; NaN for every other row."""
    predicted = np.full(len(on_node), np.nan)
    off = ~on_node
    if off.any():
        inside = np.logical_and.reduce([(a.coords[off] >= a.nodes[0]) & (a.coords[off] <= a.nodes[-1]) for a in axes])
        guess = interpolate(tuple(log_axes), values, tuple(np.log(a.coords[off]) for a in axes))
        predicted[np.flatnonzero(off)[inside]] = guess[inside]
    return predicted


def loo_error(measured_s: np.ndarray, predicted_s: np.ndarray) -> tuple[list[float], list[float], int]:
    """([median, p90] of |predicted / measured - 1|, [p10, p50, p90] of measured / predicted, rows
    scored) over the rows with a prediction."""
    ok = np.isfinite(predicted_s) & (predicted_s > 0)
    if not ok.any():
        return [float("nan")] * 2, [1.0, 1.0, 1.0], 0
    error = np.abs(predicted_s[ok] / measured_s[ok] - 1.0)
    ratio = measured_s[ok] / predicted_s[ok]
    return [float(q) for q in np.quantile(error, [0.5, 0.9])], [float(q) for q in np.quantile(ratio, [0.1, 0.5, 0.9])], int(ok.sum())
