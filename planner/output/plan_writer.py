"""The writer of plan files: a solve result as a typed `Plan` (`solve_plan`), and that plan as the
JSON document `planner solve --json` writes (`solve_record`)."""

from planner.modes import ServingRole
from planner.output.handoff import handoff_summary
from planner.output.plan import (
    PLAN_FORMAT,
    PLAN_FORMAT_VERSION,
    Plan,
    PlanDeployment,
    plan_document,
)
from planner.output.plan_records import (
    ExpertLayer,
    ExpertMap,
    FleetRecord,
    HandoffRecord,
    PlacedAccelerator,
    RackInstance,
    ServedRecord,
    SolverRecord,
    finite,
)
from planner.output.report import estimate_record
from planner.solver.solve import Deployment, SolveResult

__all__ = ["served_record", "solve_plan", "solve_record"]

# the figures of `estimate_record` that a deployment of a plan states in its own terms
_ESTIMATE_KEYS_REPLACED = {"layout", "accelerators", "batch_per_replica", "model", "rack", "accelerator"}


def _placed(role) -> PlacedAccelerator:
    return PlacedAccelerator(accelerator=role.accelerator, rack=role.rack, replica=role.replica, stage=role.stage, layers=tuple(role.layers),
                             tp_rank=role.tp_rank, dp_rank=role.dp_rank, ep_rank=role.ep_rank, expert_tp_rank=role.expert_tp_rank)


def _expert_map(d: Deployment) -> ExpertMap | None:
    p = d.experts
    if p is None:
        return None
    return ExpertMap(n_ranks=p.n_ranks, slots_per_rank=p.slots_per_rank, n_logical_experts=d.estimate.inputs.arch.moe.n_routed_experts,
                     method=p.method, profile=p.profile, imbalance=p.imbalance, worst_gap_to_bound=p.worst_gap_to_bound,
                     layers_proven_optimal=p.layers_proven_optimal, moves=p.moves,
                     layers=[ExpertLayer(layer=q.layer, max_load=q.max_load, mean_load=q.mean_load, lower_bound=q.lower_bound, moves=q.moves)
                             for q in p.layers],
                     physical_to_logical_map=p.physical_to_logical(d.estimate.inputs.arch))


def _deployment(d: Deployment, placement: list[PlacedAccelerator] | None) -> PlanDeployment:
    c = d.candidate
    split = c.role is not ServingRole.AGGREGATED
    figures = finite({k: v for k, v in estimate_record(d.estimate).items() if k not in _ESTIMATE_KEYS_REPLACED})
    placed = {} if placement is None else {"placement": placement}  # a plan solved without placement has no placement key
    return PlanDeployment(
        workload=c.workload, model=d.estimate.inputs.arch.id, rack=c.rack_id, accelerator=c.accelerator_id,
        tp=c.layout.tp, ep=c.layout.ep, pp=c.layout.pp, dp_attn=c.layout.dp_attn, expert_tp=c.layout.expert_tp,
        micro_batches=c.layout.pp,  # one micro-batch in flight per pipeline stage
        replicas=d.replicas, batch_per_replica=c.batch, groups_span_domains=c.spans_domains, accelerators=d.accelerators,
        accelerators_per_replica=c.accelerators,
        output_tokens_per_s=0.0 if c.role is ServingRole.PREFILL else d.output_tokens_per_s,
        input_tokens_per_s=d.replicas * c.input_tokens_per_s, usd_per_hour=d.usd_per_hour,
        usd_per_million_output_tokens_all_in=c.usd_per_million_output_tokens, batch_limit=c.batch_limit, kv_tier=c.kv_tier,
        prompt_cache_storage_usd_per_hour=d.replicas * c.storage_usd_per_hour,
        kv_handoff_bytes_per_request=c.kv_handoff_bytes if split else None,
        kv_handoff_bytes_per_s_per_replica=c.nic_bytes_per_s if split else None,
        **figures, **placed, expert_map=_expert_map(d))


def _explanation_record(result: SolveResult) -> dict | None:
    e = result.explanation
    if e is None:
        return None
    alternative = None
    if e.alternative is not None:
        alternative = {"description": e.alternative.description, "objective": e.alternative.objective,
                       "delta_fraction": e.alternative.delta_fraction, "reason": e.alternative.reason}
    return {
        "deployments": [{"workload": d.workload, "rack": d.rack, "binding": d.binding, "dominant": d.dominant} for d in e.deployments],
        "fleet": list(e.fleet),
        "racks": [{"workload": r.workload, "rack": r.rack, "best": r.best, "usd_per_million_output_tokens": r.usd_per_million_output_tokens,
                   "relative_to_chosen": r.relative_to_chosen} for r in e.racks],
        "alternative": alternative,
    }


