"""Replica counts chosen with the slots in mind, and their placement, for one MoE layer.

EPLB's rule gives every spare slot to the expert with the most load per copy. That minimises the
largest copy, but on heavy skew (Zipf 1.4 over 256 experts: the hottest expert carries ~23 mean rank
loads at EP64) it makes more copies near the mean rank load than there are ranks, and two of them
must then share a rank (21-32% above the mean on the six cases of benchmarks/bench_experts.py).

Here a per-copy cap T gives each expert max(1, ceil(load / T)) copies (at most one per rank), and the
slots left over go to the coldest experts, one extra copy each: small copies fill the ranks around
the big ones. Caps from 80% to 100% of the mean rank load are candidates next to EPLB's counts, each
packed (longest-processing-time with a slot cap) and improved by the searches of
planner/placement/local_search.py; the placement with the lowest maximum wins. EPLB's counts always
go through the swaps first, so the result is never above the EPLB-style baseline (the same counts and
packing without swaps).
"""

import time

import numpy as np

from planner.placement.local_search import exchange, pack, swap, tabu

__all__ = ["capped_counts", "eplb_counts", "place_layer"]

# Per-copy caps tried, as fractions of the mean rank load. On the Zipf 1.4 loads of benchmarks/bench_experts.py
# (DeepSeek-V3 EP32-128, Kimi K2 EP48-128) the best caps after swaps were 0.82-0.96; a cap of 0.80 left
# 1.6-33% above the mean, and above 1.0 copies larger than the mean raise the bound itself.
CAP_FRACTIONS = tuple(round(0.80 + 0.02 * i, 2) for i in range(11))
# Capped count vectors improved by swaps, best first by the packed maximum: on those six Zipf cases the
# best packing ended within 0.01% of the best of all caps after the swaps.
SCREENED = 2
# Single-copy shifts tried from the best counts found (each placed by moving one copy and swapping), and
# the donors tried per receiving expert (those that lose least per copy by giving one up). On the Zipf 1.4
# loads at DeepSeek-V3 EP128 (three slots per rank, 58 layers), 16 shifts brought the worst layer from
# 1.17% to 0.53% above the mean (1.6 s -> 2.0 s); 40 shifts reached 0.21% in 3.9 s.
MAX_SHIFTS = 16
DONORS = 2
# A placement this close to the lower bound stops the search: no count vector can do better than
# max(mean rank load, EPLB's largest copy), and 0.1% is half the 0.2% asked for on lognormal skew.
GOOD_ENOUGH_GAP = 1e-3


def eplb_counts(loads: np.ndarray, n_slots: int, n_ranks: int) -> np.ndarray:
    """EPLB's replication: every expert once, then each spare slot to the expert with the most load per
    copy (never more copies than ranks: copies of one expert sit on different ranks). It gives the
    smallest possible largest copy for `n_slots` copies."""
    copies = np.ones(len(loads), dtype=int)
    for _ in range(n_slots - len(loads)):
        per_copy = np.where(copies < n_ranks, loads / copies, -1.0)
        copies[int(np.argmax(per_copy))] += 1
    return copies


def capped_counts(loads: np.ndarray, cap: float, n_slots: int, n_ranks: int) -> np.ndarray | None:
    """max(1, ceil(load / cap)) copies per expert (at most n_ranks), the spare slots to the coldest
    experts one copy each (round after round if there are more spare slots than experts with room).
    None if the cap needs more copies than slots."""
    copies = np.clip(np.ceil(loads / cap), 1, n_ranks).astype(int)
    spare = n_slots - int(copies.sum())
    if spare < 0:
        return None
    coldest = np.argsort(loads, kind="stable")
    while spare > 0:
        room = coldest[copies[coldest] < n_ranks][:spare]
        if not len(room):
            return None
        copies[room] += 1
        spare -= len(room)
    return copies


def _candidates(loads: np.ndarray, n_slots: int, n_ranks: int, eplb: np.ndarray) -> list[np.ndarray]:
    """Distinct capped count vectors other than EPLB's, in the order of CAP_FRACTIONS."""
    mean = float(loads.sum()) / n_ranks
    out, seen = [], {eplb.tobytes()}
    if mean <= 0 or n_slots <= len(loads):
        return out  # nothing to choose: every expert has one copy
    for fraction in CAP_FRACTIONS:
        copies = capped_counts(loads, fraction * mean, n_slots, n_ranks)
        if copies is not None and copies.tobytes() not in seen:
            seen.add(copies.tobytes())
            out.append(copies)
    return out


def _peak(loads: np.ndarray, copies: np.ndarray, ranks: list[list[int]]) -> float:
    return float((loads / copies)[np.array(ranks)].sum(axis=1).max())  # every rank is full


def _bound(loads: np.ndarray, copies: np.ndarray, n_ranks: int) -> float:
    """max(mean rank load, largest copy): the bound LayerPlacement reports."""
    return max(float(loads.sum()) / n_ranks, float((loads / copies).max()))


def _pigeonhole_bound(loads: np.ndarray, copies: np.ndarray, n_ranks: int, slots_per_rank: int) -> float:
    """A lower bound on the maximum for these counts: of the j * n_ranks + 1 largest copies some rank
    holds j + 1, at least the j + 1 smallest of them (j = 1 .. slots - 1), and _bound."""
    sizes = np.sort(np.repeat(loads / copies, copies))[::-1]
    shared = [float(sizes[j * n_ranks - j:j * n_ranks + 1].sum()) for j in range(1, slots_per_rank) if j * n_ranks < len(sizes)]
    return max([_bound(loads, copies, n_ranks), *shared])


