"""Check and score a plan independently of the solver.

`check_plan` re-derives every figure of a plan record (the JSON `planner solve` writes) from the
problem and the roofline, and reports what does not hold: invalid layouts, HBM overflow, broken
latency limits, unmet demand, racks over-subscribed, figures that differ from the recomputation
(a hand-edited or stale plan). `score_plan` recomputes the fleet's cost and throughput.
"""

import math
from dataclasses import dataclass

from planner.deployment import Layout, Precisions, layout_issues
from planner.estimate import DeploymentInputs, estimate
from planner.precision import FlopsFormat, Precision
from planner.problem import ResolvedProblem

__all__ = ["Violation", "PlanScore", "check_plan", "score_plan"]

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


def _inputs(resolved: ResolvedProblem, d: dict, where: str, out: list[Violation]) -> DeploymentInputs | None:
    workloads = {w.name: w for w in resolved.workloads}
    w = workloads.get(d.get("workload"))
    if w is None:
        out.append(Violation(f"{where}.workload", f"unknown workload {d.get('workload')!r}"))
        return None
    rack = resolved.hardware.racks.get(d.get("rack"))
    if rack is None:
        out.append(Violation(f"{where}.rack", f"unknown rack {d.get('rack')!r}"))
        return None
    model = resolved.models[w.model_key]
    if d.get("model") != model.arch.id:
        out.append(Violation(f"{where}.model", f"workload {w.name} serves {model.arch.id}, not {d.get('model')!r}"))
    layout = Layout(tp=int(d["tp"]), ep=int(d["ep"]), pp=int(d["pp"]), dp_attn=int(d["dp_attn"]))
    issues = layout_issues(model.arch, layout, int(d["batch_per_replica"]), field=where)
    out.extend(Violation(i.field, i.problem) for i in issues)
    if issues:
        return None
    if layout.stage_size > rack.n_accelerators and not resolved.problem.cluster.allow_spanning_domains:
        out.append(Violation(f"{where}", f"a stage of {layout.stage_size} accelerators spans {rack.id} domains of "
                                         f"{rack.n_accelerators}, and the problem does not allow spanning"))
    p = d["precisions"]
    precisions = Precisions(Precision(p["weights"]), Precision(p["kv_cache"]), Precision(p["activations"]),
                            FlopsFormat(p["compute"]), Precision(p["expert_weights"]))
    options = resolved.problem.solver
    return DeploymentInputs(model.arch, rack, layout, int(d["batch_per_replica"]), w.input_tokens, w.output_tokens,
                            precisions, resolved.hardware.overheads, options.overlap, options.prefill_chunk_tokens)


def _check_deployment(resolved: ResolvedProblem, d: dict, where: str, out: list[Violation]) -> float:
    """Checks of one deployment; returns its sustained output tokens per second (all replicas)."""
    inp = _inputs(resolved, d, where, out)
    if inp is None:
        return 0.0
    e = estimate(inp)
    w = next(w for w in resolved.workloads if w.name == d["workload"])
    if not e.memory.fits:
        out.append(Violation(where, f"needs {e.memory.used_bytes:.4g} B of HBM per accelerator, {inp.rack.accelerator.id} has "
                                    f"{e.memory.capacity_bytes:.4g} B"))
    if w.tpot_limit_s is not None and e.tpot_s > w.tpot_limit_s * (1 + RELATIVE_TOLERANCE):
        out.append(Violation(where, f"TPOT {e.tpot_s:.4g} s exceeds the limit {w.tpot_limit_s:.4g} s"))
    if w.ttft_limit_s is not None and e.ttft_s > w.ttft_limit_s * (1 + RELATIVE_TOLERANCE):
        out.append(Violation(where, f"TTFT {e.ttft_s:.4g} s exceeds the limit {w.ttft_limit_s:.4g} s"))
    for name, value in (("tpot_s", e.tpot_s), ("ttft_s", e.ttft_s), ("output_tokens_per_s_per_accelerator", e.output_tokens_per_s_per_accelerator)):
        if name in d and not _close(float(d[name]), value):
            out.append(Violation(f"{where}.{name}", f"says {d[name]:.6g}, the roofline gives {value:.6g}"))
    if int(d.get("accelerators", 0)) != int(d["replicas"]) * inp.layout.n_accelerators:
        out.append(Violation(f"{where}.accelerators", f"{d.get('accelerators')} != replicas x {inp.layout.n_accelerators}"))
    return int(d["replicas"]) * w.output_tokens / e.replica_seconds_per_request


def _check_racks(resolved: ResolvedProblem, deployments: list[dict], out: list[Violation]) -> None:
    """First-fit-decreasing placement of every pipeline stage into the fleet's racks."""
    for rack, count in resolved.rack_counts:
        if count is None:
            continue
        stages = []
        for d in deployments:
            if d.get("rack") == rack.id:
                size = int(d["tp"]) * int(d["dp_attn"])
                stages += [size] * (int(d["replicas"]) * int(d["pp"]))
        whole = sum(math.ceil(s / rack.n_accelerators) for s in stages if s > rack.n_accelerators)
        free = [rack.n_accelerators] * max(0, count - whole)
        fits = whole <= count
        for size in sorted((s for s in stages if s <= rack.n_accelerators), reverse=True):
            slot = next((i for i, room in enumerate(free) if room >= size), None) if fits else None
            if slot is None:
                fits = False
                break
            free[slot] -= size
        if not fits:
            out.append(Violation(f"racks[{rack.id}]", f"the plan's {len(stages)} pipeline stages ({sum(stages)} accelerators) do not "
                                                      f"fit {count} x {rack.id}"))


def check_plan(resolved: ResolvedProblem, record: dict) -> list[Violation]:
    """Every way `record` fails the problem (empty: the plan is valid)."""
    out: list[Violation] = []
    deployments = record.get("deployments") or []
    served: dict[str, float] = {}
    for i, d in enumerate(deployments):
        try:
            rate = _check_deployment(resolved, d, f"deployments[{i}]", out)
        except (KeyError, TypeError, ValueError) as exc:
            out.append(Violation(f"deployments[{i}]", f"malformed entry ({exc})"))
            continue
        served[d.get("workload")] = served.get(d.get("workload"), 0.0) + rate
    for w in resolved.workloads:
        if w.output_tokens_per_s is not None and served.get(w.name, 0.0) < w.output_tokens_per_s * (1 - RELATIVE_TOLERANCE):
            out.append(Violation(f"workload {w.name}", f"serves {served.get(w.name, 0.0):.6g} output tokens/s of the "
                                                       f"{w.output_tokens_per_s:.6g} demanded"))
        if w.name not in served:
            out.append(Violation(f"workload {w.name}", "has no deployment"))
    _check_racks(resolved, deployments, out)
    return out


def score_plan(resolved: ResolvedProblem, record: dict) -> PlanScore:
    """Cost and throughput of a plan recomputed from the catalog and the roofline."""
    usd, accelerators, served = 0.0, 0, {}
    for d in record.get("deployments") or []:
        inp = _inputs(resolved, d, "deployment", [])
        if inp is None:
            continue
        replicas = int(d["replicas"])
        usd += replicas * inp.layout.n_accelerators * inp.rack.accelerator.price_usd_per_hour
        accelerators += replicas * inp.layout.n_accelerators
        e = estimate(inp)
        served[d["workload"]] = served.get(d["workload"], 0.0) + replicas * inp.output_tokens / e.replica_seconds_per_request
    return PlanScore(usd, accelerators, served)
