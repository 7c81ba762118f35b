"""Objective min_tpot with a demand: every batch of a layout trades TPOT against tokens per second,
so any of them can be the one a plan needs. Rather than a candidate at every batch, the search
starts from the batch grid's ladder and refines it until a relaxation proves the plan optimal.

The relaxation gives each kept batch b of a layout the best of every feasible batch from b up to
the next kept one: the most tokens per second, the shortest TPOT and TTFT, the lowest price. Every
plan over all batches then has a relaxed plan no worse. The relaxed optimum is a lower bound; where it is below
the plan found, the relaxed plan's layouts get the batch halfway to their next kept one, and both
are solved again. When the bound meets the plan, the plan is optimal over every batch.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from planner.modes import BatchLimit, SolveStatus
from planner.solver.candidates import Candidate, Chain
from planner.solver.model_builder import PlanningData
from planner.solver.search import RawSolution
from planner.units import SECONDS_PER_HOUR

__all__ = ["LatencyLadder", "solve_refined"]

MAX_ROUNDS = 40  # refinement rounds before the plan is returned with the relaxation's bound (FEASIBLE)


@dataclass
class LatencyLadder:
    """The kept batches of each layout (by chain), and, while `relaxed`, their optimistic rates."""

    relaxed: bool = False
    kept: dict[int, set[int]] = field(default_factory=dict)  # id(chain) -> table indices kept
    chains: dict[int, Chain] = field(default_factory=dict)
    origin: dict[int, tuple[int, int]] = field(default_factory=dict)  # id(candidate) -> (id(chain), table index)
    rebuild: Callable[[], tuple[Candidate, ...]] | None = None  # every workload's candidates at the kept batches (solve.prepare)

    def candidates(self, relaxed: bool) -> tuple[Candidate, ...]:
        """The problem's candidates at the kept batches, relaxed or not."""
        self.relaxed = relaxed
        self.origin.clear()
        try:
            return self.rebuild()
        finally:
            self.relaxed = False

    def batches(self, chain: Chain, initial: set[int]) -> list[int]:
        """Table indices of `chain` to make candidates of (the first time: `initial`)."""
        self.chains.setdefault(id(chain), chain)
        return sorted(self.kept.setdefault(id(chain), set(initial)))

    def candidate(self, chain: Chain, i: int, c: Candidate) -> Candidate:
        """`c` (chain's candidate at index i), relaxed if asked: the most tokens per second of the
        feasible batches from it up to the next kept one."""
        if self.relaxed:
            span, t = self._span(chain, i), chain.table
            c = replace(c, output_tokens_per_s=float(np.max(t.sustained_output_tokens_per_s[span])), tpot_s=float(np.min(t.tpot_s[span])),
                        ttft_s=float(np.min(t.ttft_s[span])), ttft_p90_s=float(np.min(t.ttft_p90_s[span])),
                        usd_per_hour=chain.inp.rack.accelerator.price_usd_per_hour * chain.inp.layout.n_accelerators
                        + float(np.min(t.storage_usd_per_s[span])) * SECONDS_PER_HOUR,  # as candidates._candidate prices a batch
                        batch_limit=BatchLimit.LADDER)
        self.origin[id(c)] = (id(chain), i)
        return c

    def _span(self, chain: Chain, i: int) -> np.ndarray:
        """Feasible table indices from i up to (not including) the next kept one."""
        above = [k for k in self.kept[id(chain)] if k > i]
        end = min(above) if above else len(chain.table.batches)
        return chain.members[(chain.members >= i) & (chain.members < end)]

    def refine(self, candidates: tuple[Candidate, ...], chosen: dict[int, int]) -> bool:
        """Keep, for each layout the relaxed plan uses, the batch halfway to its next kept one; False
        when every such span is a single batch (the relaxation is then exact there)."""
        added = False
        for j in sorted(chosen):
            if id(candidates[j]) not in self.origin:
                continue
            key, i = self.origin[id(candidates[j])]
            span = self._span(self.chains[key], i)
            if len(span) > 1:
                self.kept[key].add(int(span[len(span) // 2]))
                added = True
        return added


def solve_refined(data: PlanningData, run: Callable[..., RawSolution]) -> tuple[PlanningData, RawSolution]:
    """Solve `data` (with a ladder) by refinement (module docstring): the final data and its plan;
    OPTIMAL when the relaxation's bound meets the plan, else FEASIBLE with that bound. `run(data,
    canonical)` solves one planning model."""
    ladder: LatencyLadder = data.ladder
    raw = bound = None
    wall = 0.0
    for _ in range(MAX_ROUNDS):
        data = replace(data, candidates=ladder.candidates(relaxed=False))
        raw = run(data)
        relaxed = replace(data, candidates=ladder.candidates(relaxed=True))
        bound = run(relaxed, False)
        wall += raw.wall_time_s + bound.wall_time_s
        if raw.status is not SolveStatus.OPTIMAL or bound.status is not SolveStatus.OPTIMAL or bound.objective_int >= raw.objective_int:
            break
        if not ladder.refine(relaxed.candidates, bound.chosen):
            break
    if raw.status is SolveStatus.OPTIMAL and bound.status is SolveStatus.OPTIMAL and bound.objective_int < raw.objective_int:
        gap = (raw.objective - bound.objective) / abs(raw.objective) if raw.objective else 0.0
        raw = replace(raw, status=SolveStatus.FEASIBLE, best_bound=bound.objective, gap=gap)
    return data, replace(raw, wall_time_s=wall)
