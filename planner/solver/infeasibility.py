"""Why a problem has no plan: which constraint families conflict, with the numbers, and what to relax.

Step 1 checks each workload alone from the enumeration: no layout fits HBM, none meets TPOT or
TTFT. Step 2, for conflicts that couple workloads and the fleet (demand, rack budgets, cost cap),
asks CP-SAT: every family has an enforcement literal, the solve runs with those literals as
assumptions on one worker, and the core is validated and shrunk to an irreducible set by deletion
(docs/cpsat.md section 4). Step 3 quantifies relaxations by small feasibility searches.
"""

import math
from dataclasses import replace

from ortools.sat.python import cp_model

from planner.cpsat import cpsat_solver
from planner.model.architecture import param_counts
from planner.modes import ConstraintFamily, FamilyKind, ServingRole, SolveStatus
from planner.precision import bytes_per_value
from planner.solver.candidates import pair_ttft_p90_s
from planner.solver.findings import Conflict, InfeasibilityReport
from planner.solver.model_builder import PlanningData, RackPool, build_model
from planner.solver.result import SolveResult
from planner.units import format_bytes, format_rate, format_seconds, format_usd

__all__ = ["Conflict", "InfeasibilityReport", "conflicting_families", "explain_infeasibility", "weights_bytes"]

SEARCH_TIME_LIMIT_S = 2.0


def weights_bytes(result: SolveResult, workload_name: str) -> float:
    """Bytes of the workload's model weights in the problem's weight formats."""
    w = next(w for w in result.problem.workloads if w.name == workload_name)
    model = result.problem.models[w.model_key]
    counts = param_counts(model.arch)
    weights = model.precisions.weights or model.arch.native_weights_precision
    experts = model.precisions.expert_weights or model.arch.native_expert_weights_precision or weights
    routed = counts.layers_routed_total
    return (counts.total - routed) * bytes_per_value(weights) + routed * bytes_per_value(experts)


def _workload_alone(result: SolveResult, workload_name: str) -> Conflict | None:
    """A workload that has no candidate on any rack type: say which per-candidate limit stops it."""
    analyses = [a for (w, _), a in result.analyses.items() if w == workload_name]
    roles = {c.role for a in analyses for c in a.candidates}
    if ServingRole.AGGREGATED in roles or {ServingRole.PREFILL, ServingRole.DECODE} <= roles:
        return None  # decode candidates without a prefill pool to feed them serve nothing
    w = next(w for w in result.problem.workloads if w.name == workload_name)
    racks = result.problem.hardware.racks
    lines, relax, families = [], [], set()
    for a in analyses:
        rack = racks[a.rack_id]
        domain = rack.n_accelerators * rack.accelerator.hbm_capacity_bytes
        if a.rejected.get("hbm", 0) == a.layouts_tried - a.rejected.get("invalid", 0):
            families.add(ConstraintFamily(FamilyKind.HBM))
            if math.isfinite(a.min_hbm_need_bytes):
                need = f"the smallest need is {format_bytes(a.min_hbm_need_bytes)} per accelerator against {format_bytes(a.hbm_capacity_bytes)}"
            else:  # no layout was worth evaluating: the weights alone overflow every split the fleet allows
                count = {r.id: c for r, c in result.problem.rack_counts}.get(a.rack_id)
                need = "the weights do not fit even spread over " + (
                    f"all {count * rack.n_accelerators} accelerators of the fleet's {count} {a.rack_id}" if count else "the largest allowed group")
            lines.append(f"on {a.rack_id}: no layout fits HBM; {need}; the weights alone are "
                         f"{format_bytes(weights_bytes(result, workload_name))} and one scale-up domain holds {format_bytes(domain)}")
            relax.append("use racks with a larger scale-up domain, narrower weights (fp8/fp4), or cluster.allow_spanning_domains: true")
        elif w.tpot_limit_s is not None and a.min_tpot_s > w.tpot_limit_s:
            families.add(ConstraintFamily(FamilyKind.TPOT, workload_name))
            lines.append(f"on {a.rack_id}: the fastest layout that fits HBM decodes at {format_seconds(a.min_tpot_s)} per token, "
                         f"over the {format_seconds(w.tpot_limit_s)} TPOT limit")
            relax.append(f"raise workloads[{workload_name}].tpot_limit_ms to at least {math.ceil(a.min_tpot_s * 1e3)}")
        elif w.ttft_limit_s is not None and a.min_ttft_s > w.ttft_limit_s:
            families.add(ConstraintFamily(FamilyKind.TTFT, workload_name))
            lines.append(f"on {a.rack_id}: the fastest first token takes {format_seconds(a.min_ttft_s)} (90th percentile), over the "
                         f"{format_seconds(w.ttft_limit_s)} TTFT limit")
            relax.append(f"raise workloads[{workload_name}].ttft_limit_ms to at least {math.ceil(a.min_ttft_s * 1e3)}")
        else:
            families.add(ConstraintFamily(FamilyKind.LIMITS))
            lines.append(f"on {a.rack_id}: every layout breaks a limit ({', '.join(f'{k}: {n}' for k, n in sorted(a.rejected.items()))})")
    message = f"workload '{workload_name}' cannot be served by any rack type:\n      " + "\n      ".join(lines)
    return Conflict(tuple(sorted(families)), message, tuple(dict.fromkeys(relax)))