def _screened(loads: np.ndarray, n_ranks: int, slots_per_rank: int, eplb: np.ndarray, deadline: float) -> list[tuple]:
    """The SCREENED capped count vectors whose packing has the lowest maximum: (copies, ranks)."""
    packed = []
    for copies in _candidates(loads, n_ranks * slots_per_rank, n_ranks, eplb):
        if time.perf_counter() > deadline:
            break
        ranks = pack(loads, copies, n_ranks, slots_per_rank)
        packed.append((_peak(loads, copies, ranks), len(packed), copies, ranks))
    return [(copies, ranks) for _, _, copies, ranks in sorted(packed, key=lambda t: t[:2])[:SCREENED]]


def _polish(loads: np.ndarray, copies: np.ndarray, ranks: list[list[int]], target: float, deadline: float) -> list[list[int]]:
    """Two-for-two exchanges, then the tabu search, until the maximum is at `target`."""
    ranks = exchange(loads / copies, ranks, target, deadline)
    return tabu(loads / copies, ranks, target, deadline)


def _moved_copy(loads: np.ndarray, copies: np.ndarray, ranks: list[list[int]], d: int, e: int) -> list[list[int]] | None:
    """`ranks` with one copy of d replaced by a new copy of e, on the most loaded rank holding d and
    not e (None if every rank holding d holds e)."""
    per_copy = loads / copies
    holders = [r for r, rank in enumerate(ranks) if d in rank and e not in rank]
    if not holders:
        return None
    r = max(holders, key=lambda r: (float(per_copy[ranks[r]].sum()), -r))
    out = [list(rank) for rank in ranks]
    out[r][out[r].index(d)] = e
    return out


def _shift_counts(loads: np.ndarray, best: tuple, n_ranks: int, floor: float, swapped, deadline: float) -> tuple:
    """Counts changed one copy at a time from `best` = (peak, copies, ranks): an expert on the hottest
    rank gains a copy that one of the DONORS experts losing least per copy gives up (`_moved_copy`);
    the first shift whose placement, after swaps, beats the best is kept, until MAX_SHIFTS tries or
    `floor`."""
    peak, copies, ranks = best
    tried = 0
    while peak > floor and tried < MAX_SHIFTS and time.perf_counter() < deadline:
        per_copy = loads / copies
        hottest = ranks[int(np.argmax(per_copy[np.array(ranks)].sum(axis=1)))]
        after = np.where(copies > 1, loads / np.maximum(copies - 1, 1), np.inf)
        donors = [int(d) for d in np.argsort(after, kind="stable") if np.isfinite(after[d])]
        shifted = None
        for e in sorted((e for e in hottest if copies[e] < n_ranks), key=lambda e: (-per_copy[e], e)):
            for d in [d for d in donors if d != e][:DONORS]:
                trial = copies.copy()
                trial[e], trial[d] = trial[e] + 1, trial[d] - 1
                trial_ranks = _moved_copy(loads, copies, ranks, d, e)
                if trial_ranks is None:
                    continue
                trial_ranks = swapped(trial, trial_ranks)
                tried += 1
                if _peak(loads, trial, trial_ranks) < peak:
                    shifted = (_peak(loads, trial, trial_ranks), trial, trial_ranks)
                    break
            if shifted is not None or tried >= MAX_SHIFTS:
                break
        if shifted is None:
            break
        peak, copies, ranks = shifted
    return peak, copies, ranks


def place_layer(loads: np.ndarray, n_ranks: int, slots_per_rank: int, swap_s: float, deadline: float) -> tuple[np.ndarray, list[list[int]]]:
    """Replica counts and their placement with the lowest maximum rank load found (ties: EPLB's counts).
    `swap_s` caps each swap search; after `deadline` only EPLB's counts, packed and swapped, are tried.

    Searches stop within GOOD_ENOUGH_GAP of EPLB's bound (no count vector has a lower one) or of the
    candidate's pigeonhole bound. EPLB's counts are packed, swapped and, if their pigeonhole bound is
    EPLB's bound (nothing in the counts keeps them from it), polished. Short of the bound, the capped
    count vectors are packed and the best few swapped; from the best placement so far single-copy
    shifts change the counts (`_shift_counts`), and the result is polished."""
    eplb = eplb_counts(loads, n_ranks * slots_per_rank, n_ranks)
    floor = _bound(loads, eplb, n_ranks) * (1 + GOOD_ENOUGH_GAP)

    def target(copies: np.ndarray) -> float:
        return max(floor, _pigeonhole_bound(loads, copies, n_ranks, slots_per_rank) * (1 + GOOD_ENOUGH_GAP))

    def swapped(copies: np.ndarray, ranks: list[list[int]]) -> list[list[int]]:
        return swap(loads / copies, ranks, max(0.0, min(swap_s, deadline - time.perf_counter())))

    ranks = swapped(eplb, pack(loads, eplb, n_ranks, slots_per_rank))
    if target(eplb) <= floor:
        ranks = _polish(loads, eplb, ranks, floor, deadline)
    best = (_peak(loads, eplb, ranks), eplb, ranks)
    if best[0] <= floor:
        return eplb, ranks
    for copies, ranks in _screened(loads, n_ranks, slots_per_rank, eplb, deadline):
        ranks = swapped(copies, ranks)
        if _peak(loads, copies, ranks) < best[0]:
            best = (_peak(loads, copies, ranks), copies, ranks)
    peak, copies, ranks = _shift_counts(loads, best, n_ranks, floor, swapped, deadline)
    if peak > target(copies):
        ranks = _polish(loads, copies, ranks, target(copies), deadline)
    return (copies, ranks) if _peak(loads, copies, ranks) < best[0] else (best[1], best[2])
