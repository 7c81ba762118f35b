"""The decomposition's proof: each workload's plans cut down to the few an optimal fleet could use,
and an exact master problem over them.

Few coupling rows bind. In the generated 1,000-rack fleet, 2 of 23 have a positive price: the B200
and the MI300X accelerator counts. Keep those rows (the set S) and relax the others. In an optimal
plan of the relaxed problem, each workload's plan has two properties:

- It lies on its Pareto front of (its use of each row of S, its cost, its tie-break). A plan that
  uses no more of any row and is cheaper, or as cheap with a smaller tie-break, could replace it.
- It lies within the Lagrangian window: its priced cost is at most `window` above the priced
  minimum, whenever window >= optimum - bound (see planner.solver.decompose).

The front is traced by epsilon-constraint solves. The rows of S but one are fixed at each
combination of their values (a slice). Within a slice, the solver finds the cheapest plan using at
most t of the last row, lowers t below what that plan used, and repeats until nothing is left in
the window.

The master over the fronts (one plan per workload, rows of S only) is exact for the relaxed problem.
If its plan also fits the rows left out, it is optimal for the fleet. Otherwise the violated rows
join S and the fronts are traced again.

The window starts at a fraction of the incumbent's gap and grows. Suppose the master finds a plan
within `window` of the bound. Then no plan outside the windows can beat it, because every workload
of a better plan would lie inside them. So a window much smaller than the gap often settles the
question.
"""

import itertools
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ortools.sat.python import cp_model

from planner.modes import SolveStatus
from planner.solver.decompose import Decomposition
from planner.solver.linear_terms import term_range, weighted

__all__ = ["prove"]

FIRST_WINDOW_SHARE = 1 / 16  # of the incumbent's gap: the first window tried
WINDOW_GROWTH = 4
MAX_SLICES = 4000  # per workload: more combinations of the fixed rows' values than this, and it joins the master whole
MAX_FRONT_SOLVES = 1500  # per workload and window: more solves than this, and it joins the master whole
SOLVE_DTIME = 0.5  # deterministic-time limit of one solve (they take milliseconds)
MAX_ROUNDS = 8  # window growths and rows added, together

Plan = tuple[tuple[int, int], ...]


class Incomplete(Exception):
    """A trace that cannot finish: a solve past its limit, or the deadline."""


class Wide(Exception):
    """A front with too many slices or solves: its workload joins the master whole."""


class Front:
    """One workload's Pareto front within its window, traced on one model whose limits are set by
    editing variable domains (no model is copied per solve)."""

    def __init__(self, dec: Decomposition, k: int, coef: dict[int, int], limit: int, rows: list[int],
                 tie_break: dict[int, int] | None, stop: threading.Event) -> None:
        block = dec.blocks[k]
        self.stop = stop  # set when another workload's trace gave up
        self.solves = 0
        self.dec, self.model = dec, block.model.clone()
        self.model.clear_objective()
        self.indices = list(block.var_of)
        self.var = {i: self.model.get_int_var_from_proto_index(block.var_of[i].index) for i in self.indices}
        self.model.add(weighted(self.var, coef) <= limit)  # the window
        self.cost = self._pinned(dec.objective, "cost")
        self.tie_break = self._pinned(tie_break, "tie_break") if tie_break is not None else None
        self.axes: list[tuple[int, cp_model.IntVar]] = []  # (row, its use by this workload)
        for r in rows:
            mine = {i: c for i, c in dec.rows[r].terms if i in self.var}
            if mine:
                self.axes.append((r, self._pinned(mine, f"row{r}")))

    def _pinned(self, coef: dict[int, int], name: str) -> cp_model.IntVar:
        """A variable equal to the sum of `coef` over the block's variables; the trace narrows its domain."""
        terms = [(i, c) for i, c in coef.items() if c and i in self.var]
        lo = hi = 0
        for i, c in terms:
            least, most = term_range(self.model.proto.variables[self.var[i].index].domain, c)
            lo, hi = lo + least, hi + most
        var = self.model.new_int_var(lo, hi, name)
        self.model.add(var == weighted(self.var, coef))
        return var

    def _limit(self, var: cp_model.IntVar, lo: int, hi: int) -> None:
        domain = self.model.proto.variables[var.index].domain
        domain[0], domain[1] = lo, hi

    def _minimum(self, objective: cp_model.LinearExpr) -> cp_model.CpSolver | None:
        """The model's optimum for `objective`; None when nothing is left. Raises Incomplete."""
        if self.stop.is_set() or time.perf_counter() > self.dec.proof_deadline:
            self.stop.set()
            raise Incomplete
        self.solves += 1
        if self.solves > MAX_FRONT_SOLVES:
            raise Wide
        self.model.minimize(objective)
        solver = self.dec._solver(SOLVE_DTIME, presolve=False)
        status = solver.solve(self.model)
        if status == cp_model.INFEASIBLE:
            return None
        if status != cp_model.OPTIMAL:
            raise Incomplete
        return solver

    def _range(self, var: cp_model.IntVar) -> tuple[int, int] | None:
        """The least and the most of `var` within the window; None when the window holds no plan
        (the block's priced minimum is above its proven lower bound, and the window is narrower)."""
        low = self._minimum(var)
        high = self._minimum(-var) if low is not None else None
        return (low.value(var), high.value(var)) if low is not None and high is not None else None

    def _cheapest(self, chain: cp_model.IntVar | None, chain_lo: int, span: int) -> tuple[Plan, tuple[int, ...]] | None:
        """The plan first cheapest, then of least tie-break, then of least use of the chain row."""
        use = (chain - chain_lo) if chain is not None else 0
        if self.tie_break is None:
            solver = self._minimum(self.cost * span + use)
        else:
            first = self._minimum(self.cost)
            if first is None:
                return None
            cost = first.value(self.cost)
            bounds = list(self.model.proto.variables[self.cost.index].domain)
            self._limit(self.cost, cost, cost)
            solver = self._minimum(self.tie_break * span + use)
            self._limit(self.cost, *bounds)
        if solver is None:
            return None
        plan = tuple((i, solver.value(self.var[i])) for i in self.indices)
        key = (solver.value(self.cost), solver.value(self.tie_break) if self.tie_break is not None else 0,
               *(solver.value(var) for _, var in self.axes))
        return plan, key

    def trace(self) -> list[Plan] | None:
        """The Pareto front's plans; None when the front is too wide to trace. Raises Incomplete."""
        try:
            return self._trace()
        except Wide:
            return None

    def _trace(self) -> list[Plan]:
        if not self.axes:
            found = self._cheapest(None, 0, 1)
            return [found[0]] if found else []
        found_ranges = [self._range(var) for _, var in self.axes]
        if None in found_ranges:
            return []
        ranges = [r for r in found_ranges if r is not None]
        chain_at = max(range(len(ranges)), key=lambda a: (ranges[a][1] - ranges[a][0], -a))
        fixed = [a for a in range(len(self.axes)) if a != chain_at]
        if math.prod(ranges[a][1] - ranges[a][0] + 1 for a in fixed) > MAX_SLICES:
            raise Wide
        chain = self.axes[chain_at][1]
        chain_lo, chain_hi = ranges[chain_at]
        found: list[tuple[Plan, tuple[int, ...]]] = []
        for values in itertools.product(*(range(ranges[a][0], ranges[a][1] + 1) for a in fixed)):
            for a, value in zip(fixed, values):
                self._limit(self.axes[a][1], value, value)
            top = chain_hi
            while top >= chain_lo:
                self._limit(chain, chain_lo, top)
                best = self._cheapest(chain, chain_lo, chain_hi - chain_lo + 1)
                if best is None:
                    break
                found.append(best)
                top = best[1][2 + chain_at] - 1
        return _pareto(found)


