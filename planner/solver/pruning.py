"""Pareto pruning of candidates: per workload, rack type and serving role, drop every candidate that
another beats on cost per token (and, for latency objectives, on TPOT and TTFT too)."""

from planner.modes import ServingRole
from planner.solver.candidates import Candidate

__all__ = ["pareto_prune"]


def pareto_prune(candidates: list[Candidate], use_latency: bool = False) -> list[Candidate]:
    """Drop every candidate another one of the same role beats: no more accelerators, at least the
    throughput (and, with `use_latency`, no worse TPOT), strictly better somewhere. Prefill and
    decode candidates also keep what their pairing depends on: TTFT and NIC bandwidth. Ties keep
    the canonical first."""
    kept: list[Candidate] = []
    for role in ServingRole:
        mine = [c for c in candidates if c.role is role]
        paired = role is not ServingRole.AGGREGATED
        ordered = sorted(mine, key=lambda c: (c.accelerators, -c.output_tokens_per_s, c.tpot_s, c.ttft_s, c.sort_key()))
        chosen: list[Candidate] = []
        for c in ordered:
            dominated = any(
                k.accelerators <= c.accelerators and k.output_tokens_per_s >= c.output_tokens_per_s
                and (not use_latency or k.tpot_s <= c.tpot_s)
                and (not paired or (k.ttft_s <= c.ttft_s and k.nic_bytes_per_s >= c.nic_bytes_per_s))
                for k in chosen
            )
            if not dominated:
                chosen.append(c)
        kept += chosen
    return kept
