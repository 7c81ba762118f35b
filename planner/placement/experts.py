"""Expert placement: each MoE layer's experts onto its expert-parallel ranks.

Given a per-layer, per-expert load profile (a file, a synthetic skewed profile, or uniform), for
every MoE layer:

Step 1 chooses the replica counts: EPLB's (each redundant slot to the expert with the highest load
       per copy) and, short of the bound, capped counts (each expert ceil(load / T) copies for caps T
       near the mean rank load, spare slots to the coldest experts; planner/placement/replicas.py).
Step 2 packs each candidate's copies onto ranks largest first, each into the least-loaded rank with a
       free slot that does not already hold that expert (longest-processing-time with a slot cap).
Step 3 swaps copies between the hottest rank and the others while that lowers the maximum
       (docs/cpsat.md section 6.4), then two copies for two and a tabu search where that is not
       enough (planner/placement/local_search.py); the candidate with the lowest maximum is kept.
Step 4 (method "cpsat") hands the result to CP-SAT as a complete hint, with symmetry breaking, to
       improve it or prove it within a time limit.

Given the placement a running deployment already has (`previous`), the ranks of the new placement are
relabelled to keep as many expert copies where they are as possible (an assignment problem), and the
copies loaded onto a rank that did not hold them are counted as moves. With a move budget per layer,
a placement over budget is replaced by a repair of the previous one (surplus copies dropped, missing
copies added) improved by swaps that stay within the budget, and CP-SAT (method "cpsat") minimises the
maximum load under the budget as a side constraint.

Loads are relative (any unit). The lower bound per layer is max(total / ranks, max load per copy) for
the chosen counts (the mean alone is the bound no choice of counts can beat).
"""

import math
import time
from dataclasses import dataclass, replace

import numpy as np
from ortools.sat.python import cp_model
from scipy.optimize import linear_sum_assignment

from planner.cpsat import cpsat_solver
from planner.model.architecture import ModelArch
from planner.modes import ExpertMethod
from planner.placement.groups import (
    grouping_is_free,
    groups_fit_nodes,
    place_layer_by_groups,
)
from planner.placement.local_search import holds_matrix, pack, swap
from planner.placement.replicas import eplb_counts, place_layer

__all__ = ["ExpertPlacement", "LayerPlacement", "count_moves", "eplb_baseline", "max_overlap_assignment",
           "place_experts", "slots_per_rank_for"]

SWAP_TIME_LIMIT_S = 0.25  # per layer: the replica-count search with its swaps (planner/placement/replicas.py)
MIN_CPSAT_TIME_S = 0.01
CPSAT_SHARE = 0.25  # of a layer's planned time, CP-SAT's search (its deterministic time is 0.8 of that): the heuristic, the
# model's build and a slower machine get the rest, so that the wall-clock guard is seldom what stops it
# Building the CP-SAT model in Python costs about 18 us per (expert, rank) variable with its constraints
# (16.8 s for 58 DeepSeek-V3 layers x 256 experts x 64 ranks, ortools 9.15 on 2 cores): a layer whose
# share of the time limit cannot pay for the build keeps its heuristic placement.
CPSAT_BUILD_S_PER_VARIABLE = 18e-6  # below this CP-SAT cannot improve on the heuristic it is hinted with
CPSAT_LOAD_RESOLUTION = 1e-6  # loads are scaled to integers of this share of a layer's total


@dataclass(frozen=True)
class LayerPlacement:
    """One MoE layer: `slots[r]` lists the logical experts rank r holds (copies count once each)."""

    layer: int  # index among the model's layers
    slots: tuple[tuple[int, ...], ...]
    copies: tuple[int, ...]  # copies of each logical expert
    rank_loads: tuple[float, ...]
    lower_bound: float
    proven_optimal: bool = False  # CP-SAT proved no placement with these copies has a lower maximum
    moves: int | None = None  # expert copies loaded onto a rank that did not hold them (None: no previous placement)

    @property
    def max_load(self) -> float:
        return max(self.rank_loads)

    @property
    def mean_load(self) -> float:
        return sum(self.rank_loads) / len(self.rank_loads)

    @property
    def imbalance(self) -> float:
        """max / mean load per rank (1.0 = perfectly balanced)."""
        return self.max_load / self.mean_load if self.mean_load else 1.0

    @property
    def gap_to_bound(self) -> float:
        return self.max_load / self.lower_bound - 1.0 if self.lower_bound else 0.0


