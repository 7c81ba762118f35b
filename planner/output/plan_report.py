"""Rendering of solve results: a JSON-ready record (SI units) and rich terminal output."""

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from planner.modes import ServingRole, SolveStatus
from planner.output.handoff import handoff_summary
from planner.output.report import estimate_record
from planner.solver.solve import Deployment, SolveResult
from planner.units import format_bytes, format_rate, format_seconds, format_usd

__all__ = ["deployment_record", "render_solve", "solve_record"]

_ESTIMATE_KEYS_REPLACED = {"layout", "accelerators", "batch_per_replica", "model", "rack", "accelerator"}


PLAN_FORMAT = "llm-deployment-plan"
PLAN_FORMAT_VERSION = 1


def role_record(role) -> dict:
    return {"accelerator": role.accelerator, "rack": role.rack, "replica": role.replica, "stage": role.stage,
            "layers": list(role.layers), "tp_rank": role.tp_rank, "dp_rank": role.dp_rank, "ep_rank": role.ep_rank,
            "expert_tp_rank": role.expert_tp_rank}


def expert_map_record(d: Deployment) -> dict | None:
    p = d.experts
    if p is None:
        return None
    return {
        "n_ranks": p.n_ranks,
        "slots_per_rank": p.slots_per_rank,
        "n_logical_experts": d.estimate.inputs.arch.moe.n_routed_experts,
        "method": p.method,
        "profile": p.profile,
        "imbalance": p.imbalance,
        "worst_gap_to_bound": p.worst_gap_to_bound,
        "layers_proven_optimal": p.layers_proven_optimal,
        "moves": p.moves,
        "layers": [{"layer": q.layer, "max_load": q.max_load, "mean_load": q.mean_load, "lower_bound": q.lower_bound, "moves": q.moves}
                   for q in p.layers],
        "physical_to_logical_map": p.physical_to_logical(d.estimate.inputs.arch),
    }


def deployment_record(d: Deployment) -> dict:
    c = d.candidate
    record = {
        "workload": c.workload,
        "model": d.estimate.inputs.arch.id,
        "rack": c.rack_id,
        "accelerator": c.accelerator_id,
        "tp": c.layout.tp,
        "ep": c.layout.ep,
        "pp": c.layout.pp,
        "dp_attn": c.layout.dp_attn,
        "expert_tp": c.layout.expert_tp,
        "micro_batches": c.layout.pp,  # one micro-batch in flight per pipeline stage
        "replicas": d.replicas,
        "batch_per_replica": c.batch,
        "groups_span_domains": c.spans_domains,
        "accelerators": d.accelerators,
        "accelerators_per_replica": c.accelerators,
        "output_tokens_per_s": 0.0 if c.role is ServingRole.PREFILL else d.output_tokens_per_s,
        "input_tokens_per_s": d.replicas * c.input_tokens_per_s,
        "usd_per_hour": d.usd_per_hour,
        "usd_per_million_output_tokens_all_in": c.usd_per_million_output_tokens,
        "batch_limit": c.batch_limit,
        "kv_tier": c.kv_tier,
        "prompt_cache_storage_usd_per_hour": d.replicas * c.storage_usd_per_hour,
        "kv_handoff_bytes_per_request": c.kv_handoff_bytes if c.role is not ServingRole.AGGREGATED else None,
        "kv_handoff_bytes_per_s_per_replica": c.nic_bytes_per_s if c.role is not ServingRole.AGGREGATED else None,
    }
    record.update({k: v for k, v in estimate_record(d.estimate).items() if k not in _ESTIMATE_KEYS_REPLACED})
    return record


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


def solve_record(result: SolveResult) -> dict:
    record = _solve_core(result)
    if result.placement is not None:
        for i, d in enumerate(record["deployments"]):
            d["placement"] = [role_record(r) for r in result.placement.of_deployment(i)]
        host_size = {rack_id: rack.host_size for rack_id, rack in result.problem.hardware.racks.items()}
        record["racks"] = {name: {"accelerators": n, "accelerators_per_host": host_size[name.split("#")[0]], "unavailable": list(broken)}
                           for name, (n, broken) in result.placement.racks.items()}
    for d, deployment in zip(record["deployments"], result.deployments):
        d["expert_map"] = expert_map_record(deployment)
    record["kv_handoff"] = [{"workload": h.workload, "replica_pairs": h.pairs, "pairs_in_one_domain": h.in_domain_pairs,
                             "nic_seconds": h.nic_s, "in_domain_seconds": h.in_domain_s} for h in handoff_summary(result)]
    record["problem_spec"] = result.problem.problem.model_dump(mode="json", exclude_none=True)
    # Only a problem that names files (expert loads, config.json, a previous plan) needs its directory;
    # `planner solve --json` rewrites it relative to the plan file, so a plan carries no absolute path.
    record["problem_dir"] = str(result.problem.base_dir) if _names_files(record["problem_spec"]) else None
    record["notes"] = list(result.notes)
    return record


