"""The batches a layout serves within a workload's limits: checked on a grid of batch sizes, then
every multiple of the batch granularity up to the first grid point past the last that passes
(`feasible_chain`). A layout's first table holds its grid and its first HEAD_MULTIPLES multiples
(`first_batches`), so that a chain ending there needs no second table; once a layout's chain has run
further, later layouts of the same granularity in the enumeration start with as many (`Reach`, at
most MAX_HEAD_MULTIPLES). How a layout's rows are split between its tables changes no number: each
batch's row depends on that batch alone.

The searches are generators: each batch table they need is asked for by yielding (inputs, batches)
and comes back through `send`, so that `shared_tables.run_together` can evaluate the tables of
workloads that differ only in their limits in one call.
"""

import functools
from collections.abc import Generator
from dataclasses import dataclass

import numpy as np

from planner.modes import BatchLimit, ServingRole
from planner.physics.estimate import BatchTable, DeploymentInputs
from planner.problem.resolve import ResolvedWorkload

__all__ = ["Limits", "Reach", "Request", "batch_grid", "every_batch", "feasible", "feasible_chain", "first_batches", "limit_reason", "limits_for"]

GRID_STEPS = (1.0, 1.5)  # batch grid: multiples 1, 1.5, 2, 3, 4, 6, 8, ... of the batch granularity
# A layout's first table also holds every multiple of its granularity up to this many: most layouts'
# feasible batches end below it, and a table's fixed cost is that of hundreds of rows.
HEAD_MULTIPLES = 32
MAX_HEAD_MULTIPLES = 128  # what a first table grows to after longer chains of its granularity (a row costs ~1/250 of a table)

Request = tuple[DeploymentInputs, np.ndarray]  # what a search yields: the inputs and batches of a table it needs


def batch_grid(granularity: int, max_batch: int) -> np.ndarray:
    return np.array(_grid(granularity, max_batch), dtype=float)


