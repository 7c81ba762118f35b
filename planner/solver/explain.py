"""Why a plan is what it is: the constraint that binds each deployment, the roofline term that
dominates its step, what binds the fleet, and the best rejected alternative with why it lost."""

import math
from dataclasses import replace

from planner.modes import ServingMode, ServingRole
from planner.physics.cost import usd_per_million_tokens
from planner.problem.resolve import ResolvedWorkload
from planner.solver.candidates import Candidate
from planner.solver.findings import (
    TIE_FRACTION,
    Alternative,
    DeploymentExplanation,
    PlanExplanation,
    RackComparison,
)
from planner.solver.result import Deployment, SolveResult
from planner.solver.search import solve_data
from planner.units import (
    SECONDS_PER_HOUR,
    format_bytes,
    format_rate,
    format_seconds,
    format_usd,
)

__all__ = ["Alternative", "DeploymentExplanation", "PlanExplanation", "RackComparison", "explain_plan"]

EXPLAIN_SHARE = 0.2  # of the plan's time limit, for each comparison solve (other serving mode, runner-up)
EXPLAIN_MIN_S = 1.0

LIMIT_SENTENCES = {
    "hbm": "HBM capacity binds: batch {batch} is the largest whose weights, KV cache and activations fit",
    "tpot": "the TPOT limit binds: batch {batch} is the largest that decodes within {limit}",
    "ttft": "the TTFT limit binds: batch {batch} is the largest whose 90th-percentile TTFT (waiting plus prefill) stays within {limit}",
    "max_batch": "the batch cap binds: batch {batch} is solver.max_batch_per_replica",
    "ladder": "a smaller batch than the largest feasible one, chosen for latency",
    "pairing": "batch {batch}, below the largest feasible one, so that {pairing}",
    "peak": "batch {batch} makes the most tokens per second: larger batches meet the limits but slow each step more than they add",
    "nic": "the NICs bind: batch {batch} is the largest whose requests' KV caches the replica's scale-out links can receive",
    "prefill": "a prefill replica with {prompts} per pass{full}: {rate} prompt tokens, a first token after {latency} on average",
}

def _pairing_reason(w) -> str:
    """Why a decode replica runs below its largest feasible batch (pair_batches): with a demand, only
    for its pairs' TTFT; without one, also so that the prefill replicas the racks hold keep it fed."""
    ttft = "its requests' TTFT (prefill, KV hand-off, joining a decode step) stays within the limit"
    fed = "the prefill replicas the racks hold keep it fed"
    if w.output_tokens_per_s is not None:
        return ttft
    return fed if w.ttft_limit_s is None else f"{fed}, or {ttft}"


TERM_NAMES = {"compute": "compute", "weights": "weight fetch", "kv": "KV fetch", "comm": "communication",
              "overhead": "kernel floors and elementwise work"}


def _dominant_sentence(step, what: str) -> str:
    """The largest term with its share, and the roofline side in words that cannot contradict it."""
    terms = {"compute": step.compute_s, "weights": step.weights_s, "kv": step.kv_s, "comm": step.comm_s, "overhead": step.overhead_s}
    top = step.dominant_term
    head = f"{TERM_NAMES[top]} is the largest term of {what} ({terms[top] / step.total_s:.0%} of {format_seconds(step.total_s)})"
    if top == "compute" and step.bound == "memory":
        return head + "; weight and KV fetch together take longer, so the step is memory-bound"
    if top in ("comm", "overhead"):
        return head + f"; of compute and memory traffic, {'compute' if step.bound == 'compute' else 'memory'} takes longer"
    return head + f" ({step.bound}-bound)"


