"""Rendering of solve results in the terminal (the plan file they make: `planner.output.plan_writer`)."""

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from planner.modes import ServingRole, SolveStatus
from planner.output.handoff import handoff_summary
from planner.output.plan_writer import served_record, solve_plan, solve_record
from planner.solver.solve import SolveResult
from planner.units import format_bytes, format_rate, format_seconds, format_usd

__all__ = ["render_solve", "solve_plan", "solve_record"]  # the writer lives in plan_writer


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
        parts = [("weights", m.weights_bytes), ("KV cache", m.kv_bytes), ("activations, buffers and the engine's KV margin", m.activations_bytes),
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
            served = served_record(result, w.name)
            if served.fed_output_tokens_per_s is not None:  # a pair of pools serves the smaller of its two rates
                console.print(f"{escape(w.name)}: serves {format_rate(served.served_output_tokens_per_s)} output tokens: the decode pool "
                              f"makes {format_rate(served.made_output_tokens_per_s)}, the prefill pool feeds "
                              f"{format_rate(served.fed_output_tokens_per_s)}")
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
