"""The largest batch a layout serves within a workload's limits: checked on a grid of batch sizes,
then refined exactly between the last grid point that passes and the first that fails.

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

__all__ = ["Limits", "Request", "batch_grid", "feasible", "largest_feasible_batch", "limit_reason", "limits_for"]

GRID_STEPS = (1.0, 1.5)  # batch grid: multiples 1, 1.5, 2, 3, 4, 6, 8, ... of the batch granularity
REFINE_POINTS = 257  # batch sizes evaluated at once when refining between two grid points

Request = tuple[DeploymentInputs, np.ndarray]  # what a search yields: the inputs and batches of a table it needs


def batch_grid(granularity: int, max_batch: int) -> np.ndarray:
    return np.array(_grid(granularity, max_batch), dtype=float)


@functools.lru_cache(maxsize=1024)  # a few dozen distinct grids, asked for by every workload and layout
def _grid(granularity: int, max_batch: int) -> tuple[int, ...]:
    multiples = sorted({round(step * 2**k) for k in range(40) for step in GRID_STEPS if step * 2**k * granularity <= max_batch})
    return tuple(m * granularity for m in multiples)


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


def _probes(lo: int, hi: int) -> np.ndarray:
    """Batches (in multiples of the granularity) to evaluate between `lo` and `hi`: all of them when
    they are few (what the evenly spaced points are then), else REFINE_POINTS evenly spaced."""
    if hi - lo + 1 <= REFINE_POINTS:
        return np.arange(lo, hi + 1)
    return np.unique(np.linspace(lo, hi, num=REFINE_POINTS).round().astype(int))


def largest_feasible_batch(inp: DeploymentInputs, limits: Limits,
                           table: BatchTable) -> Generator[Request, BatchTable, tuple[BatchTable, int, str] | None]:
    """From the layout's table on its batch grid: the largest feasible batch after an exact
    refinement between grid points, and the reason the next batch fails."""
    q = inp.layout.pp * inp.layout.dp_attn
    grid = table.batches
    checks = _checks(table, limits)
    ok = _all_pass(table, checks)
    if not ok[0]:
        return None
    last = int(np.flatnonzero(ok)[-1])
    if last == len(grid) - 1:
        return table, last, BatchLimit.MAX_BATCH
    lo, hi = int(grid[last]) // q, int(grid[last + 1]) // q  # multiples of q: lo feasible, hi not
    reason = _first_failed(checks, last + 1)
    while hi - lo > 1:
        probe = _probes(lo, hi)
        fine = yield inp, probe * q
        checks = _checks(fine, limits)
        best = int(np.flatnonzero(_all_pass(fine, checks))[-1])
        lo, hi = int(probe[best]), int(probe[best + 1])
        table, last, reason = fine, best, _first_failed(checks, best + 1)
    return table, last, reason