def _names_files(spec: object) -> bool:
    if isinstance(spec, dict):
        return any(k in ("file", "config_json", "previous_plan") or _names_files(v) for k, v in spec.items())
    return isinstance(spec, list) and any(_names_files(v) for v in spec)


def _solve_core(result: SolveResult) -> dict:
    s = result.stats
    racks = {}
    for rack_id, pool in result.data.pools.items():
        used = sum(d.accelerators for d in result.deployments if d.candidate.rack_id == rack_id)
        racks[rack_id] = {"racks_available": pool.count, "accelerators_per_rack": pool.domain_size, "accelerators_used": used}
    return {
        "format": PLAN_FORMAT,
        "format_version": PLAN_FORMAT_VERSION,
        "problem": result.problem.name,
        "status": result.status,
        "objective_kind": str(result.problem.objective),
        "solver": {
            "wall_time_s": s.wall_time_s,
            "total_time_s": s.total_time_s,
            "objective": s.objective,
            "best_bound": s.best_bound,
            "gap": s.gap,
            "objective_unit": s.objective_unit,
            "time_limit_s": s.time_limit_s,
            "seed": s.seed,
            "workers": s.workers,
            "candidates": s.n_candidates,
            "variables": s.n_variables,
            "constraints": s.n_constraints,
        },
        "fleet": {"usd_per_hour": result.usd_per_hour, "accelerators": result.accelerators, "racks": racks},
        "served": [_served_record(result, w.name) for w in result.problem.workloads if result.of_workload(w.name)],
        "deployments": [deployment_record(d) for d in result.deployments],
        "explanation": _explanation_record(result),
        "infeasibility": _infeasibility_record(result),
    }


def _served_record(result: SolveResult, workload: str) -> dict:
    """What the plan serves for a workload: with prefill and decode pools, the smaller of what the
    decode pool makes and what the prefill pool feeds."""
    fed = result.fed_output_tokens_per_s(workload)
    made = sum(d.output_tokens_per_s for d in result.of_workload(workload) if d.candidate.role is not ServingRole.PREFILL)
    return {"workload": workload, "served_output_tokens_per_s": result.served_output_tokens_per_s(workload),
            "made_output_tokens_per_s": made, "fed_output_tokens_per_s": fed,
            "demand_output_tokens_per_s": result.data.demand_tokens_per_s.get(workload)}


def expert_lines(result: SolveResult) -> list[str]:
    """One line per deployment with an expert map: slots, balance, gap to the bound, profile, moves."""
    lines = []
    previous_plan = result.problem.placement.previous_plan
    for d in result.deployments:
        p = d.experts
        if p is None:
            continue
        n_experts = d.estimate.inputs.arch.moe.n_routed_experts
        worst = max(p.layers, key=lambda q: q.imbalance)
        lines.append(
            f"{d.candidate.workload} on {d.candidate.rack_id}: {p.n_ranks} ranks x {p.slots_per_rank} slots "
            f"({n_experts} experts + {p.n_ranks * p.slots_per_rank - n_experts} redundant copies) for {len(p.layers)} MoE layers; "
            f"max/mean load {p.imbalance:.4f} over the step (worst layer {worst.layer}: {worst.imbalance:.4f}), "
            f"worst gap to the bound {p.worst_gap_to_bound:.2%} ({p.layers_proven_optimal} layers proven optimal); "
            f"{p.method} in {p.time_s:.2f} s; profile: {p.profile or 'uniform'}"
            + ("" if p.moves is None else f"; {p.moves} expert copies to load from the previous plan "
               f"(at most {max(q.moves for q in p.layers)} in one layer)")
            + ("" if p.moves is not None or previous_plan is None else
               f"; the previous plan has no {d.estimate.inputs.arch.id} map of {p.n_ranks} ranks x {p.slots_per_rank} slots: placed afresh"))
    return lines


def hbm_lines(result: SolveResult) -> list[str]:
    """HBM use of each deployment's fullest accelerator: what fills it and how much is left."""
    lines = []
    for d in result.deployments:
        c, m = d.candidate, d.estimate.memory
        role = "" if c.role is ServingRole.AGGREGATED else f"{c.role} "
        parts = [("weights", m.weights_bytes), ("KV cache", m.kv_bytes), ("activations and buffers", m.activations_bytes),
                 ("prompt cache", m.prompt_cache_bytes)]
        lines.append(f"{c.workload} on {c.rack_id} ({role}{c.layout.name}): {format_bytes(m.used_bytes)} of "
                     f"{format_bytes(m.capacity_bytes)} ({m.fill_fraction:.0%}): "
                     + ", ".join(f"{name} {format_bytes(value)}" for name, value in parts if value > 0))
    return lines


