"""Fleet models split by workload: a Lagrangian decomposition that hands CP-SAT a near-optimal plan,
cuts that lift its bound, and, when the gap is small, a proof of optimality.

A fleet model couples its workloads only through rows that span several of them: rack budgets, a cost cap,
exclusions. Everything else (demand, serving modes, TTFT pairs) belongs to one workload's block. Pricing the
coupling rows at multipliers mu >= 0 splits the model into one small CP-SAT model per workload; for any plan x,

    objective(x) >= sum_w L_w(x_w) - mu.b >= sum_w l_w - mu.b     (the Lagrangian bound)

where L_w is block w's priced objective and l_w a proven lower bound of its minimum. The steps:

1. the LP relaxation (GLOP), with the cuts `L_w(x_w) >= l_w` of every round added, gives the
   multipliers: the duals of the coupling rows; a few rounds, until the bound stops rising;
2. each workload's plans at those prices and at multiples of them, and the plans of a sequential pass (workloads
   one at a time, largest first, within what the others leave), are the columns of a restricted master problem
   (one plan per workload, coupling rows kept): the incumbent;
3. the proof (planner.solver.projection): every plan that could beat or tie the incumbent has `L_w(x_w) - l_w <=
   incumbent - bound` in each block, and an optimal fleet needs, per workload, only the plans on its Pareto front
   of cost against its use of the binding rows. The master over those fronts is the whole problem: its optimum is
   proven, and its canonical tie-break is exact.

When step 3 does not finish, the caller keeps the best plan found (the proof's masters may improve the incumbent)
as a complete hint, the best bound proven, and the cuts as rows of the full model. Every number is an integer of
the model's own units: the multipliers are rounded down to integers, so each cut is exact. Each LP solve is capped
in simplex iterations (GLOP can cycle on a re-solve once cuts are added); a round that hits the cap ends the rounds.
"""

import math
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ortools.linear_solver import pywraplp
from ortools.sat.python import cp_model

from planner.cpsat import cpsat_solver
from planner.modes import SolveStatus
from planner.solver.linear_terms import term_range, weighted
from planner.units import MS

__all__ = ["Decomposition", "Incumbent", "Outcome", "split_by_block"]

INT64_EDGE = 2**62  # domain ends beyond this are infinite
ROUNDS = 6  # Lagrangian rounds at most (the bound usually stops rising after one or two)
GLOP_ITERATIONS_PER_ENTRY = 2  # simplex iterations per LP variable and row, at most (a first solve takes ~0.2)
PRICE_FACTORS = (0.0, 0.5, 0.9, 1.1, 2.0)  # multiples of the final prices whose plans join the master's columns
SUB_DTIME = 0.5  # deterministic-time limit of one workload's solve
MASTER_DTIME = 4.0  # deterministic-time limit of one master solve
PROOF_SHARE = 0.8  # of the time budget, at most, until the proof gives up
MASTER_SHARE = 0.15  # of the time budget, at most, for one master solve
WHOLE_MASTER_SHARE = 0.3  # of the time budget, in deterministic time, for a master with workloads whole


@dataclass(frozen=True)
class Row:
    """A coupling row in <= form: sum(coef * x[index]) <= rhs."""

    terms: tuple[tuple[int, int], ...]
    rhs: int


@dataclass
class Block:
    """One workload's own rows as a small CP-SAT model; `var_of` maps full-model variable indices to it."""

    name: str
    model: cp_model.CpModel
    var_of: dict[int, cp_model.IntVar] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """What the decomposition found; an empty assignment when no combination of its plans fitted."""

    assignment: dict[int, int]  # full-model variable index -> value, for every variable
    objective: int
    bound: int  # proven lower bound (the Lagrangian bound, or the objective when proven)
    proven: bool
    cuts: tuple[tuple[tuple[tuple[int, int], ...], int], ...]  # (terms, lower bound) rows valid for every plan


@dataclass(frozen=True)
class Incumbent:
    """Steps 1-2's result, where the proof (planner.solver.projection.prove) starts: the Lagrangian
    bound, the multipliers, each block's proven least priced cost, and the restricted master's plan."""

    bound: int
    mu: list[int]
    lows: list[int]
    assignment: dict[int, int]
    value: int


