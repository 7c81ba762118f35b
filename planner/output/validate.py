"""Check and score a plan independently of the solver.

`check_plan` re-derives every figure of a plan (`planner.output.plan.Plan`, what `planner solve
--json` writes) from the problem and the roofline, and reports what does not hold: invalid layouts, HBM overflow, broken
latency limits, unmet demand, racks over-subscribed, figures that differ from the recomputation
(a hand-edited or stale plan). `score_plan` recomputes the fleet's cost and throughput.
"""

import itertools
import math
from dataclasses import dataclass

import numpy as np

from planner.model.architecture import kv_bytes_per_request
from planner.modes import ServingRole
from planner.output.plan import Plan, PlanDeployment, as_plan
from planner.output.plan_records import ExpertMap
from planner.physics.deployment import Layout
from planner.physics.estimate import estimate
from planner.physics.inputs import (
    DeploymentInputs,
    ExpertFigures,
    deployment_inputs,
    deployment_issues,
)
from planner.physics.kv_cache import cache_use
from planner.placement.groups import expert_groups_local, ranks_per_domain
from planner.problem.resolve import ResolvedProblem

__all__ = ["PlanScore", "Violation", "check_plan", "deployment_inputs_of", "score_plan"]

RELATIVE_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Violation:
    field: str
    problem: str

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}"


@dataclass(frozen=True)
class PlanScore:
    usd_per_hour: float
    accelerators: int
    output_tokens_per_s: dict[str, float]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-12)


def _inputs(resolved: ResolvedProblem, d: PlanDeployment, where: str, out: list[Violation]) -> DeploymentInputs | None:
    workloads = {w.name: w for w in resolved.workloads}
    w = workloads.get(d.workload)
    if w is None:
        out.append(Violation(f"{where}.workload", f"unknown workload {d.workload!r}"))
        return None
    rack = resolved.hardware.racks.get(d.rack)
    if rack is None:
        out.append(Violation(f"{where}.rack", f"unknown rack {d.rack!r}"))
        return None
    model = resolved.models[w.model_key]
    if d.model != model.arch.id:
        out.append(Violation(f"{where}.model", f"workload {w.name} serves {model.arch.id}, not {d.model!r}"))
    layout = d.layout
    if layout.stage_size > rack.n_accelerators and not resolved.allow_spanning_domains:
        out.append(Violation(f"{where}", f"a stage of {layout.stage_size} accelerators spans {rack.id} domains of "
                                         f"{rack.n_accelerators}, and the problem does not allow spanning"))
    precisions = d.precisions.as_precisions()
    issues = deployment_issues(model.arch, layout, d.batch_per_replica, precisions, field=where)
    out.extend(Violation(i.field, i.problem) for i in issues)
    if issues:
        return None
    imbalance, redundant = _expert_figures(resolved, model, layout, d.expert_map, where, out)
    experts = ExpertFigures(imbalance, redundant, routing="balanced" if model.expert_loads is not None else None,  # as the solver evaluates it
                            groups_local=_groups_local(model.arch, layout, rack, d.expert_map))
    role = d.role
    if role not in w.roles:
        out.append(Violation(f"{where}.role", f"{role} replicas, but workload {w.name} is served '{w.serving}'"))
    return deployment_inputs(model.arch, rack, layout, d.batch_per_replica, (w.input_tokens, w.output_tokens), precisions,
                             resolved.hardware.overheads, resolved.serving, notes=model.precision_notes(rack.accelerator, precisions),
                             role=role, prefix_cache=_cache(w, d, rack, where, out), speculative=_speculative(w, d, role, where, out),
                             experts=experts, field=where)


def _speculative(w, d: PlanDeployment, role: ServingRole, where: str, out: list[Violation]):
    """The deployment's speculative decoding, re-derived from its workload: the plan names only its draft tokens."""
    k = d.draft_tokens
    request = w.speculative
    if request is None:
        if d.speculative is not None:
            out.append(Violation(f"{where}.speculative", f"workload {w.name} does not ask for speculative decoding"))
        return None
    if role is not ServingRole.PREFILL and k not in request.options:
        out.append(Violation(f"{where}.speculative.draft_tokens", f"{k} draft tokens; workload {w.name} allows {list(request.options)}"))
    return request.speculation(k, role)


