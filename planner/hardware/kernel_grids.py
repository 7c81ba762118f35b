"""Shape-resolved kernel rates: the measured tables' structure kept as compact grids of correction
factors on top of the parametric forms (`planner/hardware/kernel_forms.py`).

A grid holds log(measured / parametric time) at log-spaced nodes of a kernel class's shape axes
(GEMM: m, n, k; grouped expert GEMM: tokens per expert; attention: batch and KV length; collectives:
message bytes). A query interpolates it multilinearly in log space and multiplies the parametric time
of its own shape by the factor. Beyond the measured range the factor is held at the edge node, so the
parametric form alone carries the extrapolation and the time stays continuous at the edge. A class
measured at several discrete shapes (head configurations, expert shapes, collective group sizes) keeps
one grid per shape over the same axes (`GridSet`); a query at an unmeasured shape takes the nearest
measured one in log distance.

`planner calibrate` writes the grids of one accelerator into `topologies/kernel_grids/<id>.zip` (a
zip: a JSON index of axes and shape keys, and one .npy array of log factors quantised to int8); this
module reads a file on first use, once.
"""

import functools
import gc
import io
import itertools
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = ["Cells", "Grid", "GridRef", "GridSet", "cell", "interpolate", "log_of", "on_lines", "read_grid_file", "write_grid_file"]

_SLICE_CACHE_LIMIT = 4096  # 1-D slices kept per grid (queries that vary along one axis only)
INT8_STEPS = 127  # a grid file stores log factors as int8 multiples of a per-grid step


def _log(values) -> np.ndarray:
    return np.log(np.maximum(np.asarray(values, dtype=float), 1e-300))


log_of = _log  # what a grid query takes its coordinates' logarithms with


def _cell(log_axis: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower node index and weight of the upper node for `x` on one axis, clamped to the axis."""
    if len(log_axis) == 1:
        return np.zeros(np.shape(x), dtype=int), np.zeros(np.shape(x))
    i = np.minimum(np.maximum(np.searchsorted(log_axis, x, side="right") - 1, 0), len(log_axis) - 2)
    w = np.minimum(np.maximum((x - log_axis[i]) / (log_axis[i + 1] - log_axis[i]), 0.0), 1.0)
    return i, w


class Cells(NamedTuple):
    """One axis's nodes as a line interpolation reads them (log space): the interior nodes (searching
    them gives the lower node of the cell, clamped to the axis), every cell's lower node and width."""

    interior: np.ndarray
    lower: np.ndarray
    spacing: np.ndarray


_CELLS: dict[bytes, Cells] = {}  # one per distinct axis: grids on the same nodes share theirs


def _cells_of(log_axis: np.ndarray) -> Cells | None:
    if len(log_axis) < 2:
        return None
    key = log_axis.tobytes()
    if key not in _CELLS:
        _CELLS[key] = Cells(log_axis[1:-1], log_axis[:-1], log_axis[1:] - log_axis[:-1])
    return _CELLS[key]


def cell(cells: Cells, log_x) -> tuple[np.ndarray, np.ndarray]:
    """`_cell` on an axis of two nodes or more: the lower node's index and the upper node's weight at `log_x`."""
    i = cells.interior.searchsorted(log_x, side="right")
    return i, np.minimum(np.maximum((log_x - cells.lower[i]) / cells.spacing[i], 0.0), 1.0)