@dataclass(frozen=True)
class ExpertPlacement:
    n_ranks: int
    slots_per_rank: int
    layers: tuple[LayerPlacement, ...]
    method: str
    time_s: float
    profile: str

    @property
    def imbalance(self) -> float:
        """Step-time factor of the expert work: sum over layers of the hottest rank's load over the
        sum of mean loads (layers run one after another)."""
        mean = sum(p.mean_load for p in self.layers)
        return sum(p.max_load for p in self.layers) / mean if mean else 1.0

    @property
    def worst_gap_to_bound(self) -> float:
        return max((p.gap_to_bound for p in self.layers), default=0.0)

    @property
    def moves(self) -> int | None:
        """Expert copies the deployment must load to go from the previous placement to this one."""
        counted = [p.moves for p in self.layers if p.moves is not None]
        return sum(counted) if counted else None

    @property
    def layers_proven_optimal(self) -> int:
        """Layers at the lower bound or proved optimal by CP-SAT."""
        return sum(1 for p in self.layers if p.proven_optimal or p.gap_to_bound <= 1e-9)

    def physical_to_logical(self, arch: ModelArch) -> list[list[int]]:
        """EPLB-style map, one row per model layer: physical slot (rank-major) -> logical expert.
        Dense layers get the trivial layout so that the rows line up with the model's layers."""
        by_layer = {p.layer: [e for rank in p.slots for e in rank] for p in self.layers}
        n_slots = self.n_ranks * self.slots_per_rank
        trivial = [i % arch.moe.n_routed_experts for i in range(n_slots)]
        return [by_layer.get(i, trivial) for i in range(arch.n_layers)]


def count_moves(previous: list[list[int]], ranks: list[list[int]]) -> int:
    """Expert copies in `ranks` that sit on a rank which did not hold that expert in `previous`."""
    return sum(len(set(new) - set(old)) for old, new in zip(previous, ranks, strict=True))


def max_overlap_assignment(overlap: np.ndarray) -> list[int]:
    """perm[i] = j maximising sum overlap[i, perm[i]] (a linear assignment problem)."""
    rows, cols = linear_sum_assignment(np.asarray(overlap, dtype=float), maximize=True)
    perm = [0] * len(rows)
    for i, j in zip(rows, cols, strict=True):
        perm[int(i)] = int(j)
    return perm


def _relabel(ranks: list[list[int]], previous: list[list[int]]) -> list[list[int]]:
    """The same placement with its ranks renumbered to keep the most copies where `previous` had them
    (ranks are interchangeable: only which experts share a rank matters for the balance)."""
    n_experts = 1 + max(max(max(r) for r in ranks), max(max(r) for r in previous))
    overlap = holds_matrix(ranks, n_experts).astype(int) @ holds_matrix(previous, n_experts).T.astype(int)
    perm = max_overlap_assignment(overlap)
    out: list[list[int]] = [[] for _ in ranks]
    for i, j in enumerate(perm):
        out[j] = list(ranks[i])
    return out


def _repair(previous: list[list[int]], copies: np.ndarray, per_copy: np.ndarray) -> list[list[int]] | None:
    """The previous placement changed as little as possible to hold `copies` of every expert: surplus
    copies leave the most loaded ranks, missing ones go to the least loaded ranks with room. None if
    a missing copy finds no rank without it."""
    ranks = [list(r) for r in previous]
    slots = len(ranks[0])
    load = [sum(per_copy[e] for e in r) for r in ranks]
    have = np.bincount([e for r in ranks for e in r], minlength=len(copies))
    for e in np.argsort(-per_copy, kind="stable"):
        while have[e] > copies[e]:
            r = max((r for r in range(len(ranks)) if e in ranks[r]), key=lambda r: (load[r], r))
            ranks[r].remove(e)
            load[r] -= per_copy[e]
            have[e] -= 1
    for e in np.argsort(-per_copy, kind="stable"):
        while have[e] < copies[e]:
            open_ranks = [r for r in range(len(ranks)) if len(ranks[r]) < slots and e not in ranks[r]]
            if not open_ranks:
                return None
            r = min(open_ranks, key=lambda r: (load[r], r))
            ranks[r].append(int(e))
            load[r] += per_copy[e]
            have[e] += 1
    return ranks if all(len(r) == slots for r in ranks) else None