def _pareto(found: list[tuple[Plan, tuple[int, ...]]]) -> list[Plan]:
    """The plans no other plan beats: (cost, tie-break) no worse and no more use of any row."""
    kept: list[tuple[Plan, tuple[int, ...]]] = []
    for plan, key in sorted(found, key=lambda f: (f[1], f[0])):
        if not any(all(u <= v for u, v in zip(other[2:], key[2:])) for _, other in kept):
            kept.append((plan, key))
    return [plan for plan, _ in kept]


def _violated(dec: Decomposition, assignment: dict[int, int], rows: list[int]) -> list[int]:
    """The coupling rows outside `rows` that the assignment breaks."""
    return [r for r, row in enumerate(dec.rows)
            if r not in rows and sum(c * assignment[i] for i, c in row.terms) > row.rhs]


def prove(dec: Decomposition, mu: list[int], lows: list[int], bound: int, incumbent: dict[int, int], value: int,
          tie_break: dict[int, int] | None) -> tuple[dict[int, int], int, int, bool]:
    """The best plan found, its objective, a proven lower bound, and whether the plan may stand as
    the optimum once the bound meets its objective (with a `tie_break`, only an exact master's
    optimum, which is canonical among equals). `bound` is the Lagrangian bound at `mu`, `lows` the
    blocks' priced minima there, `incumbent` and `value` the best plan so far."""
    coef = dec.priced(mu)
    rows = [r for r, m in enumerate(mu) if m > 0]
    lower, exact = bound, False
    window = math.floor((value - bound) * FIRST_WINDOW_SHARE)
    for _ in range(MAX_ROUNDS):
        stop = threading.Event()
        fronts = [Front(dec, k, coef, lows[k] + window, rows, tie_break, stop) for k in range(len(dec.blocks))]
        try:
            with ThreadPoolExecutor(dec.workers) as pool:  # CP-SAT releases the GIL; results keep block order
                columns = list(pool.map(Front.trace, fronts))
        except Incomplete:
            break
        limits = {k: ({i: coef[i] for i in dec.blocks[k].var_of if coef.get(i)}, lows[k] + window)
                  for k, plans in enumerate(columns) if plans is None}
        status, chosen, best = dec.master(columns, rows=rows, cap=value, tie_break=tie_break, limits=limits,
                                          dtime=dec.whole_master_dtime if limits else None)
        if status in (SolveStatus.OPTIMAL, SolveStatus.INFEASIBLE):
            # Every plan worth at most bound + window lies within the windows, and the master was exact
            # over them (rows left out relaxed): nothing beats its optimum, or the incumbent if none.
            lower = max(lower, min(best if best is not None else value + 1, bound + window + 1))
        if chosen is not None and best is not None:
            violated = _violated(dec, chosen, rows)
            if violated:  # the relaxed plan breaks a row left out: keep that row too
                rows = sorted(rows + violated)
                _, fitted, fitted_value = dec.master(columns, cap=value, limits=limits)  # the same columns, every row
                if fitted is not None and fitted_value is not None:
                    incumbent, value, exact = fitted, fitted_value, False
                continue
            incumbent, value, exact = chosen, best, status is SolveStatus.OPTIMAL and best <= bound + window
        settled = lower >= value and (exact or tie_break is None)
        if settled or status not in (SolveStatus.OPTIMAL, SolveStatus.INFEASIBLE):
            break
        # look further; an optimum proven by the bound alone is found canonically with the whole gap
        window = value - bound if lower >= value else min(value - bound, max(1, window * WINDOW_GROWTH))
    return incumbent, value, min(lower, value), exact or tie_break is None
