"""Sweeps over one problem: rack generations side by side, the cost-speed frontier, and the batch curve.

- `compare_racks`: the problem re-planned on each rack type alone (as many racks as the plan needs,
  or a fixed count), one row per workload and rack.
- `sweep_frontier`: an epsilon-constraint sweep over the TPOT limit of one workload (docs/cpsat.md
  section 5). Points go from the tightest limit to the loosest; each point's CP-SAT search starts
  from the previous point's plan, which stays feasible because loosening the limit only raises every
  layout's largest batch. The frontier is the points no other point beats on both cost and speed.
- `batch_curve`: one deployment evaluated over its batch range: cost per token falls like 1/B while
  weight fetch dominates and flattens at the compute and KV floor (claims 1 and 2).

Everything here re-uses the solver and the roofline; nothing re-derives physics.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from planner.errors import InputIssue, PlannerInputError, unknown_name_issue
from planner.model.architecture import param_counts
from planner.modes import ServingRole, SolveStatus
from planner.physics.batch_table import BatchTable, evaluate_batches
from planner.physics.cost import usd_per_million_tokens, usd_per_s
from planner.physics.deployment import Layout
from planner.physics.inputs import DeploymentInputs
from planner.physics.roofline import critical_batch_size
from planner.precision import bytes_per_value
from planner.problem.resolve import ResolvedProblem, resolve_problem
from planner.problem.schema import Objective, Problem, RackCount
from planner.solver.candidates import Candidate, served_tokens_per_s
from planner.solver.search import RawSolution, solve_data
from planner.solver.solve import SolveResult, expert_imbalance_functions, prepare, solve
from planner.units import MS, SECONDS_PER_HOUR

__all__ = [
    "BatchCurve",
    "CompareRow",
    "Frontier",
    "FrontierPoint",
    "batch_curve",
    "compare_racks",
    "infeasibility_note",
    "sweep_frontier",
    "workload_rows",
]

Progress = Callable[[int, int, str], None]  # (done, total, what)
FAST_MODE_SPEEDUP = 2.5  # docs/physics.md claim 10: "~2.5x speed for ~6x price"


# ---------------------------------------------------------------------------------------------
# compare


@dataclass(frozen=True)
class CompareRow:
    rack_id: str
    accelerator_id: str
    workload: str
    status: str
    usd_per_million_output_tokens: float | None  # the workload's fleet cost over the tokens it serves
    output_tokens_per_s_per_accelerator: float | None
    tpot_s: float | None  # slowest deployment serving the workload
    ttft_s: float | None
    accelerators: int
    racks_used: int
    usd_per_hour: float
    layouts: str  # "TP1 x DPattn16 x EP16, batch 2352 x 1"
    binding: str  # what stopped the batch growing (hbm, tpot, ttft, max_batch)
    dominant: str  # the dominant roofline term of the decode step
    note: str = ""  # why there is no plan
    demand_output_tokens_per_s: float | None = None  # the fleet is sized for this; None = cost per token of one replica


def _single_rack_problem(problem: Problem, rack_id: str, count: int | None) -> Problem:
    cluster = problem.cluster.model_copy(update={"racks": [RackCount(type=rack_id, count=count)], "unavailable_accelerators": []})
    return problem.model_copy(update={"cluster": cluster})


def _check_rack_ids(resolved: ResolvedProblem, rack_ids: list[str]) -> None:
    issues = [unknown_name_issue(f"--racks[{i}]", "rack", r, resolved.hardware.racks) for i, r in enumerate(rack_ids)
              if r not in resolved.hardware.racks]
    if issues:
        raise PlannerInputError(issues, "--racks")


def infeasibility_note(report) -> str:
    """An infeasibility report (solver.infeasibility.InfeasibilityReport) on one line: its first
    conflict with the numbers, else its summary."""
    if not report.conflicts:
        return report.summary
    lines = [line.strip() for line in report.conflicts[0].message.splitlines()]
    text = " ".join(lines[1:] if len(lines) > 1 and lines[0].endswith(":") else lines)
    return text + "".join(f"; relax: {fix}" for fix in report.conflicts[0].relax[:1])


def workload_rows(result: SolveResult) -> list[CompareRow]:
    """One row per workload of a solved problem on whatever racks its plan uses (`planner sweep`)."""
    return _rows_of(result, None)


def _rows_of(result: SolveResult, rack_id: str | None) -> list[CompareRow]:
    resolved = result.problem
    rows = []
    for w in resolved.workloads:
        mine = [d for d in result.deployments if d.candidate.workload == w.name]
        racks_of = sorted({d.candidate.rack_id for d in mine}) or [r.id for r, _ in resolved.rack_counts]
        rack = rack_id or "+".join(racks_of)
        accel = "+".join(dict.fromkeys(resolved.hardware.racks[r].accelerator.id for r in ([rack_id] if rack_id else racks_of)))
        if not result.has_plan or not mine:
            note = infeasibility_note(result.infeasibility) if result.infeasibility is not None else result.status
            rows.append(CompareRow(rack, accel, w.name, result.status, None, None, None, None, 0, 0, 0.0, "", "", "", note,
                                   w.output_tokens_per_s))
            continue
        usd = sum(d.usd_per_hour for d in mine)
        served = result.served_output_tokens_per_s(w.name)
        accelerators = sum(d.accelerators for d in mine)
        racks = set()
        if result.placement is not None:
            for i, d in enumerate(result.deployments):
                if d in mine:
                    racks |= {role.rack for role in result.placement.of_deployment(i)}
        cost = result.workload_usd_per_million_output_tokens(w.name)
        layouts = "; ".join(f"{_role_prefix(d.candidate)}{d.candidate.layout.name}, batch {d.candidate.batch} "
                            f"x {d.replicas}" for d in mine)
        rows.append(CompareRow(
            rack, accel, w.name, result.status, cost, served / accelerators,
            result.workload_tpot_s(w.name), result.workload_ttft_s(w.name), accelerators, len(racks), usd, layouts,
            ", ".join(sorted({d.candidate.batch_limit for d in mine})),
            ", ".join(sorted({d.estimate.serving_step.dominant_term for d in mine})),
            demand_output_tokens_per_s=w.output_tokens_per_s,
        ))
    return rows


def _role_prefix(c: Candidate) -> str:
    return "" if c.role is ServingRole.AGGREGATED else f"{c.role}: "


def compare_racks(problem: Problem, rack_ids: list[str], *, base_dir=".", count: int | None = None, time_limit_s: float | None = None,
                  seed: int | None = None, workers: int | None = None, progress: Progress | None = None) -> list[CompareRow]:
    """The problem planned on each rack type of `rack_ids` alone (`count` racks, or as many as needed)."""
    resolved_any = resolve_problem(problem, base_dir=base_dir)
    _check_rack_ids(resolved_any, rack_ids)
    rows: list[CompareRow] = []
    for k, rack_id in enumerate(rack_ids):
        if progress:
            progress(k, len(rack_ids), rack_id)
        resolved = resolve_problem(_single_rack_problem(problem, rack_id, count), base_dir=base_dir)
        result = solve(resolved, time_limit_s=time_limit_s, seed=seed, workers=workers)
        rows.extend(_rows_of(result, rack_id))
    if progress:
        progress(len(rack_ids), len(rack_ids), "done")
    return rows


# ---------------------------------------------------------------------------------------------
# frontier


@dataclass(frozen=True)
class FrontierPoint:
    tpot_limit_s: float
    status: str
    tpot_s: float | None  # the plan's slowest TPOT (at most the limit)
    usd_per_million_output_tokens: float | None
    usd_per_hour: float | None
    accelerators: int
    plan: str  # "gb200-nvl72 TP1 x DPattn16 x EP16, batch 2352 x 1"
    batch: int  # largest batch of the plan
    hinted: bool  # the search started from the previous point's plan
    on_frontier: bool = False

    @property
    def tokens_per_s_per_user(self) -> float | None:
        return None if not self.tpot_s else 1.0 / self.tpot_s


@dataclass(frozen=True)
class Frontier:
    workload: str
    model: str
    points: tuple[FrontierPoint, ...]  # tightest TPOT limit first

    @property
    def frontier(self) -> list[FrontierPoint]:
        """Points on the frontier, fastest first."""
        return [p for p in self.points if p.on_frontier]

    def cost_at_speed(self, tokens_per_s_per_user: float) -> float | None:
        """Cost per million output tokens on the frontier at a per-user speed, interpolated linearly in
        log-log between frontier points (None outside the swept range)."""
        front = sorted(self.frontier, key=lambda p: p.tokens_per_s_per_user)
        speeds = np.log([p.tokens_per_s_per_user for p in front])
        costs = np.log([p.usd_per_million_output_tokens for p in front])
        x = math.log(tokens_per_s_per_user)
        if len(front) < 2 or not speeds[0] <= x <= speeds[-1]:
            return None
        return float(np.exp(np.interp(x, speeds, costs)))

    def price_multiple(self, point: FrontierPoint, speedup: float = FAST_MODE_SPEEDUP) -> float | None:
        """How many times `point`'s cost per token the frontier charges for `speedup` x its speed."""
        cost = self.cost_at_speed(point.tokens_per_s_per_user * speedup)
        return None if cost is None else cost / point.usd_per_million_output_tokens


