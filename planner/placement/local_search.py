"""Packing expert copies onto ranks and improving a packing: the steps of the expert placement that do
not choose replica counts (planner/placement/experts.py calls them, planner/placement/replicas.py
runs them for each candidate count vector).

- `pack`: longest-processing-time with a slot cap (copies of one expert on different ranks);
- `swap`: one copy of the hottest rank against a lighter one elsewhere while that lowers the maximum,
  optionally within a move budget (docs/cpsat.md section 6.4);
- `exchange`: the same descent with two copies against two as well (ranks of four or more slots);
- `tabu`: swaps that may raise the load of the partner rank, with recently moved copies barred from
  moving back, to leave the plateaus where no swap lowers the maximum (needed with three slots per rank).

Every rank is full: ranks only trade copies, one for one or two for two.
"""

import heapq
import itertools
import time

import numpy as np

__all__ = ["exchange", "holds_matrix", "pack", "swap", "tabu"]

TOLERANCE = 1e-12  # loads closer than this are equal (loads are relative, of order 1 per expert)
# Tabu search, tuned on DeepSeek-V3 EP128 (three slots per rank), lognormal sigma 0.9 loads, 58 layers:
# a tenure of 10 / 20 / 40 iterations left the worst layer at 0.19% / 0.15% / 0.13% above the bound
# after at most 500 iterations (about 60 us each); a tenure of 5 cycles (0.71%, no better than swaps).
# With 1,000 iterations every layer came within 0.1% of the bound, the longest run without a new best
# being 181 iterations: a search that finds nothing new in 200 stops.
TABU_TENURE = 30
TABU_ITERATIONS = 1000
TABU_STALL = 200


def holds_matrix(ranks: list[list[int]], n_experts: int) -> np.ndarray:
    """holds[r, e]: rank r holds a copy of expert e."""
    out = np.zeros((len(ranks), n_experts), dtype=bool)
    for r, rank in enumerate(ranks):
        out[r, rank] = True
    return out


def pack(loads: np.ndarray, copies: np.ndarray, n_ranks: int, slots_per_rank: int) -> list[list[int]]:
    """Copies largest first, each into the least-loaded rank with room and without it (lowest index
    among equals). When every rank with room already holds the expert (the last copies of one expert
    can meet only such ranks), `_unstick` frees a slot for it elsewhere."""
    experts = np.repeat(np.arange(len(loads)), copies)
    sizes = (loads / copies)[experts]
    order = np.lexsort((experts, -sizes))  # largest first, lowest expert among equals
    items = zip(sizes[order].tolist(), experts[order].tolist(), strict=True)
    ranks: list[list[int]] = [[] for _ in range(n_ranks)]
    held: list[set[int]] = [set() for _ in range(n_ranks)]
    total = [0.0] * n_ranks
    open_ranks = [(0.0, r) for r in range(n_ranks)]  # heap of (load, rank) over ranks with a free slot
    for load, e in items:
        skipped = []
        while open_ranks and e in held[open_ranks[0][1]]:
            skipped.append(heapq.heappop(open_ranks))
        if open_ranks:
            rank_load, r = heapq.heappop(open_ranks)
        else:
            r = _unstick(loads / copies, ranks, held, total, e, load, skipped[0][1])
            skipped = [(total[s], s) for _, s in skipped if len(ranks[s]) < slots_per_rank]
            rank_load = total[r]
        ranks[r].append(e)
        held[r].add(e)
        total[r] = rank_load + load
        if len(ranks[r]) < slots_per_rank:
            heapq.heappush(open_ranks, (total[r], r))
        for entry in skipped:
            heapq.heappush(open_ranks, entry)
    return ranks


def _unstick(per_copy: np.ndarray, ranks: list[list[int]], held: list[set[int]], total: list[float], e: int, load: float,
             open_rank: int) -> int:
    """A full rank s without e hands one copy f that `open_rank` lacks to `open_rank`; returns s, whose
    freed slot takes e. s exists: a rank without e remains while e has copies to place, and a full s
    holds a copy `open_rank` lacks (it holds more copies than `open_rank`)."""
    best = None
    for s, rank in enumerate(ranks):
        if e in held[s]:  # the ranks without e are full: else e would have found room
            continue
        for f in rank:
            if f not in held[open_rank]:
                key = (max(total[s] - per_copy[f] + load, total[open_rank] + per_copy[f]), s, f)
                best = key if best is None or key < best else best
    _, s, f = best
    ranks[s].remove(f)
    held[s].discard(f)
    ranks[open_rank].append(f)
    held[open_rank].add(f)
    total[s] -= per_copy[f]
    total[open_rank] += per_copy[f]
    return s