def _groups_local(arch, layout: Layout, rack, emap: ExpertMap | None) -> bool:
    """Whether the plan's expert map keeps every expert group inside one scale-up domain (without a
    map, an engine's contiguous default is assumed, as in estimate)."""
    if emap is None or not arch.is_moe:
        return True
    try:
        slots, rows = emap.slots_per_rank, emap.physical_to_logical_map
        layers = [[rows[i][r * slots:(r + 1) * slots] for r in range(layout.ep)] for i, moe in enumerate(arch.layer_is_moe) if moe]
        return expert_groups_local(arch, layout.ep, ranks_per_domain(rack.n_accelerators, layout.ep, layout.stage_size), layers)
    except (KeyError, IndexError, TypeError, ValueError):  # a malformed map is reported by the expert-map checks
        return True


def _expert_figures(resolved: ResolvedProblem, model, layout: Layout, emap: ExpertMap | None, where: str,
                    out: list[Violation]) -> tuple[float, int]:
    """Check an expert map and derive from it the redundant copies per rank and the load imbalance
    it gives on the model's load profile (uniform when the problem gives none); with a previous plan
    and a move budget, the copies each layer loads onto a rank that did not hold them."""
    arch = model.arch
    if not arch.is_moe or layout.ep == 1:
        return 1.0, 0
    if emap is None:
        out.append(Violation(f"{where}.expert_map", f"missing: {arch.id} spreads its experts over {layout.ep} ranks"))
        return 1.0, 0
    n_experts, ranks, slots = arch.moe.n_routed_experts, emap.n_ranks, emap.slots_per_rank
    if ranks != layout.ep or slots < n_experts // ranks:
        out.append(Violation(f"{where}.expert_map", f"{ranks} ranks x {slots} slots cannot hold {n_experts} experts on ep={layout.ep}"))
        return 1.0, 0
    rows = emap.physical_to_logical_map
    loads = model.expert_loads if model.expert_loads is not None else np.ones((arch.n_moe_layers, n_experts))
    moe_layers = [i for i, moe in enumerate(arch.layer_is_moe) if moe]
    if len(rows) != arch.n_layers:
        out.append(Violation(f"{where}.expert_map.physical_to_logical_map", f"{len(rows)} rows for {arch.n_layers} layers"))
        return 1.0, 0
    max_sum = mean_sum = 0.0
    previous = resolved.previous_expert_map(arch.id, ranks, slots)
    budget = resolved.placement.max_expert_moves_per_layer
    for k, layer in enumerate(moe_layers):
        row = rows[layer]
        field = f"{where}.expert_map.physical_to_logical_map[{layer}]"
        if len(row) != ranks * slots or any(not 0 <= e < n_experts for e in row):
            out.append(Violation(field, f"needs {ranks * slots} expert ids in 0..{n_experts - 1}"))
            continue
        missing = sorted(set(range(n_experts)) - set(row))
        if missing:
            out.append(Violation(field, f"experts {missing[:8]}{'...' if len(missing) > 8 else ''} are not placed"))
        rank_slices = [row[r * slots:(r + 1) * slots] for r in range(ranks)]
        if previous is not None and budget is not None:
            moves = sum(len(set(rank_slices[r]) - set(previous[layer][r * slots:(r + 1) * slots])) for r in range(ranks))
            if moves > budget:
                out.append(Violation(field, f"loads {moves} expert copies onto ranks that did not hold them; "
                                            f"placement.max_expert_moves_per_layer is {budget}"))
        for r, experts in enumerate(rank_slices):
            if len(set(experts)) != len(experts):
                out.append(Violation(field, f"rank {r} holds an expert twice"))
        copies = np.bincount(row, minlength=n_experts).clip(min=1)
        rank_loads = [sum(loads[k][e] / copies[e] for e in experts) for experts in rank_slices]
        max_sum += max(rank_loads)
        mean_sum += sum(rank_loads) / ranks
    return (max_sum / mean_sum if mean_sum else 1.0), slots - n_experts // ranks


@dataclass(frozen=True)
class _Checked:
    """What one deployment contributes to its workload, recomputed."""

    role: ServingRole
    output_tokens_per_s: float  # made (aggregated, decode) or fed by its prompts (prefill), all replicas
    ttft_p90_s: float
    handoff_bytes: float  # a request's prompt KV cache
    nic_bytes_per_s: float  # one replica's achievable scale-out bandwidth