def _deployment(result: SolveResult, d: Deployment) -> DeploymentExplanation:
    c, e = d.candidate, d.estimate
    w = next(w for w in result.problem.workloads if w.name == c.workload)
    limit = {"tpot": w.tpot_limit_s, "ttft": w.ttft_limit_s}.get(c.batch_limit)
    kind = "prefill" if c.role is ServingRole.PREFILL and c.batch_limit in ("ladder", "prefill") else c.batch_limit
    binding = LIMIT_SENTENCES[kind].format(batch=c.batch, limit=format_seconds(limit) if limit else "",
                                           prompts=f"{c.batch} prompt" + ("s" if c.batch != 1 else ""),
                                           full=" (full passes)" if c.batch_limit == "prefill" else "",
                                           rate=format_rate(c.input_tokens_per_s), latency=format_seconds(e.ttft_s),
                                           pairing=_pairing_reason(w))
    prefill = c.role is ServingRole.PREFILL
    step = e.prefill_chunk_step if prefill else e.serving_step
    dominant = _dominant_sentence(step, "a prefill pass" if prefill else "the decode step")
    rack = c.rack_id if c.role is ServingRole.AGGREGATED else f"{c.rack_id} ({c.role})"
    if c.kv_tier is not None:
        held = e.prompt_cache_bytes_per_accelerator
        dominant += (f"; its prompt cache ({format_bytes(held)} per accelerator) waits in {c.kv_tier}"
                     + (f" for {format_usd(c.storage_usd_per_hour * d.replicas)}/h" if c.storage_usd_per_hour else ""))
    elif w.prefix_cache is not None and c.role is not ServingRole.DECODE:
        dominant += "; no prompt cache: recomputing the prefix is cheaper than holding it in any tier that fits"
    if c.layout.pp > 1:
        dominant += "; " + _why_pipeline(result, c)
    return DeploymentExplanation(c.workload, rack, binding, dominant)


def _why_pipeline(result: SolveResult, c: Candidate) -> str:
    """Why a layout has pipeline stages: the weights do not fit one scale-up domain, or (said as
    plainly) the stages are cheaper per token than every single-stage layout here."""
    from planner.solver.infeasibility import weights_bytes

    rack = result.problem.hardware.racks[c.rack_id]
    domain = rack.n_accelerators * rack.accelerator.hbm_capacity_bytes
    weights = weights_bytes(result, c.workload)
    if weights > domain:
        return (f"{c.layout.pp} pipeline stages because the weights ({format_bytes(weights)}) exceed the HBM of one {c.rack_id} "
                f"({format_bytes(domain)})")
    single = [o for o in result.data.candidates if o.workload == c.workload and o.rack_id == c.rack_id and o.role is c.role
              and o.layout.pp == 1]
    if not single:
        return f"{c.layout.pp} pipeline stages: no single-stage layout on {c.rack_id} meets the limits with room for a KV cache"
    best = min(single, key=lambda o: o.usd_per_million_output_tokens)
    return (f"{c.layout.pp} pipeline stages although the weights fit one {c.rack_id}: the best single-stage layout costs "
            f"{format_usd(best.usd_per_million_output_tokens)}/M output tokens, "
            f"{best.usd_per_million_output_tokens / c.usd_per_million_output_tokens - 1:+.0%} against this one")


def _modes(result: SolveResult, time_limit_s: float, seed: int, workers: int) -> list[str]:
    """For workloads whose serving mode the solver chose: the other mode's best plan and the margin."""
    lines = []
    for w in result.problem.workloads:
        if w.serving != ServingMode.AUTO:
            continue
        split = result.is_split(w.name)
        data = replace(result.data, forced_split={**result.data.forced_split, w.name: not split})
        raw = solve_data(data, time_limit_s=time_limit_s, seed=seed, workers=workers, canonical=False)
        won, lost = ("disaggregated (prefill and decode pools)", "aggregated") if split else ("aggregated", "disaggregated")
        if raw.objective is None:
            lines.append(f"{w.name}: {won} serving; {lost} serving has no feasible plan here")
            continue
        base = result.stats.objective
        delta = (raw.objective - base) / abs(base) if base else math.inf
        lines.append(f"{w.name}: {won} serving wins; {lost} would cost {raw.objective:.6g} {result.stats.objective_unit} "
                     f"({delta:+.1%})")
    return lines


def _fleet(result: SolveResult) -> list[str]:
    """Fleet-level limits that bind: rack types fully used, demands met with little slack."""
    lines = []
    for rack_id, pool in result.data.pools.items():
        used = sum(d.accelerators for d in result.deployments if d.candidate.rack_id == rack_id)
        if pool.count is not None and used:
            total = pool.count * pool.domain_size - sum(len(b) for b in pool.broken)
            down = f" ({sum(len(b) for b in pool.broken)} unavailable)" if pool.broken else ""
            state = "all in use (the rack budget binds)" if used == total else f"{used} of {total} available accelerators in use"
            state += down
            lines.append(f"{rack_id}: {state}")
    for w in result.problem.workloads:
        if w.output_tokens_per_s is None:
            lines.extend(_room_for_replicas(result, w.name))
            continue
        served = result.served_output_tokens_per_s(w.name)
        line = (f"{w.name}: serves {format_rate(served)} output tokens for a demand of {format_rate(w.output_tokens_per_s)} "
                f"({served / w.output_tokens_per_s - 1:+.0%} headroom from whole replicas)")
        fed = result.fed_output_tokens_per_s(w.name)
        if fed is not None:  # a pair of pools serves the smaller of its two rates
            made = sum(d.output_tokens_per_s for d in result.of_workload(w.name, ServingRole.DECODE))
            line += (f"; the decode pool makes {format_rate(made)}, the prefill pool feeds {format_rate(fed)}: "
                     f"the {'prefill' if fed < made else 'decode'} pool sets the rate")
        lines.append(line)
    return lines