def _one_workload(problem: Problem, workload: str | None) -> tuple[Problem, str]:
    names = [w.name for w in problem.workloads]
    if workload is None:
        if len(names) > 1:
            raise PlannerInputError(InputIssue("--workload", f"the problem has {len(names)} workloads", f"name one of: {', '.join(names)}"))
        workload = names[0]
    if workload not in names:
        raise PlannerInputError(unknown_name_issue("--workload", "workload", workload, names))
    spec = next(w for w in problem.workloads if w.name == workload)
    return problem.model_copy(update={"workloads": [spec], "objective": Objective.MIN_COST}), workload


def _with_tpot_limit(problem: Problem, tpot_limit_s: float | None) -> Problem:
    spec = problem.workloads[0].model_copy(update={"tpot_limit_ms": None if tpot_limit_s is None else tpot_limit_s / MS})
    return problem.model_copy(update={"workloads": [spec]})


def _key(c: Candidate) -> tuple:
    return (c.workload, c.rack_id, c.layout)


def _point(limit_s: float, data, raw: RawSolution, hinted: bool) -> FrontierPoint:
    if not raw.status.has_plan or not raw.chosen:
        return FrontierPoint(limit_s, raw.status, None, None, None, 0, "", 0, hinted)
    chosen = [(data.candidates[j], r) for j, r in sorted(raw.chosen.items())]
    usd = sum(c.usd_per_hour * r for c, r in chosen)
    makers = [(c, r) for c, r in chosen if c.role is not ServingRole.PREFILL]
    served = served_tokens_per_s(chosen)
    demand = data.demand_tokens_per_s[data.workloads[0]]
    cost = usd_per_million_tokens(usd / SECONDS_PER_HOUR, served) if demand is not None else sum(c.usd_per_million_output_tokens for c, _ in chosen)
    plan = "; ".join(f"{_role_prefix(c)}{c.rack_id} {c.layout.name}, batch {c.batch} x {r}" for c, r in chosen)
    return FrontierPoint(limit_s, raw.status, max(c.tpot_s for c, _ in makers), cost, usd, sum(c.accelerators * r for c, r in chosen),
                         plan, max(c.batch for c, _ in makers), hinted)


