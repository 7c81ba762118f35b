"""Where a placed plan's prefill-to-decode KV hand-offs travel: pairs inside one scale-up domain can
use its links; the planner's TTFT bound assumes the NICs."""

from dataclasses import dataclass

from planner.modes import ServingRole
from planner.physics.links import kv_handoff_s
from planner.solver.candidates import handoff_s
from planner.solver.solve import SolveResult

__all__ = ["HandoffSummary", "handoff_summary"]


@dataclass(frozen=True)
class HandoffSummary:
    """How a workload's prefill-to-decode KV hand-offs travel once placed."""

    workload: str
    pairs: int  # prefill replica x decode replica pairs
    in_domain_pairs: int  # pairs whose replicas share one scale-up domain (the hand-off can use it)
    nic_s: float  # the hand-off time over the NICs (the planner's bound)
    in_domain_s: float | None  # over the scale-up links, when some pair shares a domain


def handoff_summary(result: SolveResult) -> list[HandoffSummary]:
    """For every workload served by pools: which prefill-decode replica pairs the placement put in
    one scale-up domain, and the KV hand-off time over NVLink-class links there and over the NICs."""
    if result.placement is None:
        return []
    racks_of: dict[tuple[int, int], set[str]] = {}
    for role in result.placement.roles:
        racks_of.setdefault((role.deployment, role.replica), set()).add(role.rack)
    out = []
    for w in result.problem.workloads:
        prefill = [(i, d) for i, d in enumerate(result.deployments) if d.candidate.workload == w.name and d.candidate.role is ServingRole.PREFILL]
        decode = [(i, d) for i, d in enumerate(result.deployments) if d.candidate.workload == w.name and d.candidate.role is ServingRole.DECODE]
        if not prefill or not decode:
            continue
        pairs = in_domain = 0
        fastest_nic, fastest_up = 0.0, None
        for i, p in prefill:
            for j, q in decode:
                nic = handoff_s(p.candidate, q.candidate)
                fastest_nic = max(fastest_nic, nic)
                accel_p, accel_q = p.estimate.inputs.rack.accelerator, q.estimate.inputs.rack.accelerator
                up_bw = min(p.candidate.accelerators * accel_p.achievable_scale_up_bytes_per_s,
                            q.candidate.accelerators * accel_q.achievable_scale_up_bytes_per_s)
                for r in range(p.replicas):
                    for k in range(q.replicas):
                        pairs += 1
                        shared = racks_of[(i, r)] | racks_of[(j, k)]
                        if len(shared) == 1:
                            in_domain += 1
                            time = kv_handoff_s(p.candidate.kv_handoff_bytes, up_bw)
                            fastest_up = time if fastest_up is None else max(fastest_up, time)
        out.append(HandoffSummary(w.name, pairs, in_domain, fastest_nic, fastest_up))
    return out