def _shift_copies(loads: np.ndarray, copies: np.ndarray, n_ranks: int, additions: int) -> np.ndarray:
    """Up to `additions` single-copy shifts from the expert that loses least to the hottest expert per
    copy, while that lowers the hottest load per copy (EPLB's replication, done incrementally: each
    shift costs one move, the removal is free)."""
    copies = copies.copy()
    for _ in range(additions):
        per_copy = np.where(copies < n_ranks, loads / copies, -1.0)
        hot = int(np.argmax(per_copy))
        after_removal = np.where(copies > 1, loads / np.maximum(copies - 1, 1), np.inf)
        after_removal[hot] = np.inf
        cold = int(np.argmin(after_removal))
        if not after_removal[cold] < per_copy[hot]:
            break
        copies[hot] += 1
        copies[cold] -= 1
    return copies


def _within_budget(loads: np.ndarray, previous: list[list[int]], budget: int, time_limit_s: float) -> tuple[np.ndarray, list[list[int]]]:
    """The best placement found within `budget` moves of `previous`: part of the budget re-replicates
    hot experts (a repair of the previous placement), the rest goes to budgeted swaps."""
    before = np.bincount([e for r in previous for e in r], minlength=len(loads))
    best = None
    for additions in sorted({budget, budget // 2, 0}, reverse=True):
        copies = _shift_copies(loads, before, len(previous), additions)
        repaired = _repair(previous, copies, loads / copies)
        if repaired is None or count_moves(previous, repaired) > budget:
            continue
        ranks = swap(loads / copies, repaired, time_limit_s / 3, previous, budget)
        peak = max(sum(loads[e] / copies[e] for e in rank) for rank in ranks)
        if best is None or peak < best[0] - 1e-12:
            best = (peak, copies, ranks)
    return best[1], best[2]  # additions = 0 always succeeds: the previous placement itself


@dataclass(frozen=True)
class CpsatStep:
    """What step 4 may spend on one layer: `planned_s`, its share of the time limit (from the inputs
    alone, so that CP-SAT's deterministic-time limit and the decision to run it do not depend on how
    long the steps before it took), the whole placement's wall-clock `deadline` as a guard (reached
    only when the machine runs far slower than planned), the workers and the seed."""

    planned_s: float
    deadline: float
    workers: int
    seed: int


def _cpsat_model(q: np.ndarray, copies: np.ndarray, canonical: list[list[int]], slots_per_rank: int,
                 previous: list[list[int]] | None, budget: int | None) -> tuple[cp_model.CpModel, dict]:
    """Min-max of the integer loads `q` per copy, hinted with `canonical` (docs/cpsat.md section 6.2)."""
    n_ranks, n_experts = len(canonical), len(q)
    order = sorted(range(n_experts), key=lambda e: -q[e])
    m = cp_model.CpModel()
    x, cumulative = {}, 0
    for e in order:  # identical ranks: the k hottest experts use at most sum of their copies distinct ranks
        cumulative += int(copies[e])
        for r in range(n_ranks if previous is not None else min(n_ranks, cumulative)):
            x[e, r] = m.new_bool_var(f"x[{e},{r}]")
    if previous is not None and budget is not None:
        was = holds_matrix(previous, n_experts)
        m.add(sum(var for (e, r), var in x.items() if not was[r, e]) <= budget)
    for e in range(n_experts):
        m.add(sum(x[e, r] for r in range(n_ranks) if (e, r) in x) == int(copies[e]))
    lb = max(math.ceil(int(sum(q[e] * copies[e] for e in range(n_experts))) / n_ranks), int(q.max()))
    lmax = m.new_int_var(lb, int(q.max()) * slots_per_rank, "lmax")
    for r in range(n_ranks):
        here = [(x[e, r], int(q[e])) for e in range(n_experts) if (e, r) in x]
        m.add(sum(v for v, _ in here) <= slots_per_rank)
        m.add(cp_model.LinearExpr.weighted_sum([v for v, _ in here], [w for _, w in here]) <= lmax)
    m.minimize(lmax)
    hint = {(e, r) for r, rank in enumerate(canonical) for e in rank}
    if all(key in x for key in hint):
        for key, var in x.items():
            m.add_hint(var, key in hint)
        m.add_hint(lmax, max(sum(int(q[e]) for e in rank) for rank in canonical))
    return m, x


def _cpsat(per_copy: np.ndarray, copies: np.ndarray, ranks: list[list[int]], slots_per_rank: int, step: CpsatStep,
           previous: list[list[int]] | None = None, budget: int | None = None) -> tuple[list[list[int]], bool]:
    """Step 4: CP-SAT min-max with the heuristic as a complete hint. Returns the better of the two
    placements and whether CP-SAT proved it optimal (at the load resolution). With `previous` ranks
    are no longer interchangeable (no symmetry breaking); with `budget` too, at most that many copies
    may land on a rank that did not hold them. The search stops on deterministic time
    (planner/cpsat.py), so the same loads, seed and workers give the same placement."""
    n_ranks, n_experts = len(ranks), len(per_copy)
    search_s = CPSAT_SHARE * step.planned_s
    if (1 - CPSAT_SHARE) * step.planned_s < n_ranks * n_experts * CPSAT_BUILD_S_PER_VARIABLE or search_s < MIN_CPSAT_TIME_S:
        return ranks, False  # the layer's share cannot pay for building the model, let alone searching it
    q = np.maximum(1, np.round(per_copy / per_copy.sum() / CPSAT_LOAD_RESOLUTION)).astype(int)
    # relabel to respect the prefix rule (only when ranks are interchangeable)
    canonical = ranks if previous is not None else sorted(ranks, key=lambda rank: -sum(q[e] for e in rank))
    m, x = _cpsat_model(q, copies, canonical, slots_per_rank, previous, budget)
    solver = cpsat_solver(budget_s=search_s, seed=step.seed, workers=step.workers, wall_guard_s=step.deadline - time.perf_counter())
    status = solver.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return ranks, False
    improved = [[e for e in range(n_experts) if (e, r) in x and solver.value(x[e, r])] for r in range(n_ranks)]
    old = max(sum(per_copy[e] for e in rank) for rank in ranks)
    new = max(sum(per_copy[e] for e in rank) for rank in improved)
    return (improved if new < old else ranks), status == cp_model.OPTIMAL


def _layer(layer: int, loads: np.ndarray, n_ranks: int, slots_per_rank: int, method: ExpertMethod, time_limit_s: float,
           cpsat: CpsatStep | None = None, search: bool = True, previous: list[list[int]] | None = None, budget: int | None = None,
           grouped: tuple[int, int] | None = None) -> LayerPlacement:
    if grouped is not None:  # (expert_groups, ranks_per_node): whole groups per node (planner/placement/groups.py)
        heuristic_s = min(SWAP_TIME_LIMIT_S, time_limit_s)
        copies, ranks = place_layer_by_groups(loads, n_ranks, slots_per_rank, *grouped, heuristic_s, time.perf_counter() + heuristic_s)
    elif search:  # replica counts chosen with the slots in mind, packed, swapped (planner/placement/replicas.py)
        heuristic_s = min(SWAP_TIME_LIMIT_S, time_limit_s)
        copies, ranks = place_layer(loads, n_ranks, slots_per_rank, heuristic_s, time.perf_counter() + heuristic_s)
    else:  # the EPLB-style baseline
        copies = eplb_counts(loads, n_ranks * slots_per_rank, n_ranks)
        ranks = pack(loads, copies, n_ranks, slots_per_rank)
    if previous is not None:
        ranks = _relabel(ranks, previous)
        if budget is not None and count_moves(previous, ranks) > budget:
            copies, ranks = _within_budget(loads, previous, budget, min(SWAP_TIME_LIMIT_S, time_limit_s))
    per_copy = loads / copies
    proven = False
    if method is ExpertMethod.CPSAT and cpsat is not None:
        ranks, proven = _cpsat(per_copy, copies, ranks, slots_per_rank, cpsat, previous, budget)
    rank_loads = tuple(float(sum(per_copy[e] for e in rank)) for rank in ranks)
    bound = max(float(loads.sum()) / n_ranks, float(per_copy.max()))
    moves = None if previous is None else count_moves(previous, ranks)
    return LayerPlacement(layer, tuple(tuple(r) for r in ranks), tuple(int(c) for c in copies), rank_loads, bound, proven, moves)


def slots_per_rank_for(n_experts: int, n_ranks: int, redundant_per_rank: int) -> int:
    """Expert slots on each rank: its share of the experts plus the redundant copies, at most one slot
    per expert (a rank never holds two copies of one expert, so more copies than that are dropped)."""
    return min(n_experts, n_experts // n_ranks + redundant_per_rank)


def node_grouping(arch: ModelArch, loads: np.ndarray, n_ranks: int, ranks_per_node: int | None,
                  previous: list[list[int]] | None = None) -> int | None:
    """`ranks_per_node` when `place_experts` keeps each expert group inside one domain (the ranks
    span several, routing is group-limited, and whole groups cost no balance); None when it places
    over all ranks at once, which does not depend on `ranks_per_node`."""
    m = arch.moe
    if previous is not None or ranks_per_node is None or not groups_fit_nodes(
            m.n_routed_experts, m.expert_groups, m.groups_per_token, n_ranks, ranks_per_node):
        return None
    return ranks_per_node if grouping_is_free(loads, m.expert_groups, n_ranks // ranks_per_node) else None


def place_experts(arch: ModelArch, loads: np.ndarray, n_ranks: int, redundant_per_rank: int = 0, *, method: ExpertMethod | str = ExpertMethod.GREEDY,
                  time_limit_s: float = 5.0, workers: int = 1, seed: int = 0, profile: str = "", previous: list[list[int]] | None = None,
                  max_moves_per_layer: int | None = None, ranks_per_node: int | None = None) -> ExpertPlacement:
    """Place every MoE layer's experts on `n_ranks` expert-parallel ranks with
    E / n_ranks + redundant_per_rank slots each. `previous`: the physical-to-logical map (one row
    per model layer, rank-major slots) of the placement in service, to stay close to.
    `ranks_per_node`: ranks per scale-up domain; when the ranks span several, the model's routing
    is group-limited and keeping groups whole costs no balance, each expert group (with its copies)
    stays inside one domain (without a previous placement to stay close to). With method "cpsat" the
    same inputs, `workers` and `seed` give the same placement (CP-SAT stops on deterministic time)."""
    start, method = time.perf_counter(), ExpertMethod(method)  # a method given by name
    slots_per_rank = slots_per_rank_for(arch.moe.n_routed_experts, n_ranks, redundant_per_rank)
    moe_layers = [i for i, moe in enumerate(arch.layer_is_moe) if moe]
    deadline = start + time_limit_s
    m = arch.moe
    per_node = node_grouping(arch, loads, n_ranks, ranks_per_node, previous)
    grouped = (m.expert_groups, per_node) if per_node is not None else None

    def before(i: int) -> list[list[int]] | None:
        if previous is None:
            return None
        row = [int(e) for e in previous[i]]
        return [row[r * slots_per_rank:(r + 1) * slots_per_rank] for r in range(n_ranks)]

    layers = []
    placed: dict[bytes, LayerPlacement] = {}  # greedy placements from scratch, by the layer's loads (uniform profiles repeat them)
    for k, i in enumerate(moe_layers):  # each layer gets an equal share of what is left, so the total stays within the limit
        key = np.asarray(loads[k], dtype=float).tobytes() if method is ExpertMethod.GREEDY and previous is None else None
        same = placed.get(key) if key is not None else None
        if same is not None:  # the same loads place the same way: the search is deterministic
            layers.append(replace(same, layer=i))
            continue
        share_s = max(0.0, deadline - time.perf_counter()) / (len(moe_layers) - k)
        step = CpsatStep(time_limit_s / len(moe_layers), deadline, workers, seed)
        layers.append(_layer(i, loads[k], n_ranks, slots_per_rank, method, share_s, step, previous=before(i), budget=max_moves_per_layer,
                             grouped=grouped))
        if key is not None:
            placed[key] = layers[-1]
    layers = tuple(layers)
    label = {ExpertMethod.GREEDY: "replica-count search + LPT + swap search", ExpertMethod.CPSAT: "replica-count search + LPT + swap search + CP-SAT"}[method]
    if grouped is not None:
        label = f"{m.expert_groups} expert groups over {n_ranks // ranks_per_node} domains, then per domain: {label}"
    return ExpertPlacement(n_ranks, slots_per_rank, layers, label, time.perf_counter() - start, profile)


def eplb_baseline(arch: ModelArch, loads: np.ndarray, n_ranks: int, redundant_per_rank: int = 0) -> ExpertPlacement:
    """DeepSeek EPLB's global policy: replicate hot experts, then longest-processing-time packing
    with a slot cap (steps 1 and 2 only), for comparison."""
    start = time.perf_counter()
    slots_per_rank = slots_per_rank_for(arch.moe.n_routed_experts, n_ranks, redundant_per_rank)
    moe_layers = [i for i, moe in enumerate(arch.layer_is_moe) if moe]
    layers = tuple(_layer(i, loads[k], n_ranks, slots_per_rank, ExpertMethod.GREEDY, 0.0, search=False) for k, i in enumerate(moe_layers))
    return ExpertPlacement(n_ranks, slots_per_rank, layers, "EPLB-style replicate + LPT", time.perf_counter() - start, "")