def _mark_frontier(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """A point is on the frontier when no other point is at least as fast and as cheap and better in one."""
    solved = [p for p in points if p.tpot_s is not None]
    out = []
    for p in points:
        on = p.tpot_s is not None and not any(
            q is not p and q.tpot_s <= p.tpot_s and q.usd_per_million_output_tokens <= p.usd_per_million_output_tokens
            and (q.tpot_s < p.tpot_s or q.usd_per_million_output_tokens < p.usd_per_million_output_tokens) for q in solved)
        duplicate = on and any(q.on_frontier and q.plan == p.plan for q in out)  # the same plan at several limits
        out.append(replace(p, on_frontier=on and not duplicate))
    return out


def sweep_frontier(problem: Problem, *, base_dir=".", workload: str | None = None, points: int = 16, min_tpot_s: float | None = None,
                   max_tpot_s: float | None = None, time_limit_s: float | None = None, seed: int | None = None,
                   workers: int | None = None, progress: Progress | None = None) -> Frontier:
    """Cost per token against per-user speed for one workload, by sweeping its TPOT limit."""
    problem, workload = _one_workload(problem, workload)
    options = problem.solver
    time_limit_s = options.time_limit_s if time_limit_s is None else time_limit_s
    seed = options.seed if seed is None else seed
    workers = options.workers if workers is None else workers
    loose = resolve_problem(_with_tpot_limit(problem, None), base_dir=base_dir)
    imbalance = expert_imbalance_functions(loose)
    data, analyses = prepare(loose, imbalance=imbalance)
    if not data.candidates:
        raise PlannerInputError(InputIssue("problem", f"no layout of {workload} fits any rack of the fleet, whatever the TPOT limit",
                                           "solve the problem to see why (planner solve)"))
    fastest = min(a.min_tpot_s for a in analyses.values())
    slowest = max(c.tpot_s for c in data.candidates)
    lo = min_tpot_s if min_tpot_s is not None else fastest * (1 + 1e-6)
    hi = max_tpot_s if max_tpot_s is not None else slowest
    if not lo < hi:
        raise PlannerInputError(InputIssue("--min-tpot-ms/--max-tpot-ms", f"the range {lo / MS:.3g}..{hi / MS:.3g} ms is empty",
                                           "give a minimum below the maximum"))
    limits = np.geomspace(lo, hi, max(2, points))
    out: list[FrontierPoint] = []
    previous: dict[tuple, int] | None = None
    for k, limit in enumerate(limits):
        if progress:
            progress(k, len(limits), f"TPOT <= {limit / MS:.3g} ms")
        resolved = resolve_problem(_with_tpot_limit(problem, float(limit)), base_dir=base_dir)
        data, _ = prepare(resolved, imbalance=imbalance)
        hint = None
        if previous:
            index = {_key(c): j for j, c in enumerate(data.candidates)}
            if all(key in index for key in previous):
                hint = {index[key]: r for key, r in previous.items()}
        raw = solve_data(data, time_limit_s=time_limit_s, seed=seed, workers=workers, hint=hint) if data.candidates else \
            RawSolution(SolveStatus.INFEASIBLE, {}, None, None, None, None, 0.0, "", 0, 0)
        out.append(_point(float(limit), data, raw, hint is not None))
        if raw.chosen:
            previous = {_key(data.candidates[j]): r for j, r in raw.chosen.items()}
    if progress:
        progress(len(limits), len(limits), "done")
    model = loose.models[loose.workloads[0].model_key].arch.id
    return Frontier(workload, model, tuple(_mark_frontier(out)))


# ---------------------------------------------------------------------------------------------
# batch curve


@dataclass(frozen=True)
class BatchCurve:
    workload: str
    model: str
    rack_id: str
    layout: Layout
    table: BatchTable
    usd_per_million_output_tokens: np.ndarray
    chosen_batch: int  # the plan's batch: the largest that meets the limits
    hbm_limit_batch: int  # the largest batch that fits HBM (0: none on the grid)
    tpot_limit_s: float | None
    critical_batch: float  # compute = weight fetch for the dense-equivalent model (claim 2)
    batch_limit: str

    @property
    def min_cost_index(self) -> int:
        cost = np.where(self.table.fits, self.usd_per_million_output_tokens, np.inf)
        return int(np.argmin(cost))


def batch_curve(problem: Problem, *, base_dir=".", workload: str | None = None, points: int = 48,
                result: SolveResult | None = None) -> BatchCurve:
    """The workload's planned deployment (its first, cheapest-per-token one) over its batch range."""
    problem, workload = _one_workload(problem, workload)
    resolved = resolve_problem(problem, base_dir=base_dir)
    result = result or solve(resolved, explain=False)
    if not result.has_plan:
        raise PlannerInputError(InputIssue("problem", f"no plan for {workload} ({result.status})", "run planner solve to see why"))
    d = min(result.deployments, key=lambda d: d.candidate.usd_per_million_output_tokens)
    inp: DeploymentInputs = d.estimate.inputs
    granularity = inp.layout.pp * inp.layout.dp_attn
    top = max(d.candidate.batch * 8, granularity * 2)
    batches = np.unique(np.round(np.geomspace(granularity, top, points) / granularity).astype(int) * granularity)
    batches = np.union1d(batches, [d.candidate.batch])
    table = evaluate_batches(inp, batches)
    cost = usd_per_million_tokens(usd_per_s(inp.rack.accelerator.price_usd_per_hour, inp.layout.n_accelerators),
                                  table.sustained_output_tokens_per_s)
    fits = np.flatnonzero(table.fits)
    arch = inp.arch
    counts = param_counts(arch)
    accel = inp.rack.accelerator
    fmt = inp.precisions.compute
    critical = critical_batch_size(accel.achievable_flops_per_s(fmt),
                                   accel.achievable_hbm_bytes_per_s,
                                   bytes_per_value(inp.precisions.weights), counts.total, counts.active_matmul)
    return BatchCurve(workload, arch.id, inp.rack.id, inp.layout, table, np.asarray(cost) * 1.0, d.candidate.batch,
                      int(batches[fits[-1]]) if len(fits) else 0, resolved.workloads[0].tpot_limit_s, critical, d.candidate.batch_limit)