def _flat_domain(domain) -> tuple[int, int] | None:
    """A domain as one interval, or None when it has holes."""
    values = list(domain)
    return (values[0], values[-1]) if len(values) == 2 else None


def _literal(ref: int, var_of: dict[int, cp_model.IntVar]):
    return var_of[ref] if ref >= 0 else ~var_of[-ref - 1]


def split_by_block(model: cp_model.CpModel, block_of: dict[int, str], constants: dict[int, int]) -> tuple[list[Block], list[Row]] | None:
    """The model's rows, each in the block of its variables or among the coupling rows. `constants`
    are variables the caller fixes (enforcement literals of constraint families). None when the
    model has a row the decomposition cannot take (non-linear, holes, enforced coupling)."""
    proto = model.proto
    names = sorted(set(block_of.values()))
    blocks = {name: Block(name, cp_model.CpModel()) for name in names}
    for index in sorted(block_of):
        bounds = _flat_domain(proto.variables[index].domain)
        if bounds is None:
            return None
        blocks[block_of[index]].var_of[index] = blocks[block_of[index]].model.new_int_var(*bounds, proto.variables[index].name)
    rows: list[Row] = []
    for constraint in proto.constraints:
        if not constraint.has_linear():
            return None
        refs = list(constraint.linear.vars)
        if all(ref in constants for ref in refs):
            continue  # the rows that fix the constants
        enforcement = list(constraint.enforcement_literal)
        if any(ref in constants for ref in refs) or any(_inactive(lit, constants) for lit in enforcement):
            return None
        live = [lit for lit in enforcement if abs(lit if lit >= 0 else -lit - 1) not in constants]
        owners = {block_of.get(ref) for ref in refs} | {block_of.get(lit if lit >= 0 else -lit - 1) for lit in live}
        bounds = _flat_domain(constraint.linear.domain)
        if None in owners or bounds is None:
            return None
        terms = tuple(zip(refs, constraint.linear.coeffs))
        if len(owners) > 1:
            if live:
                return None
            rows += _as_rows(terms, bounds)
            continue
        block = blocks[owners.pop()]
        expression = weighted(block.var_of, terms)
        added = block.model.add_linear_expression_in_domain(expression, cp_model.Domain(*bounds))
        if live:
            added.only_enforce_if([_literal(lit, block.var_of) for lit in live])
    return list(blocks.values()), rows


def _inactive(literal: int, constants: dict[int, int]) -> bool:
    """An enforcement literal on a fixed variable that is false (its row never applies)."""
    index = literal if literal >= 0 else -literal - 1
    return index in constants and constants[index] == (0 if literal >= 0 else 1)


def _as_rows(terms: tuple[tuple[int, int], ...], bounds: tuple[int, int]) -> list[Row]:
    lo, hi = bounds
    return ([Row(terms, hi)] if hi < INT64_EDGE else []) + ([Row(tuple((r, -c) for r, c in terms), -lo)] if lo > -INT64_EDGE else [])