def _room_for_replicas(result: SolveResult, workload: str) -> list[str]:
    """Without a demand the plan has one replica per workload; say how many the fleet could hold."""
    lines = []
    for d in result.deployments:
        c = d.candidate
        pool = result.data.pools[c.rack_id]
        if c.workload != workload or pool.count is None or c.stage_size > pool.domain_size or c.role is not ServingRole.AGGREGATED:
            continue
        per_rack = pool.domain_size // c.stage_size
        replicas = pool.count * per_rack // c.stages
        lines.append(f"{workload}: one replica is planned (cost per token does not depend on the count); "
                     f"{pool.count} x {c.rack_id} {'holds' if pool.count == 1 else 'hold'} {replicas} such "
                     f"{'replica' if replicas == 1 else 'replicas'}, {format_rate(replicas * c.output_tokens_per_s)} output tokens")
    return lines


def _racks(result: SolveResult) -> list[RackComparison]:
    """For every workload and rack type, the cheapest layout per token and how it compares."""
    comparisons = []
    for w in result.problem.workloads:
        chosen = [d for d in result.deployments if d.candidate.workload == w.name]
        tokens = result.served_output_tokens_per_s(w.name)
        reference = usd_per_million_tokens(sum(d.usd_per_hour for d in chosen) / SECONDS_PER_HOUR, tokens) if tokens else None  # the plan's blended $/M
        for (workload, rack_id), analysis in result.analyses.items():
            if workload != w.name:
                continue
            if not analysis.candidates:
                reasons = ", ".join(f"{k}: {n} layouts" for k, n in sorted(analysis.rejected.items())) or "no valid layout"
                comparisons.append(RackComparison(w.name, rack_id, f"no layout is feasible ({reasons})", None, None))
                continue
            best = _best_per_token(analysis.candidates)
            if best is None:
                comparisons.append(RackComparison(w.name, rack_id, "only one of the prefill and decode roles fits", None, None))
                continue
            text, cost, candidate = best
            relative = cost / reference if reference else None
            why = _ruled_out(result, w, candidate, chosen) if relative is not None and relative < 1 - 1e-9 else ""
            comparisons.append(RackComparison(w.name, rack_id, text, cost, relative, why))
    return comparisons


def _ruled_out(result: SolveResult, workload: ResolvedWorkload, candidate: Candidate | tuple[Candidate, Candidate],
               chosen: list[Deployment]) -> str:
    """Why a layout cheaper per token than the plan was not used: whole replicas round the demand up,
    the fleet's racks cannot hold enough of them, or (without a demand) the pairing of pools."""
    demand = result.data.demand_tokens_per_s.get(workload.name)
    plan_usd_per_hour = sum(d.usd_per_hour for d in chosen)
    parts = candidate if isinstance(candidate, tuple) else (candidate,)
    if demand is None:
        pair = " or its prefill-decode pairing breaks the TTFT limit" if len(parts) > 1 else ""
        return f"its replicas do not fit the fleet's racks beside the other workloads{pair}"
    counts = [math.ceil(demand / c.output_tokens_per_s) for c in parts]
    fleet = sum(n * c.usd_per_hour for n, c in zip(counts, parts, strict=True))
    if fleet >= plan_usd_per_hour * (1 - 1e-9):
        what = " + ".join(f"{n} x {format_rate(c.output_tokens_per_s)}" for n, c in zip(counts, parts, strict=True))
        return (f"whole replicas round the demand up: {what} for {format_rate(demand)} costs {format_usd(fleet)}/h "
                f"against the plan's {format_usd(plan_usd_per_hour)}/h")
    accelerators = sum(n * c.accelerators for n, c in zip(counts, parts, strict=True))
    pair = " (or its prefill-decode pairing breaks the TTFT limit)" if len(parts) > 1 else ""
    return f"{accelerators} accelerators at {format_usd(fleet)}/h do not fit the fleet's racks beside the other deployments{pair}"