def swap(per_copy: np.ndarray, ranks: list[list[int]], time_limit_s: float, previous: list[list[int]] | None = None,
         budget: int | None = None) -> list[list[int]]:
    """Swap one copy of the hottest rank with a lighter copy elsewhere while that lowers the
    hottest rank without creating a new maximum (docs/cpsat.md section 6.4), all candidate swaps of an
    iteration scored at once. With `previous` and `budget`, only swaps that keep the moves (copies on
    a rank that did not hold them before) within the budget."""
    slot = np.array(ranks)  # (ranks, slots): every rank is full
    n_ranks = len(slot)
    copy_load = per_copy[slot]
    loads = copy_load.sum(axis=1)
    holds = np.zeros((n_ranks, len(per_copy)), dtype=bool)
    holds[np.arange(n_ranks)[:, None], slot] = True
    new_pair = None
    if previous is not None and budget is not None:
        new_pair = ~holds_matrix(previous, len(per_copy))  # new_pair[r, e]: holding e on r costs a move
        moves = int(new_pair[np.arange(n_ranks)[:, None], slot].sum())
    deadline = time.perf_counter() + time_limit_s
    while time.perf_counter() < deadline:
        hot = int(np.argmax(loads))
        d = copy_load[hot][:, None, None] - copy_load[None, :, :]  # (hot slot i, rank r, slot j)
        valid = (d > TOLERANCE) & ~holds[:, slot[hot]].T[:, :, None] & ~holds[hot][slot][None, :, :]
        valid[:, hot, :] = False
        if new_pair is not None:
            a_to_r = new_pair[:, slot[hot]].T[:, :, None]  # (i, r, 1)
            b_to_hot = new_pair[hot][slot][None, :, :]  # (1, r, j)
            a_at_hot = new_pair[hot][slot[hot]][:, None, None]
            b_at_r = new_pair[np.arange(n_ranks)[:, None], slot][None, :, :]
            delta = a_to_r.astype(int) + b_to_hot - a_at_hot - b_at_r
            valid &= moves + delta <= budget
        new_max = np.where(valid, np.maximum(loads[hot] - d, loads[None, :, None] + d), np.inf)
        i, r, j = np.unravel_index(int(np.argmin(new_max)), new_max.shape)
        if not new_max[i, r, j] < loads[hot] - TOLERANCE:
            break
        if new_pair is not None:
            moves += int(delta[i, r, j])
        _swap_copies(per_copy, slot, holds, copy_load, loads, hot, i, r, j)
    return slot.tolist()


def _swap_copies(per_copy: np.ndarray, slot: np.ndarray, holds: np.ndarray, copy_load: np.ndarray, loads: np.ndarray,
                 hot: int, i: int, r: int, j: int) -> tuple[int, int]:
    """Exchange the copy in slot i of rank `hot` with the copy in slot j of rank r, updating the
    holdings, per-slot loads and rank loads in place; returns (copy that left hot, copy that entered)."""
    a, b = slot[hot, i], slot[r, j]
    holds[hot, a], holds[r, b], holds[hot, b], holds[r, a] = False, False, True, True
    slot[hot, i], slot[r, j] = b, a
    copy_load[hot, i], copy_load[r, j] = per_copy[b], per_copy[a]
    loads[hot] += per_copy[b] - per_copy[a]
    loads[r] += per_copy[a] - per_copy[b]
    return a, b