class Decomposition:
    """The Lagrangian decomposition of one built model (see the module docstring)."""

    def __init__(self, model: cp_model.CpModel, blocks: list[Block], rows: list[Row], constants: dict[int, int], *,
                 seed: int, workers: int, wall_s: float) -> None:
        self.model, self.blocks, self.rows, self.constants = model, blocks, rows, constants
        self.seed, self.workers = seed, max(1, workers)
        self.deadline = time.perf_counter() + wall_s  # a safety net: the work itself is bounded in deterministic time
        self.proof_deadline = time.perf_counter() + PROOF_SHARE * wall_s  # CP-SAT keeps the rest when the proof runs out
        self.master_dtime = min(MASTER_DTIME, MASTER_SHARE * wall_s)
        self.whole_master_dtime = WHOLE_MASTER_SHARE * wall_s  # a master with whole workloads is a CP-SAT search of its own
        objective = model.proto.objective
        self.objective = dict(zip(objective.vars, objective.coeffs))
        self.offset = round(objective.offset)
        self.cuts: list[tuple[tuple[tuple[int, int], ...], int]] = []
        self.columns: list[set[tuple[tuple[int, int], ...]]] = [set() for _ in blocks]

    def _solver(self, dtime: float, presolve: bool = True) -> cp_model.CpSolver:
        """One deterministic worker with the full linear relaxation (these models are small), stopped
        after `dtime` units of work, or at the proof's deadline."""
        return cpsat_solver(budget_s=self.deadline - time.perf_counter(), deterministic_time=dtime, seed=self.seed, presolve=presolve)

    def priced(self, mu: list[int]) -> dict[int, int]:
        """Objective coefficients plus the priced coupling rows."""
        coef = dict(self.objective)
        for m, row in zip(mu, self.rows):
            if m:
                for index, c in row.terms:
                    coef[index] = coef.get(index, 0) + m * c
        return coef

    def _price_block(self, args: tuple[Block, dict[int, int]]) -> tuple[int, tuple, tuple[tuple[int, int], ...] | None] | None:
        """The block's proven minimum at the prices, its priced terms (the cut) and its plan."""
        block, coef = args
        terms = tuple((i, coef[i]) for i in block.var_of if coef.get(i))
        block.model.minimize(weighted(block.var_of, terms))
        solver = self._solver(SUB_DTIME, presolve=False)  # a few dozen variables: presolve costs more than it saves
        status = solver.solve(block.model)
        if status == cp_model.INFEASIBLE:
            return None
        plan = tuple((i, solver.value(var)) for i, var in block.var_of.items()) if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
        return math.ceil(solver.best_objective_bound - 1e-6), terms, plan

    def price(self, mu: list[int]) -> tuple[int, list[int]] | None:
        """The Lagrangian bound at `mu` and each block's proven minimum; every block's plan joins the
        columns and its cut joins the cuts. None when a workload has no plan at all."""
        coef = self.priced(mu)
        with ThreadPoolExecutor(self.workers) as pool:  # CP-SAT releases the GIL; results keep block order
            results = list(pool.map(self._price_block, [(b, coef) for b in self.blocks]))
        if any(r is None for r in results):
            return None
        lows = []
        for k, (low, terms, plan) in enumerate(results):
            lows.append(low)
            self.cuts.append((terms, low))
            if plan is not None:
                self.columns[k].add(plan)
        bound = sum(lows) - sum(m * row.rhs for m, row in zip(mu, self.rows)) + self.offset
        return bound, lows

    # -- the LP master -------------------------------------------------------------------------
    def _lp(self) -> tuple[pywraplp.Solver, list, list]:
        lp = pywraplp.Solver.CreateSolver("GLOP")
        proto = self.model.proto
        xs = []
        for index, var in enumerate(proto.variables):
            lo, hi = (self.constants[index],) * 2 if index in self.constants else (next(iter(var.domain)), list(var.domain)[-1])
            xs.append(lp.NumVar(lo, hi, ""))
        infinity = lp.infinity()
        for constraint in proto.constraints:
            if constraint.enforcement_literal and any(abs(lit if lit >= 0 else -lit - 1) not in self.constants
                                                      for lit in constraint.enforcement_literal):
                continue  # enforced by a decision: left out of the relaxation
            lo, hi = next(iter(constraint.linear.domain)), list(constraint.linear.domain)[-1]
            row = lp.Constraint(-infinity if lo <= -INT64_EDGE else lo, infinity if hi >= INT64_EDGE else hi)
            for index, c in zip(constraint.linear.vars, constraint.linear.coeffs):
                row.SetCoefficient(xs[index], c)
        coupling = []
        for r in self.rows:
            row = lp.Constraint(-infinity, r.rhs)
            for index, c in r.terms:
                row.SetCoefficient(xs[index], c)
            coupling.append(row)
        objective = lp.Objective()
        for index, c in self.objective.items():
            objective.SetCoefficient(xs[index], c)
        objective.SetMinimization()
        return lp, xs, coupling

    def _solve_lp(self, lp: pywraplp.Solver) -> int:
        """One LP solve, capped in simplex iterations, the wall-clock deadline as a guard (module docstring)."""
        lp.SetSolverSpecificParametersAsString(f"max_number_of_iterations: {GLOP_ITERATIONS_PER_ENTRY * (lp.NumVariables() + lp.NumConstraints())}")
        lp.SetTimeLimit(max(1, int((self.deadline - time.perf_counter()) / MS)))
        return lp.Solve()

    def multipliers(self) -> tuple[int, list[int], list[int]] | None:
        """Rounds of LP duals and pricing; the best Lagrangian bound, its multipliers and the blocks' minima at them."""
        lp, xs, coupling = self._lp()
        best, best_mu, best_lows = -math.inf, [0] * len(self.rows), []
        for _ in range(ROUNDS):
            if self._solve_lp(lp) != pywraplp.Solver.OPTIMAL:  # the rounds before it stand
                return (best, best_mu, best_lows) if best_lows else None
            mu = [max(0, math.floor(-row.dual_value())) for row in coupling]  # a <= row's dual is <= 0 when minimising
            n_cuts = len(self.cuts)
            priced = self.price(mu)
            if priced is None:
                return None
            for terms, low in self.cuts[n_cuts:]:
                row = lp.Constraint(low, lp.infinity())
                for index, c in terms:
                    row.SetCoefficient(xs[index], c)
            if priced[0] <= best:
                break
            best, best_mu, best_lows = priced[0], mu, priced[1]
        return best, best_mu, best_lows

    # -- a plan that fits by construction ---------------------------------------------------------
    def _least_use(self) -> list[dict[int, int]]:
        """Per row, the least each block can add to it (its variables at the cheaper end of their domains)."""
        owner = {i: k for k, block in enumerate(self.blocks) for i in block.var_of}
        least: list[dict[int, int]] = []
        for row in self.rows:
            per_block: dict[int, int] = {}
            for index, c in row.terms:
                domain = self.model.proto.variables[index].domain
                per_block[owner[index]] = per_block.get(owner[index], 0) + term_range(domain, c)[0]
            least.append(per_block)
        return least

    def sequential(self, mu: list[int], order: list[int]) -> bool:
        """Workloads one at a time, in `order`, each at its priced minimum within what the rows leave
        it: the others hold their plan once placed and, before that, the least they can take. Every
        plan joins the columns. False when a workload finds nothing left that serves it."""
        least = self._least_use()
        coef, held = self.priced(mu), [[least[r].get(k, 0) for r in range(len(self.rows))] for k in range(len(self.blocks))]
        used = [sum(h[r] for h in held) for r in range(len(self.rows))]
        for k in order:
            block = self.blocks[k]
            model = block.model.clone()
            var = {i: model.get_int_var_from_proto_index(block.var_of[i].index) for i in block.var_of}
            for r, row in enumerate(self.rows):
                mine = [(i, c) for i, c in row.terms if i in var]
                if mine:
                    model.add(weighted(var, mine) <= row.rhs - used[r] + held[k][r])
            model.minimize(weighted(var, coef))
            solver = self._solver(SUB_DTIME)
            if solver.solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                return False
            plan = tuple((i, solver.value(var[i])) for i in block.var_of)
            values = dict(plan)
            now = [sum(c * values[i] for i, c in row.terms if i in values) for row in self.rows]
            used = [u - h + m for u, h, m in zip(used, held[k], now)]
            held[k] = now
            self.columns[k].add(plan)
        return True

    # -- masters ---------------------------------------------------------------------------------
    def _value(self, plan: Iterable[tuple[int, int]], coef: dict[int, int]) -> int:
        return sum(coef.get(i, 0) * x for i, x in plan)

    def _copy_block(self, master: cp_model.CpModel, k: int) -> dict[int, cp_model.IntVar]:
        """Block k's variables and rows added to `master`; its variables by full-model index."""
        block = self.blocks[k]
        proto = block.model.proto
        local = {var.index: master.new_int_var(*list(proto.variables[var.index].domain), f"{block.name}:{index}")
                 for index, var in block.var_of.items()}
        for constraint in proto.constraints:
            linear = constraint.linear
            added = master.add_linear_expression_in_domain(
                cp_model.LinearExpr.weighted_sum([local[v] for v in linear.vars], list(linear.coeffs)),
                cp_model.Domain.from_flat_intervals(list(linear.domain)))
            if constraint.enforcement_literal:
                added.only_enforce_if([local[lit] if lit >= 0 else ~local[-lit - 1] for lit in constraint.enforcement_literal])
        return {index: local[var.index] for index, var in block.var_of.items()}

    def master(self, columns: list[list[tuple[tuple[int, int], ...]] | None], *, rows: list[int] | None = None,
               cap: int | None = None, tie_break: dict[int, int] | None = None,
               limits: dict[int, tuple[dict[int, int], int]] | None = None, dtime: float | None = None) -> tuple[SolveStatus, dict[int, int] | None, int | None]:
        """One plan per workload from `columns`, the coupling rows kept (those numbered in `rows`, or all), the
        objective minimised (then, if `tie_break` is given, the tie-break among the plans of equal objective). A
        workload whose columns are None joins whole: its own variables and rows, with `limits[k]` (terms, most) as
        one more row. Returns the status, the full assignment and the objective."""
        master = cp_model.CpModel()
        atoms: list[tuple[cp_model.IntVar, dict[int, int], bool]] = []  # (variable, its value per full-model index, a plan's pick)
        for k, plans in enumerate(columns):
            if plans is None:
                var = self._copy_block(master, k)
                atoms += [(x, {i: 1}, False) for i, x in var.items()]
                if limits and k in limits:
                    terms, most = limits[k]
                    master.add(weighted(var, terms) <= most)
                continue
            picks = [master.new_bool_var(f"{self.blocks[k].name}#{n}") for n in range(len(plans))]
            master.add_exactly_one(picks)
            atoms += [(z, dict(plan), True) for z, plan in zip(picks, plans)]

        def linear(coef: dict[int, int]) -> cp_model.LinearExpr:
            return cp_model.LinearExpr.weighted_sum([a for a, _, _ in atoms], [self._value(c.items(), coef) for _, c, _ in atoms])

        for row in self.rows if rows is None else [self.rows[r] for r in rows]:
            master.add(linear(dict(row.terms)) <= row.rhs)
        objective = linear(self.objective)
        if cap is not None:
            master.add(objective <= cap - self.offset)
        master.minimize(objective)
        solver = self._solver(dtime or self.master_dtime)
        status = solver.solve(master)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return SolveStatus.INFEASIBLE if status == cp_model.INFEASIBLE else SolveStatus.UNKNOWN, None, None
        value = round(solver.objective_value)
        name = SolveStatus.OPTIMAL if status == cp_model.OPTIMAL else SolveStatus.FEASIBLE
        if tie_break is not None and name is SolveStatus.OPTIMAL:
            for a, _, _ in atoms:
                master.add_hint(a, solver.value(a))
            master.add(objective <= value)
            master.minimize(linear(tie_break))
            second = self._solver(dtime or self.master_dtime)
            if second.solve(master) in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                solver = second
        chosen = dict(self.constants)
        for a, contribution, pick in atoms:
            if not pick:
                chosen.update((i, solver.value(a)) for i in contribution)
            elif solver.value(a):
                chosen.update(contribution)
        return name, chosen, value + self.offset

    # -- the whole procedure ----------------------------------------------------------------------
    def incumbent(self) -> Incumbent | Outcome | None:
        """Steps 1-2 of the module docstring: the incumbent the proof starts from; an Outcome with no
        plan when no combination of the columns fits (the cuts still hold); None when a workload
        cannot be served at all."""
        found = self.multipliers()
        if found is None:
            return None
        bound, mu, lows = found
        for factor in PRICE_FACTORS:
            if self.price([math.floor(m * factor) for m in mu]) is None:
                return None
        self.sequential(mu, sorted(range(len(self.blocks)), key=lambda k: -lows[k]))  # the largest workloads first
        _status, incumbent, value = self.master([sorted(c) for c in self.columns])
        if incumbent is None:
            return Outcome({}, 0, bound, False, tuple(self.cuts))
        return Incumbent(bound, mu, lows, incumbent, value)