def _plan_table(result: SolveResult) -> Table:
    table = Table(title="Plan", title_justify="left")
    for name in ("workload", "rack", "layout", "batch", "replicas", "accel.", "TPOT", "TTFT", "tok/s", "$/h", "$/M out", "binds", "dominant"):
        table.add_column(name, justify="left" if name in ("workload", "rack", "layout", "binds", "dominant") else "right")
    for d in result.deployments:
        c, e = d.candidate, d.estimate
        layout = c.layout.name + (f" + MTP{c.draft_tokens}" if c.draft_tokens else "")
        if c.role is ServingRole.PREFILL:
            table.add_row(c.workload, c.rack_id, f"prefill: {layout}", "-", str(d.replicas), str(d.accelerators), "-",
                          format_seconds(e.ttft_s), f"in {format_rate(d.replicas * c.input_tokens_per_s)}", format_usd(d.usd_per_hour),
                          format_usd(c.usd_per_million_output_tokens), c.batch_limit, e.prefill_chunk_step.dominant_term)
            continue
        ttft = result.workload_ttft_s(c.workload) if c.role is ServingRole.DECODE else e.ttft_s
        table.add_row(c.workload, c.rack_id, (f"decode: {layout}" if c.role is ServingRole.DECODE else layout), str(c.batch),
                      str(d.replicas), str(d.accelerators), format_seconds(e.tpot_s), format_seconds(ttft),
                      f"out {format_rate(d.output_tokens_per_s)}", format_usd(d.usd_per_hour),
                      format_usd(c.usd_per_million_output_tokens), c.batch_limit, e.serving_step.dominant_term)
    return table


def render_solve(result: SolveResult, console: Console) -> None:
    s = result.stats
    head = f"[bold]{escape(result.problem.name)}[/bold]: {result.status}"
    if s.objective is not None:
        head += f", objective {s.objective:.6g} {s.objective_unit} (bound {s.best_bound:.6g}, gap {s.gap:.2%})"
    head += f"; {s.n_candidates} candidates, solved in {s.wall_time_s:.2f} s (total {s.total_time_s:.2f} s, seed {s.seed}, {s.workers} workers)"
    console.print(head)
    if result.status is SolveStatus.FEASIBLE:
        console.print(f"Not proven optimal within the {s.time_limit_s:g} s limit: the optimum is at most {s.gap:.3%} better than "
                      "this plan; a longer --time-limit (solver.time_limit_s) may prove it or find a better one.")
    if result.has_plan:
        console.print(_plan_table(result))
        console.print(f"Fleet: {result.accelerators} accelerators, {format_usd(result.usd_per_hour)}/h "
                      "(prices are catalog estimates unless the problem overrides them)")
        console.print("HBM per accelerator (the fullest of each replica)")
        for line in hbm_lines(result):
            console.print(f"  - {escape(line)}")
        for w in result.problem.workloads:
            served = _served_record(result, w.name)
            if served["fed_output_tokens_per_s"] is not None:  # a pair of pools serves the smaller of its two rates
                console.print(f"{escape(w.name)}: serves {format_rate(served['served_output_tokens_per_s'])} output tokens: the decode pool "
                              f"makes {format_rate(served['made_output_tokens_per_s'])}, the prefill pool feeds "
                              f"{format_rate(served['fed_output_tokens_per_s'])}")
        if result.explanation is not None:
            console.print("[bold]Why this plan[/bold]")
            for line in result.explanation.lines():
                console.print(f"  - {escape(line)}")
        for h in handoff_summary(result):
            console.print(f"  - {escape(h.workload)}: KV hand-off {format_seconds(h.nic_s)} per request over the NICs (the TTFT bound); "
                          f"{h.in_domain_pairs} of {h.pairs} prefill-decode replica pairs share a scale-up domain"
                          + (f", where it takes {format_seconds(h.in_domain_s)}" if h.in_domain_s is not None else ""))
        lines = expert_lines(result)
        if lines:
            console.print("[bold]Expert placement[/bold] (load per expert-parallel rank; bound = max(mean, hottest copy))")
            for line in lines:
                console.print(f"  - {escape(line)}")
    if result.infeasibility is not None:
        console.print(f"[red bold]No plan:[/red bold] {escape(result.infeasibility.summary)}")
        for conflict in result.infeasibility.conflicts:
            console.print(f"  - {escape(conflict.message)}")
            for fix in conflict.relax:
                console.print(f"      relax: {escape(fix)}")