def _solve_with_assumptions(data: PlanningData, families: list[str] | None, presolve: bool = True) -> tuple[int, cp_model.CpSolver, dict]:
    model, v = build_model(data)
    literals = v.families
    chosen = list(literals) if families is None else families
    model.add_assumptions([literals[f] for f in chosen if f in literals])
    solver = cpsat_solver(budget_s=SEARCH_TIME_LIMIT_S, seed=0, presolve=presolve)
    status = solver.solve(model)
    return status, solver, {lit.index: name for name, lit in literals.items()}


def conflicting_families(data: PlanningData) -> list[ConstraintFamily]:
    """An irreducible set of constraint families that cannot hold together (empty if feasible)."""
    status, solver, by_index = _solve_with_assumptions(data, None)
    if status != cp_model.INFEASIBLE:
        return []
    core = [by_index.get(i) for i in solver.sufficient_assumptions_for_infeasibility()]
    if None in core or not core:  # or-tools#5141: validate the core; fall back to presolve off
        status, solver, by_index = _solve_with_assumptions(data, None, presolve=False)
        core = [by_index[i] for i in solver.sufficient_assumptions_for_infeasibility() if i in by_index]
    minimal = list(core)
    for family in core:  # deletion-based shrinking to an irreducible subset
        trial = [f for f in minimal if f != family]
        if trial and _solve_with_assumptions(data, trial)[0] == cp_model.INFEASIBLE:
            minimal = trial
    return sorted(minimal)


def _feasible(data: PlanningData) -> bool:
    status, _, _ = _solve_with_assumptions(data, None)
    return status in (cp_model.OPTIMAL, cp_model.FEASIBLE)


def _max_servable_fraction(data: PlanningData, workload: str) -> float:
    """Largest share of `workload`'s demand the fleet can serve with everything else unchanged."""
    lo, hi = 0.0, 1.0
    for _ in range(12):
        mid = (lo + hi) / 2
        demand = dict(data.demand_tokens_per_s, **{workload: data.demand_tokens_per_s[workload] * mid})
        if mid > 0 and _feasible(replace(data, demand_tokens_per_s=demand)):
            lo = mid
        else:
            hi = mid
    return lo


def _racks_needed(data: PlanningData, rack_id: str) -> int | None:
    """Fewest racks of `rack_id` that make the problem feasible, everything else unchanged."""
    pool = data.pools[rack_id]
    have = pool.count or 0
    hi = max(1, have)
    while not _feasible(replace(data, pools={**data.pools, rack_id: RackPool(rack_id, pool.domain_size, hi)})):
        hi *= 2
        if hi > 1 << 14:
            return None
    lo = have
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _feasible(replace(data, pools={**data.pools, rack_id: RackPool(rack_id, pool.domain_size, mid)})):
            hi = mid
        else:
            lo = mid
    return hi


def _best_per_accelerator(data: PlanningData, workload: str, role: ServingRole):
    """The workload's candidate in `role` that makes (decode, aggregated) or feeds (prefill) the most
    output tokens per second per accelerator; None without one."""
    mine = [c for c in data.candidates if c.workload == workload and c.role is role]
    return max(mine, key=lambda c: (c.output_tokens_per_s_per_accelerator, -c.accelerators), default=None)