def exchange(per_copy: np.ndarray, ranks: list[list[int]], target: float, deadline: float) -> list[list[int]]:
    """`swap` with two copies of the hottest rank against two of another rank as well, the best
    exchange of either size per iteration, while that lowers the maximum and it is above `target`. With
    three slots per rank two-for-two is one-for-one seen from the other copy: only four or more gain."""
    slot = np.array(ranks)
    if slot.shape[1] < 4:
        return ranks
    copy_load = per_copy[slot]
    loads = copy_load.sum(axis=1)
    holds = holds_matrix(ranks, len(per_copy))
    subsets = [np.array(list(itertools.combinations(range(slot.shape[1]), size))) for size in (1, 2)]  # (subsets, size)
    while loads.max() > target and time.perf_counter() < deadline:
        hot = int(np.argmax(loads))
        best = None
        for sub in subsets:
            d = copy_load[hot][sub].sum(axis=1)[:, None, None] - copy_load[:, sub].sum(axis=2)[None, :, :]  # (A, rank, B)
            gives = holds[:, slot[hot][sub]].any(axis=2).T  # (A, rank): the rank already holds one of A
            takes = holds[hot][slot[:, sub]].any(axis=2)  # (rank, B): hot already holds one of B
            valid = (d > TOLERANCE) & ~gives[:, :, None] & ~takes[None, :, :]
            valid[:, hot, :] = False
            new_max = np.where(valid, np.maximum(loads[hot] - d, loads[None, :, None] + d), np.inf)
            a, r, b = np.unravel_index(int(np.argmin(new_max)), new_max.shape)
            if new_max[a, r, b] < loads[hot] - TOLERANCE and (best is None or new_max[a, r, b] < best[0]):
                best = (new_max[a, r, b], sub[a], int(r), sub[b])
        if best is None:
            break
        _, mine, r, theirs = best
        out, into = slot[hot, mine].copy(), slot[r, theirs].copy()
        holds[hot, out], holds[r, into], holds[hot, into], holds[r, out] = False, False, True, True
        slot[hot, mine], slot[r, theirs] = into, out
        copy_load[hot], copy_load[r] = per_copy[slot[hot]], per_copy[slot[r]]
        loads[hot], loads[r] = copy_load[hot].sum(), copy_load[r].sum()
    return slot.tolist()


def tabu(per_copy: np.ndarray, ranks: list[list[int]], target: float, deadline: float,
         iterations: int = TABU_ITERATIONS, tenure: int = TABU_TENURE) -> list[list[int]]:
    """Tabu search over one-for-one swaps of the hottest rank: each iteration takes the swap that
    leaves the lower maximum of the two ranks it touches, even when the partner ends above the old
    maximum, except swaps that bring a copy back to a rank it left within `tenure` iterations (unless
    that beats the best placement seen). Returns the best placement seen; stops at `target` or after
    TABU_STALL iterations without a new best."""
    slot = np.array(ranks)
    copy_load = per_copy[slot]
    loads = copy_load.sum(axis=1)
    holds = holds_matrix(ranks, len(per_copy))
    barred_until = np.zeros(holds.shape, dtype=int)  # expert e may enter rank r again at iteration barred_until[r, e]
    best_max, best, best_it = float(loads.max()), slot.copy(), 0
    for it in range(1, iterations + 1):
        if best_max <= target or it - best_it > TABU_STALL or time.perf_counter() > deadline:
            break
        hot = int(np.argmax(loads))
        d = copy_load[hot][:, None, None] - copy_load[None, :, :]  # (hot slot i, rank r, slot j)
        valid = (d > TOLERANCE) & ~holds[:, slot[hot]].T[:, :, None] & ~holds[hot][slot][None, :, :]
        valid[:, hot, :] = False
        new_max = np.maximum(loads[hot] - d, loads[None, :, None] + d)
        barred = (barred_until[:, slot[hot]].T[:, :, None] > it) | (barred_until[hot][slot][None, :, :] > it)
        new_max = np.where(valid & (~barred | (new_max < best_max - TOLERANCE)), new_max, np.inf)
        i, r, j = np.unravel_index(int(np.argmin(new_max)), new_max.shape)
        if not np.isfinite(new_max[i, r, j]):
            break
        a, b = _swap_copies(per_copy, slot, holds, copy_load, loads, hot, i, r, j)
        barred_until[hot, a], barred_until[r, b] = it + tenure, it + tenure
        if loads.max() < best_max - TOLERANCE:
            best_max, best, best_it = float(loads.max()), slot.copy(), it
    return best.tolist()