def _infeasibility_record(result: SolveResult) -> dict | None:
    report = result.infeasibility
    if report is None:
        return None
    return {"summary": report.summary,
            "conflicts": [{"families": list(c.families), "message": c.message, "relax": list(c.relax)} for c in report.conflicts]}


def served_record(result: SolveResult, workload: str) -> ServedRecord:
    """What the plan serves for a workload: with prefill and decode pools, the smaller of what the
    decode pool makes and what the prefill pool feeds."""
    made = sum(d.output_tokens_per_s for d in result.of_workload(workload) if d.candidate.role is not ServingRole.PREFILL)
    return ServedRecord(workload=workload, **finite({
        "served_output_tokens_per_s": result.served_output_tokens_per_s(workload), "made_output_tokens_per_s": made,
        "fed_output_tokens_per_s": result.fed_output_tokens_per_s(workload),
        "demand_output_tokens_per_s": result.data.demand_tokens_per_s.get(workload)}))


def _solver_record(result: SolveResult) -> SolverRecord:
    s = result.stats
    return SolverRecord(**finite({"wall_time_s": s.wall_time_s, "total_time_s": s.total_time_s, "objective": s.objective,
                                  "best_bound": s.best_bound, "gap": s.gap}),
                        objective_unit=s.objective_unit, time_limit_s=s.time_limit_s, seed=s.seed, workers=s.workers,
                        candidates=s.n_candidates, variables=s.n_variables, constraints=s.n_constraints)


def _fleet_record(result: SolveResult) -> FleetRecord:
    racks = {}
    for rack_id, pool in result.data.pools.items():
        used = sum(d.accelerators for d in result.deployments if d.candidate.rack_id == rack_id)
        racks[rack_id] = {"racks_available": pool.count, "accelerators_per_rack": pool.domain_size, "accelerators_used": used}
    return FleetRecord(usd_per_hour=result.usd_per_hour, accelerators=result.accelerators, racks=racks)


def _racks(result: SolveResult) -> dict:
    """The fleet's rack instances as the placement saw them (no key at all in a plan without placement)."""
    if result.placement is None:
        return {}
    host_size = {rack_id: rack.host_size for rack_id, rack in result.problem.hardware.racks.items()}
    return {"racks": {name: RackInstance(accelerators=n, accelerators_per_host=host_size[name.split("#")[0]], unavailable=list(broken))
                      for name, (n, broken) in result.placement.racks.items()}}


def solve_plan(result: SolveResult) -> Plan:
    """The plan of a solve result, as `planner solve --json` writes it."""
    placements = [None] * len(result.deployments) if result.placement is None else \
        [[_placed(r) for r in result.placement.of_deployment(i)] for i in range(len(result.deployments))]
    problem_spec = result.problem.problem.model_dump(mode="json", exclude_none=True)
    return Plan(
        format=PLAN_FORMAT, format_version=PLAN_FORMAT_VERSION, problem=result.problem.name, status=result.status,
        objective_kind=str(result.problem.objective), solver=_solver_record(result), fleet=_fleet_record(result),
        served=[served_record(result, w.name) for w in result.problem.workloads if result.of_workload(w.name)],
        deployments=[_deployment(d, placed) for d, placed in zip(result.deployments, placements, strict=True)],
        explanation=finite(_explanation_record(result)), infeasibility=_infeasibility_record(result), **_racks(result),
        kv_handoff=[HandoffRecord(workload=h.workload, replica_pairs=h.pairs, pairs_in_one_domain=h.in_domain_pairs,
                                  **finite({"nic_seconds": h.nic_s, "in_domain_seconds": h.in_domain_s}))
                    for h in handoff_summary(result)],
        problem_spec=problem_spec,
        # Only a problem that names files (expert loads, config.json, a previous plan) needs its directory;
        # `planner solve --json` rewrites it relative to the plan file, so a plan carries no absolute path.
        problem_dir=str(result.problem.base_dir) if _names_files(problem_spec) else None,
        notes=list(result.notes))


def solve_record(result: SolveResult) -> dict:
    """The plan of a solve result as its JSON document (`planner solve --json`)."""
    return plan_document(solve_plan(result))


def _names_files(spec: object) -> bool:
    if isinstance(spec, dict):
        return any(k in ("file", "config_json", "previous_plan") or _names_files(v) for k, v in spec.items())
    return isinstance(spec, list) and any(_names_files(v) for v in spec)