def _accelerators_needed(data: PlanningData, workload: str) -> str:
    """The fewest accelerators the demand needs in each serving mode the workload may use, with the
    layouts and rates it follows from: separate pools need a decode pool and a prefill pool."""
    demand = data.demand_tokens_per_s[workload]
    aggregated, decode, prefill = (_best_per_accelerator(data, workload, r) for r in
                                   (ServingRole.AGGREGATED, ServingRole.DECODE, ServingRole.PREFILL))
    ways = []
    if aggregated is not None:
        rate = aggregated.output_tokens_per_s_per_accelerator
        ways.append((math.ceil(demand / rate), (f"aggregated, its most efficient layout ({aggregated.rack_id} {aggregated.layout.name}) "
                                                f"makes {format_rate(rate)} per accelerator: at least {math.ceil(demand / rate)} accelerators")))
    if decode is not None and prefill is not None:
        d, p = (math.ceil(demand / c.output_tokens_per_s_per_accelerator) for c in (decode, prefill))
        ways.append((d + p, (f"with separate pools, its most efficient decode layout ({decode.rack_id} {decode.layout.name}) makes "
                             f"{format_rate(decode.output_tokens_per_s_per_accelerator)} per accelerator and its most efficient prefill "
                             f"layout ({prefill.rack_id} {prefill.layout.name}) feeds {format_rate(prefill.output_tokens_per_s_per_accelerator)}"
                             f" per accelerator: at least {d} + {p} = {d + p} accelerators")))
    return "; ".join(text for _, text in sorted(ways)) if ways else "no layout serves it"


def _fleet_size(data: PlanningData) -> str:
    counted = [(pool.count, pool.domain_size, rack_id) for rack_id, pool in data.pools.items() if pool.count is not None]
    if len(counted) < len(data.pools):
        return "the fleet may add racks without limit"
    return "the fleet has " + " + ".join(f"{n} x {rack_id}" for n, _, rack_id in counted) + \
        f" ({sum(n * size for n, size, _ in counted)} accelerators)"


def _coupled_conflict(result: SolveResult, families: list[ConstraintFamily]) -> Conflict:
    data = result.data
    lines, relax = [], []
    for family in families:
        kind, name = family.kind, family.subject
        if kind is FamilyKind.DEMAND:
            demand = data.demand_tokens_per_s[name]
            fleet = "" if any(f.kind is FamilyKind.RACKS for f in families) else f"; {_fleet_size(data)}"
            lines.append(f"workload '{name}' asks for {format_rate(demand)} output tokens; {_accelerators_needed(data, name)}{fleet}")
            fraction = _max_servable_fraction(data, name)
            relax.append(f"lower workloads[{name}].demand to at most {format_rate(demand * fraction)} ({fraction:.0%} of it)")
        elif kind is FamilyKind.RACKS:
            pool = data.pools[name]
            lines.append(f"the fleet has {pool.count} x {name} ({pool.count * pool.domain_size} accelerators)")
            needed = _racks_needed(data, name)
            if needed is not None:
                relax.append(f"raise cluster.racks[{name}].count from {pool.count} to {needed}")
        elif kind is FamilyKind.COST_CAP:
            lines.append(f"the fleet must cost at most {format_usd(data.cost_cap_usd_per_hour)}/h")
            relax.append("raise cost_cap_usd_per_hour")
        elif kind is FamilyKind.SERVE:
            lines.append(f"workload '{name}' needs one replica")
        elif kind is FamilyKind.TTFT:
            pairs = data.split_pairs_over_ttft(name)
            fastest = min((pair_ttft_p90_s(data.candidates[p], data.candidates[q]) for p, q in pairs), default=None)
            lines.append(f"workload '{name}' has a TTFT limit of {format_seconds(data.ttft_limit_s[name])}; {len(pairs)} prefill-decode "
                         "pairs exceed it at the 90th percentile (prefill + KV hand-off over the NICs + decode join)"
                         + (f", the fastest of them at {format_seconds(fastest)}" if fastest is not None else ""))
            relax.append(f"raise workloads[{name}].ttft_limit_ms, or serve it aggregated (serving: aggregated)")
    return Conflict(tuple(families), "these constraints conflict:\n      " + "\n      ".join(lines), tuple(relax))


def explain_infeasibility(result: SolveResult) -> InfeasibilityReport:
    """Explain why `result` (a SolveResult without a plan) is infeasible."""
    if result.status is not SolveStatus.INFEASIBLE and result.data.candidates:
        return InfeasibilityReport(f"no plan found within the time limit (status {result.status}); the problem may still be "
                                   "feasible: raise --time-limit", ())
    alone = [c for w in result.data.workloads if (c := _workload_alone(result, w)) is not None]
    if alone:
        return InfeasibilityReport("some workloads cannot be served by any rack type, whatever the rest of the plan", tuple(alone))
    families = conflicting_families(result.data)
    if not families:
        return InfeasibilityReport("CP-SAT reported infeasibility but no conflicting family was found", ())
    return InfeasibilityReport("the fleet cannot serve every workload at once", (_coupled_conflict(result, families),))