@functools.lru_cache(maxsize=1024)  # a few dozen distinct grids, asked for by every workload and layout
def _grid(granularity: int, max_batch: int) -> tuple[int, ...]:
    """Multiples 1, 1.5, 2, 3, 4, ... of the granularity, and the largest multiple the cap allows (so
    that a layout every grid point suits is refined up to the cap, not stopped at the last point)."""
    multiples = {round(step * 2**k) for k in range(40) for step in GRID_STEPS if step * 2**k * granularity <= max_batch}
    if max_batch >= granularity:
        multiples.add(max_batch // granularity)
    return tuple(m * granularity for m in sorted(multiples))


@functools.lru_cache(maxsize=1024)
def first_batches(granularity: int, max_batch: int, head_multiples: int = HEAD_MULTIPLES) -> tuple[np.ndarray, np.ndarray, int]:
    """A layout's first table: its batches (the grid and the first `head_multiples` multiples of the
    granularity, sorted), the indices of the grid's batches among them, and how many multiples lead
    them (rows 0..head-1 are the multiples 1..head). Read only: cached."""
    grid = batch_grid(granularity, max_batch)
    head = min(head_multiples, max_batch // granularity)
    batches = np.union1d(np.arange(1, head + 1) * float(granularity), grid)
    grid_index = np.searchsorted(batches, grid)
    batches.setflags(write=False)
    grid_index.setflags(write=False)
    return batches, grid_index, head


class Reach:
    """How many multiples of each granularity the first tables of an enumeration's next layouts hold:
    HEAD_MULTIPLES, or the longest chain of that granularity so far (at most MAX_HEAD_MULTIPLES)."""

    def __init__(self) -> None:
        self._multiples: dict[int, int] = {}

    def head(self, granularity: int, max_batch: int) -> int:
        """Multiples of `granularity` the next first table holds (before the cap `max_batch`). Where
        a table of the usual HEAD_MULTIPLES would leave a second table of one row (the cap allows one
        multiple more), the usual: see `feasible_chain`."""
        if max_batch // granularity == HEAD_MULTIPLES + 1:
            return HEAD_MULTIPLES
        return self._multiples.get(granularity, HEAD_MULTIPLES)

    def saw(self, granularity: int, chain_multiples: int) -> None:
        self._multiples[granularity] = max(self._multiples.get(granularity, HEAD_MULTIPLES), min(chain_multiples, MAX_HEAD_MULTIPLES))


@dataclass(frozen=True)
class Limits:
    """What a batch must satisfy: the workload's limits, and for a decode replica the NICs that
    receive its requests' KV caches."""

    tpot_s: float | None
    ttft_s: float | None
    inbound_bytes_per_s: float | None = None  # NIC capacity for KV arriving at a decode replica
    kv_per_request_bytes: float = 0.0
    output_tokens: int = 1
    slow_end: bool = False  # hold the latency limits at the p90 of the prediction's range


def limits_for(workload: ResolvedWorkload, role: ServingRole, nic_bytes_per_s: float, kv_bytes: float, slow_end: bool = False) -> Limits:
    """A decode replica's TTFT is checked on prefill-decode pairs; a prefill replica emits no output
    token (its pass must meet the TTFT limit alone, the pair is checked again)."""
    if role is ServingRole.DECODE:
        return Limits(workload.tpot_limit_s, None, nic_bytes_per_s, kv_bytes, workload.output_tokens, slow_end)
    if role is ServingRole.PREFILL:
        return Limits(None, workload.ttft_limit_s, slow_end=slow_end)
    return Limits(workload.tpot_limit_s, workload.ttft_limit_s, slow_end=slow_end)


def _checks(table: BatchTable, limits: Limits) -> list[tuple[str, np.ndarray]]:
    checks = [("hbm", table.fits)]
    if limits.tpot_s is not None:
        checks.append(("tpot", (table.tpot_high_s if limits.slow_end else table.tpot_s) <= limits.tpot_s))
    if limits.ttft_s is not None:
        checks.append(("ttft", (table.ttft_high_s if limits.slow_end else table.ttft_p90_s) <= limits.ttft_s))
    if limits.inbound_bytes_per_s is not None:
        inbound = table.sustained_output_tokens_per_s / limits.output_tokens * limits.kv_per_request_bytes
        checks.append(("nic", inbound <= limits.inbound_bytes_per_s))
    return checks


def _all_pass(table: BatchTable, checks: list[tuple[str, np.ndarray]]) -> np.ndarray:
    ok = np.ones_like(table.batches, dtype=bool)
    for _, passed in checks:
        ok &= passed
    return ok


def _first_failed(checks: list[tuple[str, np.ndarray]], index: int) -> BatchLimit:
    for name, passed in checks:
        if not passed[index]:
            return BatchLimit(name)
    return BatchLimit.MAX_BATCH


def feasible(table: BatchTable, limits: Limits) -> np.ndarray:
    return _all_pass(table, _checks(table, limits))


def limit_reason(table: BatchTable, limits: Limits, index: int) -> BatchLimit:
    """Which constraint the batch after `index` violates (the one that stopped the batch growing)."""
    return _first_failed(_checks(table, limits), index)


def feasible_chain(inp: DeploymentInputs, limits: Limits, first: BatchTable, grid_index: np.ndarray,
                   head: int) -> Generator[Request, BatchTable, tuple[BatchTable, np.ndarray, str, int] | None]:
    """From the layout's first table (`first_batches`: its grid at `grid_index`, the multiples 1..head
    of the granularity in its first rows): a table whose first `top` rows are the layout at every
    multiple of the granularity up to the first grid point past the last feasible one (`first`
    itself when they are among its rows), the indices of the feasible batches among those rows, the
    reason the batch after the largest of them fails, and `top` (None when even the smallest fails)."""
    q = inp.layout.pp * inp.layout.dp_attn
    checks = _checks(first, limits)
    passed = _all_pass(first, checks)
    ok = passed[grid_index]
    if not ok[0]:
        return None
    grid = first.batches[grid_index]
    last = int(np.flatnonzero(ok)[-1])
    top = (int(grid[last]) if last == len(grid) - 1 else int(grid[last + 1]) - q) // q
    if top <= head:  # rows 0..top-1 of the first table (checks on rows are the rows of the checks)
        chain, chain_checks = first, checks
    else:
        # A table of one row and one stage sums its GEMM shapes in another order than a table of
        # several (numpy reduces a contiguous axis pairwise), so a row is evaluated alone only where a
        # first table of HEAD_MULTIPLES leaves it alone too (`Reach.head`), else with the row before.
        start = head if top == head + 1 and head > HEAD_MULTIPLES else head + 1
        rest = yield inp, np.arange(start, top + 1) * float(q)
        chain = first.rows(slice(0, start - 1)).followed_by(rest)
        chain_checks = _checks(chain, limits)
        passed = _all_pass(chain, chain_checks)
    members = np.flatnonzero(passed[:top])
    largest = int(members[-1])
    if largest + 1 < top:
        reason = _first_failed(chain_checks, largest + 1)
    else:
        reason = BatchLimit.MAX_BATCH if last == len(grid) - 1 else _first_failed(checks, int(grid_index[last + 1]))
    return chain, members, reason, top


def every_batch(inp: DeploymentInputs, max_batch: int) -> Generator[Request, BatchTable, BatchTable]:
    """The layout's table at every multiple of its batch granularity up to the largest that fits HBM
    (or `max_batch`), with no grid: what the exhaustive reference enumerates. HBM use grows with the
    batch, so the range doubles until its last batch no longer fits."""
    q = inp.layout.pp * inp.layout.dp_attn
    top = max_batch // q
    count = min(64, top)
    while True:
        table = yield inp, np.arange(1, count + 1) * float(q)
        if count == top or not table.fits[-1]:
            return table
        count = min(2 * count, top)
