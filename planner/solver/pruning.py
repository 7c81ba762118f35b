"""Pareto pruning of candidates: per workload, rack type and serving role, drop every candidate that
another beats on everything the planning model asks of it.

A candidate k may replace a candidate c in any plan when it packs wherever c packs (a stage no larger
and no more accelerators: power-of-two stages fill aligned blocks), costs no more per hour, makes at
least as many tokens per second and, where it matters, is no slower: TPOT for latency objectives;
for the pairing of prefill and decode pools, every partner c may pair with within the TTFT limit
(`partners`, bit sets over the prefill candidates), or else no longer a TTFT (90th percentile, what
limits hold at) and no less NIC bandwidth.
"""

from collections.abc import Sequence
from typing import NamedTuple

from planner.modes import ServingRole
from planner.solver.candidates import Candidate

__all__ = ["pareto_prune"]


class _Figures(NamedTuple):
    """What `_dominates` compares, read from a candidate once (its properties go through its inputs)."""

    accelerators: int
    stage_size: int
    usd_per_hour: float
    output_tokens_per_s: float
    tpot_s: float
    aggregated: bool
    ttft_p90_s: float
    nic_bytes_per_s: float


def _figures(c: Candidate) -> _Figures:
    return _Figures(c.accelerators, c.stage_size, c.usd_per_hour, c.output_tokens_per_s, c.tpot_s, c.role is ServingRole.AGGREGATED,
                    c.ttft_p90_s, c.nic_bytes_per_s)


def _dominates(k: _Figures, c: _Figures, use_latency: bool, pairs: tuple[int, int] | None) -> bool:
    if k.accelerators > c.accelerators or k.stage_size > c.stage_size or k.usd_per_hour > c.usd_per_hour:
        return False
    if k.output_tokens_per_s < c.output_tokens_per_s or (use_latency and k.tpot_s > c.tpot_s):
        return False
    if pairs is not None:
        return pairs[1] & ~pairs[0] == 0  # k pairs with every prefill candidate c pairs with
    return c.aggregated or (k.ttft_p90_s <= c.ttft_p90_s and k.nic_bytes_per_s >= c.nic_bytes_per_s)


def pareto_prune(candidates: list[Candidate], use_latency: bool = False, partners: Sequence[int] | None = None) -> list[Candidate]:
    """Drop every candidate another one of the same role on the same rack type dominates
    (`_dominates`). `use_latency`: the objective weighs TPOT; `partners`: for each candidate, the
    bit set of the prefill candidates it may pair with. Ties keep the canonical first."""
    kept: list[Candidate] = []
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(candidates):
        groups.setdefault((c.role, c.rack_id), []).append(i)
    figures = [_figures(c) for c in candidates]
    for role in ServingRole:
        for (group_role, _), mine in groups.items():
            if group_role is not role:
                continue
            ordered = sorted(mine, key=lambda i: (figures[i].accelerators, -figures[i].output_tokens_per_s, figures[i].tpot_s,
                                                  figures[i].ttft_p90_s, candidates[i].sort_key()))
            chosen: list[int] = []
            for i in ordered:
                c = figures[i]
                if partners is None:
                    beaten = any(_dominates(figures[j], c, use_latency, None) for j in chosen)
                else:
                    beaten = any(_dominates(figures[j], c, use_latency, (partners[j], partners[i])) for j in chosen)
                if not beaten:
                    chosen.append(i)
            kept += [candidates[i] for i in chosen]
    return kept