def _cache(w, d: PlanDeployment, rack, where: str, out: list[Violation]):
    """The prompt cache a plan entry says it uses, checked against the workload's request."""
    tier = d.kv_tier
    if tier is None:
        return None
    if w.prefix_cache is None:
        out.append(Violation(f"{where}.kv_tier", f"{tier!r}, but workload {w.name} declares no prefix_cache"))
        return None
    if not w.prefix_cache.allows(tier):
        out.append(Violation(f"{where}.kv_tier", f"{tier!r}, but the workload asks for {w.prefix_cache.tier!r}"))
    try:
        return cache_use(w.prefix_cache, tier, rack.accelerator)
    except ValueError as exc:
        out.append(Violation(f"{where}.kv_tier", str(exc)))
        return None


deployment_inputs_of = _inputs  # a deployment's inputs as the checker derives them (the export's engine note re-derives them)


def _check_deployment(resolved: ResolvedProblem, d: PlanDeployment, where: str, out: list[Violation]) -> _Checked | None:
    """Checks of one deployment; returns what it contributes to its workload."""
    inp = _inputs(resolved, d, where, out)
    if inp is None:
        return None
    e = estimate(inp)
    w = next(w for w in resolved.workloads if w.name == d.workload)
    if not e.memory.fits:
        out.append(Violation(where, f"needs {e.memory.used_bytes:.4g} B of HBM per accelerator, {inp.rack.accelerator.id} has "
                                    f"{e.memory.capacity_bytes:.4g} B"))
    if inp.role is not ServingRole.PREFILL and w.tpot_limit_s is not None and e.tpot_s > w.tpot_limit_s * (1 + RELATIVE_TOLERANCE):
        out.append(Violation(where, f"TPOT {e.tpot_s:.4g} s exceeds the limit {w.tpot_limit_s:.4g} s"))
    if inp.role is ServingRole.AGGREGATED and w.ttft_limit_s is not None and e.ttft_p90_s > w.ttft_limit_s * (1 + RELATIVE_TOLERANCE):
        out.append(Violation(where, f"TTFT {e.ttft_p90_s:.4g} s (90th percentile) exceeds the limit {w.ttft_limit_s:.4g} s"))
    for name, stated, value in (("tpot_s", d.tpot_s, e.tpot_s), ("ttft_s", d.ttft_s, e.ttft_s),
                                ("output_tokens_per_s_per_accelerator", d.output_tokens_per_s_per_accelerator, e.output_tokens_per_s_per_accelerator)):
        if stated is not None and not _close(float(stated), value):
            out.append(Violation(f"{where}.{name}", f"says {stated:.6g}, the roofline gives {value:.6g}"))
    if (d.accelerators or 0) != d.replicas * inp.layout.n_accelerators:
        out.append(Violation(f"{where}.accelerators", f"{d.accelerators} != replicas x {inp.layout.n_accelerators}"))
    accel = inp.rack.accelerator
    handoff = kv_bytes_per_request(inp.arch, inp.prefilled_tokens, inp.precisions.kv_bytes)
    nic = inp.layout.n_accelerators * accel.achievable_scale_out_bytes_per_s
    if inp.role is ServingRole.DECODE and e.requests_per_s * handoff > nic * (1 + RELATIVE_TOLERANCE):
        out.append(Violation(where, f"receives {e.requests_per_s * handoff:.4g} B/s of KV caches, its NICs carry {nic:.4g} B/s"))
    return _Checked(inp.role, d.replicas * w.output_tokens / e.replica_seconds_per_request, e.ttft_p90_s, handoff, nic)


def _check_racks(resolved: ResolvedProblem, deployments: list[PlanDeployment], out: list[Violation]) -> None:
    """First-fit-decreasing placement of every pipeline stage into the fleet's racks, each rack with
    its available accelerators (a necessary condition; `placement` checks the concrete blocks)."""
    for rack, count in resolved.rack_counts:
        if count is None:
            continue
        stages = []
        for d in deployments:
            if d.rack == rack.id:
                stages += [d.stage_size] * (d.replicas * d.pp)
        whole = sum(math.ceil(s / rack.n_accelerators) for s in stages if s > rack.n_accelerators)
        broken = resolved.unavailable.get(rack.id, {})
        perfect = [i for i in range(count) if not broken.get(i)]
        fits = whole <= len(perfect)  # a stage of whole racks needs racks with every accelerator available
        kept = set(perfect[whole:]) | {i for i in range(count) if broken.get(i)}
        free = [rack.n_accelerators - len(broken.get(i, ())) for i in sorted(kept)]
        for size in sorted((s for s in stages if s <= rack.n_accelerators), reverse=True):
            slot = next((i for i, room in enumerate(free) if room >= size), None) if fits else None
            if slot is None:
                fits = False
                break
            free[slot] -= size
        if not fits:
            down = sum(len(b) for b in broken.values())
            out.append(Violation(f"racks[{rack.id}]", f"the plan's {len(stages)} pipeline stages ({sum(stages)} accelerators) do not "
                                                      f"fit {count} x {rack.id}" + (f" with {down} accelerators unavailable" if down else "")))


