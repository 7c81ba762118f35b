"""Without a demand, a disaggregated workload's plan is one decode replica and n replicas of one
prefill candidate that keep it fed: a pair. The pairs that matter are those no other pair beats on
all the model weighs: the workload's objective term, the cost per hour (under a cost cap) and the
racks it takes. Racks are compared as the model's packing rows count them (model_builder.
add_rack_budget): per rack type, the whole racks its stages take and, for every power-of-two size s,
the accelerators in its stages of size s or more; a pair no larger in every one of these fits
wherever the other fits, beside anything else.
"""

import numpy as np

from planner.modes import StageKind
from planner.solver.candidates import Candidate
from planner.solver.model_builder import RackPool, rack_items

__all__ = ["capacity", "fits", "fits_rows", "footprint", "plan_frontier"]


def _sizes(pool: RackPool) -> list[int]:
    return [2**k for k in range(pool.domain_size.bit_length()) if 2**k <= pool.domain_size]


def footprint(c: Candidate, replicas: int, pools: dict[str, RackPool]) -> tuple[int, ...]:
    """What `replicas` replicas of `c` take of the bounded pools, in the model's packing terms: per
    pool (sorted by rack type), whole racks, then accelerators in stages of at least each size."""
    out: list[int] = []
    for rack_id in sorted(pools):
        pool = pools[rack_id]
        if pool.count is None:
            continue
        mine = c.rack_id == rack_id
        kind, size = rack_items(c, pool) if mine else (StageKind.SLOTS, 0)
        whole = replicas * c.stages * size if mine and kind is StageKind.RACKS else 0
        out.append(whole)
        out += [replicas * c.stages * size if mine and kind is StageKind.SLOTS and size >= s else 0 for s in _sizes(pool)]
    return tuple(out)


def capacity(pools: dict[str, RackPool]) -> tuple[int, ...]:
    """The largest footprint the fleet holds alone (for a plan of one kind of stage per size)."""
    out: list[int] = []
    for rack_id in sorted(pools):
        pool = pools[rack_id]
        if pool.count is None:
            continue
        out.append(pool.perfect)
        out += [pool.perfect * s * (pool.domain_size // s) + s * pool.slots(s) for s in _sizes(pool)]
    return tuple(out)


def fits(row: np.ndarray, capacity: np.ndarray) -> bool:
    return bool(np.all(row <= capacity))


def fits_rows(row: np.ndarray, pools: dict[str, RackPool]) -> bool:
    """Whether a footprint (as `footprint` lays it out) meets every packing row of the model."""
    k = 0
    for rack_id in sorted(pools):
        pool = pools[rack_id]
        if pool.count is None:
            continue
        whole = int(row[k])
        if whole > pool.perfect:
            return False
        for j, size in enumerate(_sizes(pool)):
            if row[k + 1 + j] > (pool.perfect - whole) * size * (pool.domain_size // size) + size * pool.slots(size):
                return False
        k += 1 + len(_sizes(pool))
    return True


def plan_frontier(rows: np.ndarray) -> list[int]:
    """Positions of the rows (one pair each: objective term, cost per hour under a cost cap, then its
    footprint; all 'lower is better') that no other row beats: no worse in every figure and better in
    one, or equal and earlier."""
    order = np.lexsort(tuple(rows[:, k] for k in range(rows.shape[1] - 1, -1, -1))) if len(rows) else []
    kept: list[int] = []
    front = np.empty((0, rows.shape[1]), dtype=rows.dtype)
    for k in order:
        if len(front) and np.any(np.all(front <= rows[k], axis=1)):
            continue
        kept.append(int(k))
        front = np.vstack([front, rows[k]])
    return sorted(kept)
