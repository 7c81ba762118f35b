"""Column groups of a `BatchTable` (arrays of shape (n_batches,)) that its readers take together: the
pure decode step's terms and the HBM use; and how a table or group is cut to some of its rows or
joined with another's (every batch's row depends on that batch alone)."""

from dataclasses import dataclass

import numpy as np

__all__ = ["ColumnGroup", "DecodeColumns", "MemoryColumns", "joined", "rows_of"]


class ColumnGroup:
    """A record of per-batch columns that `rows_of` and `joined` cut and join with its table's."""


@dataclass(frozen=True)
class DecodeColumns(ColumnGroup):
    """The pure decode step (what a decode token costs alone), per output token on the slowest stage:
    its terms sum to the decode TPOT under the combination rule."""

    compute_s: np.ndarray
    weights_s: np.ndarray
    kv_s: np.ndarray
    comm_s: np.ndarray
    overhead_s: np.ndarray  # kernel floors and elementwise work (calibrated model; 0 under the roofline)
    low_ratio: np.ndarray  # p10 and p90 of the step as ratios to it
    high_ratio: np.ndarray

    @property
    def terms(self) -> tuple[np.ndarray, ...]:
        """compute, weights, kv, comm, overhead (the order `StepTime` takes them in)."""
        return self.compute_s, self.weights_s, self.kv_s, self.comm_s, self.overhead_s


@dataclass(frozen=True)
class MemoryColumns(ColumnGroup):
    """HBM use of the fullest stage's accelerators at each batch, and the prompt cache's bytes."""

    weights_bytes: np.ndarray
    kv_bytes: np.ndarray
    activations_bytes: np.ndarray
    capacity_bytes: float
    cache_bytes: np.ndarray  # prompt-cache bytes per accelerator (in HBM for the hbm tier, else in its tier)
    cache_in_hbm: bool
    cache_fits: np.ndarray  # the prompt cache fits its tier

    @property
    def used_bytes(self) -> np.ndarray:
        return self.weights_bytes + self.kv_bytes + self.activations_bytes + (self.cache_bytes if self.cache_in_hbm else 0.0)

    @property
    def fits(self) -> np.ndarray:
        return (self.used_bytes <= self.capacity_bytes) & self.cache_fits


def _cut(value, index):
    if isinstance(value, np.ndarray):
        return value[index]
    if isinstance(value, ColumnGroup):
        return rows_of(value, index)
    if type(value) is tuple:  # a tuple of columns (a NamedTuple such as StepTime is one value)
        return tuple(_cut(item, index) for item in value)
    return value


def rows_of(record, index: np.ndarray | slice):
    """`record` (a table or column group) at the rows `index` picks (a slice: views of its arrays);
    no __init__: the fields are `record`'s."""
    rows = object.__new__(type(record))
    rows.__dict__.update({name: _cut(value, index) for name, value in record.__dict__.items()})
    return rows


def _join(value, other):
    if isinstance(value, np.ndarray):
        return np.concatenate([value, other])
    if isinstance(value, ColumnGroup):
        return joined(value, other)
    if type(value) is tuple:
        return tuple(_join(a, b) for a, b in zip(value, other, strict=True))
    return value


def joined(record, other):
    """`record`'s rows, then `other`'s (the same inputs at further batches)."""
    rows = object.__new__(type(record))
    rows.__dict__.update({name: _join(value, other.__dict__[name]) for name, value in record.__dict__.items()})
    return rows