def _parse_node(name: str) -> tuple[str, int, int] | None:
    rack_id, _, rest = str(name).partition("#")
    instance, _, index = rest.partition("/")
    return (rack_id, int(instance), int(index)) if instance.isdigit() and index.isdigit() else None


def _check_roles(d: PlanDeployment, where: str, rack, n_layers: int, out: list[Violation]) -> None:
    """Ranks follow from positions; stages sit in one rack; layer ranges partition the model."""
    tp, ep, pp = d.tp, d.ep, d.pp
    stage_size, expert_tp = d.stage_size, d.stage_size // max(1, ep)
    by_stage = d.stages()
    for (replica, stage), roles in sorted(by_stage.items()):
        place = f"{where}.placement (replica {replica}, stage {stage})"
        if len(roles) != stage_size:
            out.append(Violation(place, f"{len(roles)} accelerators, the layout needs {stage_size}"))
            continue
        racks = {r.accelerator.rsplit("/", 1)[0] for r in roles}
        if len(racks) > 1 and stage_size <= rack.n_accelerators:
            out.append(Violation(place, f"a stage of {stage_size} spans racks {sorted(racks)}: its groups would leave the scale-up domain"))
        for k, role in enumerate(roles):
            expected = (k % tp, k // tp, k // expert_tp if ep > 1 else None)
            got = (role.tp_rank, role.dp_rank, role.ep_rank)
            if got != expected:
                out.append(Violation(f"{place}[{k}]", f"ranks (tp, dp, ep) are {got}, position {k} means {expected}"))
    for replica in sorted({r for r, _ in by_stage}):
        ranges = sorted(tuple(by_stage[(replica, s)][0].layers) for s in range(pp) if (replica, s) in by_stage)
        ok = len(ranges) == pp and ranges[0][0] == 0 and ranges[-1][1] == n_layers and all(
            a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(ranges)) and ranges[-1][0] < ranges[-1][1]
        if not ok:
            out.append(Violation(f"{where}.placement (replica {replica})", f"stage layer ranges {ranges} do not cover layers 0..{n_layers - 1} in order"))


def _check_placement(resolved: ResolvedProblem, deployments: list[PlanDeployment], out: list[Violation]) -> None:
    """Accelerators exist in the fleet, are available, and are used once; roles are consistent."""
    counts = {rack.id: (rack, count) for rack, count in resolved.rack_counts}
    used: dict[str, str] = {}
    for i, d in enumerate(deployments):
        where = f"deployments[{i}]"
        if not d.has_placement:
            out.append(Violation(f"{where}.placement", "missing: the plan has no accelerator placement"))
            continue
        rack, count = counts.get(d.rack, (None, None))
        if rack is None:
            continue
        if len(d.placement) != d.expected_placement:
            out.append(Violation(f"{where}.placement", f"{len(d.placement)} entries, replicas x accelerators is {d.expected_placement}"))
        for k, role in enumerate(d.placement):
            node = _parse_node(role.accelerator)
            field = f"{where}.placement[{k}].accelerator"
            if node is None or node[0] != rack.id:
                out.append(Violation(field, f"{role.accelerator!r} is not a {rack.id} accelerator name (<rack>#<instance>/<index>)"))
                continue
            _, instance, index = node
            if (count is not None and instance >= count) or index >= rack.n_accelerators:
                out.append(Violation(field, f"{role.accelerator!r} is not in the fleet ({count if count is not None else 'unlimited'} x "
                                            f"{rack.id}, {rack.n_accelerators} accelerators each)"))
            elif index in resolved.unavailable.get(rack.id, {}).get(instance, ()):
                out.append(Violation(field, f"{role.accelerator!r} is marked unavailable"))
            if role.accelerator in used:
                out.append(Violation(field, f"{role.accelerator!r} is already used by {used[role.accelerator]}"))
            used[role.accelerator] = f"{where} replica {role.replica}"
        model = resolved.models.get(next((w.model_key for w in resolved.workloads if w.name == d.workload), ""), None)
        if model is not None:
            _check_roles(d, where, rack, model.arch.n_layers, out)


def check_plan(resolved: ResolvedProblem, plan: Plan | dict, placement: bool = False) -> list[Violation]:
    """Every way `plan` fails the problem (empty: the plan is valid). With `placement`, also the
    accelerator placement and expert maps. A plan document (`planner.solve_record`) is read as a `Plan`."""
    out: list[Violation] = []
    deployments = as_plan(plan).deployments
    checked: dict[str, list[_Checked]] = {}
    for i, d in enumerate(deployments):
        try:
            found = _check_deployment(resolved, d, f"deployments[{i}]", out)
        except (KeyError, TypeError, ValueError) as exc:
            out.append(Violation(f"deployments[{i}]", f"malformed entry ({exc})"))
            continue
        if found is not None:
            checked.setdefault(d.workload, []).append(found)
    for w in resolved.workloads:
        mine = checked.get(w.name, [])
        if not mine:
            out.append(Violation(f"workload {w.name}", "has no deployment"))
            continue
        _check_workload(w, mine, out)
    _check_racks(resolved, deployments, out)
    if placement:
        try:
            _check_placement(resolved, deployments, out)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            out.append(Violation("placement", f"malformed entry ({exc})"))
    return out


def _check_workload(w, mine: list[_Checked], out: list[Violation]) -> None:
    """Demand, the serving mode's shape, and the TTFT of every prefill-decode pair."""
    roles = {c.role for c in mine}
    served = sum(c.output_tokens_per_s for c in mine if c.role is not ServingRole.PREFILL)
    fed = sum(c.output_tokens_per_s for c in mine if c.role is ServingRole.PREFILL)
    if ServingRole.AGGREGATED in roles and len(roles) > 1:
        out.append(Violation(f"workload {w.name}", "mixes aggregated replicas with prefill/decode pools"))
    split = roles & {ServingRole.PREFILL, ServingRole.DECODE}
    if split and split != {ServingRole.PREFILL, ServingRole.DECODE}:
        out.append(Violation(f"workload {w.name}", f"has {', '.join(sorted(split))} replicas only: pools need both prefill and decode"))
    if w.output_tokens_per_s is not None:
        if served < w.output_tokens_per_s * (1 - RELATIVE_TOLERANCE):
            out.append(Violation(f"workload {w.name}", f"serves {served:.6g} output tokens/s of the {w.output_tokens_per_s:.6g} demanded"))
        if ServingRole.PREFILL in roles and fed < w.output_tokens_per_s * (1 - RELATIVE_TOLERANCE):
            out.append(Violation(f"workload {w.name}", f"its prefill pool keeps up with {fed:.6g} output tokens/s of the "
                                                       f"{w.output_tokens_per_s:.6g} demanded"))
    if w.ttft_limit_s is not None:
        for p in (c for c in mine if c.role is ServingRole.PREFILL):
            for q in (c for c in mine if c.role is ServingRole.DECODE):
                ttft = p.ttft_p90_s + p.handoff_bytes / min(p.nic_bytes_per_s, q.nic_bytes_per_s) + q.ttft_p90_s
                if ttft > w.ttft_limit_s * (1 + RELATIVE_TOLERANCE):
                    out.append(Violation(f"workload {w.name}", f"a prefill-decode pair gives TTFT {ttft:.4g} s at the 90th percentile "
                                                               f"(prefill, KV hand-off over the NICs, decode join), over the limit "
                                                               f"{w.ttft_limit_s:.4g} s"))


def score_plan(resolved: ResolvedProblem, plan: Plan | dict) -> PlanScore:
    """Cost and throughput of a plan recomputed from the catalog and the roofline."""
    usd, accelerators, made, fed = 0.0, 0, {}, {}
    for d in as_plan(plan).deployments:
        inp = _inputs(resolved, d, "deployment", [])
        if inp is None:
            continue
        replicas = d.replicas
        e = estimate(inp)
        usd += replicas * e.usd_per_hour  # accelerators at catalog prices, plus a prompt cache held outside HBM
        accelerators += replicas * inp.layout.n_accelerators
        rates = fed if inp.role is ServingRole.PREFILL else made  # output tokens a prefill replica's prompts will make, or made
        rates[d.workload] = rates.get(d.workload, 0.0) + replicas * inp.output_tokens / e.replica_seconds_per_request
    # a prefill pool and a decode pool serve the smaller of their two rates
    return PlanScore(usd, accelerators, {w: min(rate, fed.get(w, rate)) for w, rate in made.items()})