def _best_per_token(candidates: list[Candidate]) -> tuple[str, float, Candidate | tuple[Candidate, Candidate]] | None:
    """The cheapest way per output token to serve a workload on one rack type: an aggregated
    candidate, or the cheapest prefill plus the cheapest decode candidate (their pairing TTFT aside)."""
    options = []
    for c in candidates:
        if c.role is ServingRole.AGGREGATED:
            mtp = f", MTP {c.draft_tokens} draft tokens" if c.draft_tokens else ""
            options.append((c.usd_per_million_output_tokens, f"{c.layout.describe()}, batch {c.batch}{mtp} ({c.batch_limit}-bound)", c))
    prefill = [c for c in candidates if c.role is ServingRole.PREFILL]
    decode = [c for c in candidates if c.role is ServingRole.DECODE]
    if prefill and decode:
        p = min(prefill, key=lambda c: (c.usd_per_million_output_tokens, c.sort_key()))
        q = min(decode, key=lambda c: (c.usd_per_million_output_tokens, c.sort_key()))
        options.append((p.usd_per_million_output_tokens + q.usd_per_million_output_tokens,
                        (f"prefill {p.layout.describe()} + decode {q.layout.describe()}, batch {q.batch}"
                         f"{f', MTP {q.draft_tokens} draft tokens' if q.draft_tokens else ''} ({q.batch_limit}-bound)"), (p, q)))
    if not options:
        return None
    cost, text, candidate = min(options, key=lambda o: (o[0], o[1]))
    return text, cost, candidate


def _replicas_of(c: Candidate, replicas: int) -> str:
    """"3 replicas of gb200-nvl72 TP2 (2 accelerators each), batch 26": the count is of replicas, not racks."""
    role = "" if c.role is ServingRole.AGGREGATED else f"{c.role} "
    mtp = f", MTP {c.draft_tokens} draft tokens" if c.draft_tokens else ""
    n = c.layout.n_accelerators
    return (f"{replicas} {role}replica{'s' if replicas != 1 else ''} of {c.rack_id} {c.layout.name} "
            f"({n} accelerator{'s' if n != 1 else ''} each), batch {c.batch}{mtp},")


def _alternative(result: SolveResult, time_limit_s: float, seed: int, workers: int) -> Alternative | None:
    """The best plan that does not use exactly the chosen set of candidates."""
    chosen = frozenset(j for j, c in enumerate(result.data.candidates)
                       if any(d.candidate == c for d in result.deployments))
    if not chosen:
        return None
    data = replace(result.data, excluded=result.data.excluded + (chosen,))
    raw = solve_data(data, time_limit_s=time_limit_s, seed=seed, workers=workers)
    if raw.objective is None:
        return Alternative("none", None, None, "no other combination of deployments meets the constraints")
    picked = [f"{_replicas_of(data.candidates[j], r)} for {data.candidates[j].workload}" for j, r in sorted(raw.chosen.items())]
    base = result.stats.objective
    delta = (raw.objective - base) / abs(base) if base else math.inf
    unit = result.stats.objective_unit
    reason = f"objective {raw.objective:.6g} {unit} vs {base:.6g}, {delta:+.1%}"
    if abs(delta) < TIE_FRACTION:
        reason = f"the same objective, {base:.6g} {unit}"
    return Alternative("; ".join(picked), raw.objective, delta, reason)


def explain_plan(result: SolveResult, *, time_limit_s: float, seed: int, workers: int) -> PlanExplanation:
    # Each comparison solve gets a fifth of the plan's limit (at least 1 s): a fixed share, so that the
    # explanation stays deterministic and a large fleet's runner-up search does not double the command's time.
    time_limit_s = min(time_limit_s, max(EXPLAIN_MIN_S, EXPLAIN_SHARE * time_limit_s))
    return PlanExplanation(
        deployments=tuple(_deployment(result, d) for d in result.deployments),
        fleet=tuple(_fleet(result) + _modes(result, time_limit_s, seed, workers)),
        racks=tuple(_racks(result)),
        alternative=_alternative(result, time_limit_s, seed, workers),
    )