def on_lines(lines: np.ndarray, i: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Factors on each of `lines` (log factors at an axis's nodes, one row each) at the cells `i`, `w`:
    shape (len(lines), *shape(i)); each cell's upper node is the next one (lines[:, 1:] at i)."""
    return np.exp(lines[:, i] * (1.0 - w) + lines[:, 1:][:, i] * w)


def interpolate(log_axes: tuple[np.ndarray, ...], values: np.ndarray, log_coords: tuple) -> np.ndarray:
    """Multilinear interpolation of `values` (on the node grid `log_axes`) at `log_coords`, each
    coordinate clamped to its axis; coordinates broadcast against each other."""
    coords = np.broadcast_arrays(*(np.asarray(c, dtype=float) for c in log_coords))
    cells = [_cell(axis, x) for axis, x in zip(log_axes, coords, strict=True)]
    out = np.zeros(coords[0].shape)
    for corner in itertools.product((0, 1), repeat=len(log_axes)):
        weight = np.ones(coords[0].shape)
        index = []
        for up, (i, w), axis in zip(corner, cells, log_axes, strict=True):
            weight = weight * (w if up else 1.0 - w)
            index.append(np.minimum(i + up, len(axis) - 1))
        out = out + weight * values[tuple(index)]
    return out


@dataclass(frozen=True, eq=False)
class Grid:
    """log correction factors on a tensor grid; `axes` are the node coordinates (natural units)."""

    axes: tuple[np.ndarray, ...]
    log_correction: np.ndarray
    _slices: dict = field(default_factory=dict, repr=False)

    @functools.cached_property
    def log_axes(self) -> tuple[np.ndarray, ...]:
        return tuple(_log(a) for a in self.axes)

    def correction(self, *coords) -> np.ndarray:
        """Measured over parametric time at `coords` (one per axis; arrays broadcast)."""
        if len(coords) == 1:  # one axis: its line
            return self.along(0, coords[0], ((),))[0]
        varying = [i for i, c in enumerate(coords) if np.ndim(c) > 0]
        if len(varying) <= 1:  # at most one axis varies: a cached line along it
            axis = varying[0] if varying else 0
            return self.along(axis, coords[axis], (tuple(float(c) for i, c in enumerate(coords) if i != axis),))[0]
        return np.exp(interpolate(self.log_axes, self.log_correction, tuple(_log(c) for c in coords)))

    @functools.cached_property
    def cells(self) -> tuple[Cells | None, ...]:
        """Each axis's `Cells` (None for a one-node axis), shared with every grid on the same nodes."""
        return tuple(_cells_of(a) for a in self.log_axes)

    def lines(self, axis: int, others: tuple[tuple[float, ...], ...]) -> np.ndarray:
        """The log factors along `axis` at its nodes, one row per tuple of the other axes' coordinates;
        each row is interpolated once and kept."""
        key = (axis, others)
        lines = self._slices.get(key)
        if lines is None:
            lines = np.stack([self._line(axis, tuple(float(v) for v in other)) for other in others])
            if len(self._slices) < _SLICE_CACHE_LIMIT:
                self._slices[key] = lines
        return lines

    def along(self, axis: int, x, others: tuple[tuple[float, ...], ...], found: dict | None = None) -> np.ndarray:
        """Factors at `x` on `axis`, one row per tuple of the other axes' coordinates: shape
        (len(others), *shape(x)). The same arithmetic as `_cell` and `interpolate` (searching the
        interior nodes gives the clamped lower node directly; the upper node is the next one).
        `found`: the cells already found at this same `x` on other grids' nodes, shared by the calls."""
        lines, cells = self.lines(axis, others), self.cells[axis]
        if cells is None:
            return np.exp(lines[:, np.zeros(np.shape(x), dtype=int)] * 1.0)
        if found is None:
            return on_lines(lines, *cell(cells, _log(x)))
        if id(cells) not in found:
            found[id(cells)] = cell(cells, _log(x))
        return on_lines(lines, *found[id(cells)])

    def _line(self, axis: int, other: tuple) -> np.ndarray:
        line = self._slices.get((axis, other))
        if line is None:
            fixed = iter(other)
            n = len(self.axes[axis])
            coords = tuple(self.log_axes[a] if a == axis else np.full(n, _log(next(fixed))) for a in range(len(self.axes)))
            line = interpolate(self.log_axes, self.log_correction, coords)
            if len(self._slices) < _SLICE_CACHE_LIMIT:
                self._slices[(axis, other)] = line
        return line


@dataclass(frozen=True, eq=False)
class GridSet:
    """Grids over the same axes, one per measured discrete shape (a row of `keys`)."""

    key_names: tuple[str, ...]
    keys: np.ndarray  # (n_shapes, n_key_fields), natural units
    axes: tuple[np.ndarray, ...]
    log_correction: np.ndarray  # (n_shapes, *node counts)
    _chosen: dict = field(default_factory=dict, repr=False)

    def nearest(self, key) -> int:
        """Index of the measured shape nearest to `key` (sum of squared log ratios; ties: first)."""
        distance = ((_log(self.keys) - _log(np.asarray(key, dtype=float))) ** 2).sum(axis=1)
        return int(np.argmin(distance))

    def grid(self, key) -> Grid:
        """The grid of the measured shape nearest to `key`."""
        key = tuple(map(float, key))
        if key not in self._chosen:
            self._chosen[key] = Grid(self.axes, self.log_correction[self.nearest(key)])
        return self._chosen[key]


# ---------------------------------------------------------------------------------------------
# Files: one zip per accelerator holding `index.json` (per grid: axes, keys, shape, offset and step)
# and `values.npy`, every grid's log factors as int8 multiples of its step, one flat array.


def _quantised(log_correction: np.ndarray) -> tuple[np.ndarray, float]:
    """int8 steps and the step (max |log factor| / 127: under 0.6% rounding for factors within 0.47-2.1x)."""
    values = np.asarray(log_correction, dtype=float)
    step = float(np.abs(values).max()) / INT8_STEPS or 1.0
    return np.round(values / step).astype(np.int8), step


def write_grid_file(path: Path, grids: dict[str, "Grid | GridSet"]) -> None:
    """Write `grids` as a deflated zip with fixed timestamps (same grids, same bytes)."""
    index, chunks, offset = {}, [], 0
    for name in sorted(grids):
        grid = grids[name]
        steps, step = _quantised(grid.log_correction)
        entry = {"axes": [[float(x) for x in a] for a in grid.axes], "shape": list(steps.shape), "offset": offset, "step": step}
        if isinstance(grid, GridSet):
            entry |= {"key_names": list(grid.key_names), "keys": [[float(x) for x in k] for k in grid.keys]}
        index[name] = entry
        chunks.append(steps.ravel())
        offset += steps.size
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.concatenate(chunks) if chunks else np.zeros(0, np.int8), allow_pickle=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for member, data in (("index.json", json.dumps(index, separators=(",", ":")).encode()), ("values.npy", buffer.getvalue())):
            info = zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)


@functools.lru_cache(maxsize=16)
def read_grid_file(path: Path) -> dict[str, "Grid | GridSet"]:
    """Every grid of a grid file, read once. The index's ~10^5 lists and floats live only until their
    arrays are made (reference counting frees them; none is in a cycle), so the cyclic garbage collector
    is paused meanwhile: its passes would only promote them and bring on a full collection later."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _read_grid_file(path)
    finally:
        if enabled:
            gc.enable()


def _read_grid_file(path: Path) -> dict[str, "Grid | GridSet"]:
    with zipfile.ZipFile(path) as archive:
        index = json.loads(archive.read("index.json"))
        flat = np.lib.format.read_array(io.BytesIO(archive.read("values.npy")), allow_pickle=False)
    out: dict[str, Grid | GridSet] = {}
    for name, entry in index.items():
        size = int(np.prod(entry["shape"]))
        values = flat[entry["offset"]:entry["offset"] + size].reshape(entry["shape"]).astype(float) * entry["step"]
        axes = tuple(np.array(a) for a in entry["axes"])
        if "keys" in entry:
            out[name] = GridSet(tuple(entry["key_names"]), np.array(entry["keys"]), axes, values)
        else:
            out[name] = Grid(axes, values)
    return out


@dataclass(frozen=True)
class GridRef:
    """A grid named in kernels.yaml: loaded from its file on first use."""

    path: Path
    name: str

    def get(self) -> Grid | GridSet:
        return self._loaded

    @functools.cached_property
    def _loaded(self) -> Grid | GridSet:
        return read_grid_file(self.path)[self.name]
