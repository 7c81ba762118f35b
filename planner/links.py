"""The links one replica's collectives run over, read from a cluster graph.

A replica of `Layout` occupies the first `n_accelerators` accelerators of the graph in canonical
order: stage after stage, and inside a stage one tensor-parallel group after another. Its groups
are then asked for their bandwidth (topology.group_links); the worst group of each kind sets the
pace, since every group runs its collective at the same time.
"""

import math
from dataclasses import dataclass

import networkx as nx

from planner.deployment import Layout
from planner.hardware import Accelerator, RackType
from planner.topology import (
    SCALE_OUT,
    GroupLinks,
    accelerator_nodes,
    build_cluster_graph,
    domain_map,
    group_links,
    group_to_group_bandwidth_bytes_per_s,
)

__all__ = ["ReplicaLinks", "EffectiveLinks", "replica_links", "default_replica_links", "effective_links"]


@dataclass(frozen=True)
class ReplicaLinks:
    """Raw link capacities of one replica's groups (bytes/s per direction)."""

    tp: GroupLinks  # the tensor-parallel group of one attention rank
    stage: GroupLinks  # all accelerators of one pipeline stage (the expert all-to-all group)
    pp_bandwidth_bytes_per_s: float  # stage-to-stage max-flow (inf without pipelining)
    pp_spans_domains: bool
    latency_s: float
    n_scale_up_domains: int  # domains the replica touches


@dataclass(frozen=True)
class EffectiveLinks:
    """Achievable bandwidths (raw x the accelerator's achievable fraction for the link kind)."""

    tp_bytes_per_s: float
    stage_injection_bytes_per_s: float
    stage_bisection_bytes_per_s: float
    pp_bytes_per_s: float
    latency_s: float


def _worst(groups: list[GroupLinks]) -> GroupLinks:
    return min(groups, key=lambda g: (g.link_kind != SCALE_OUT, g.injection_bytes_per_s))


def _representatives(blocks: list[list[str]], domain_of: dict[str, int]) -> list[list[str]]:
    """One group per distinct shape: the first inside one domain and the first spanning domains."""
    chosen: dict[bool, list[str]] = {}
    for block in blocks:
        spans = len({domain_of[m] for m in block}) > 1
        chosen.setdefault(spans, block)
    return list(chosen.values())


def replica_links(graph: nx.Graph, members: list[str], layout: Layout, latency_s: float) -> ReplicaLinks:
    """Links of a replica placed on `members` (canonical order: stage-major, then TP groups)."""
    domain_of = domain_map(graph)
    n = layout.stage_size
    stages = [members[s * n:(s + 1) * n] for s in range(layout.pp)]
    tp_groups = [stage[r * layout.tp:(r + 1) * layout.tp] for stage in stages for r in range(layout.dp_attn)]
    tp = _worst([group_links(graph, g, domain_of) for g in _representatives(tp_groups, domain_of)])
    stage = _worst([group_links(graph, g, domain_of) for g in _representatives(stages, domain_of)])
    pp_bandwidth, pp_spans = math.inf, False
    for a, b in zip(stages, stages[1:]):
        pp_bandwidth = min(pp_bandwidth, group_to_group_bandwidth_bytes_per_s(graph, a, b, domain_of))
        pp_spans = pp_spans or len({domain_of[m] for m in a + b}) > 1
    n_domains = len({domain_of[m] for m in members})
    return ReplicaLinks(tp, stage, pp_bandwidth, pp_spans, latency_s, n_domains)


_CACHE: dict[tuple, ReplicaLinks] = {}


def default_replica_links(rack: RackType, layout: Layout, latency_s: float) -> ReplicaLinks:
    """Links of a replica on as many instances of `rack` as it needs, filling them in order."""
    accel = rack.accelerator
    key = (rack.id, rack.n_accelerators, rack.topology, accel.scale_up_bandwidth_bytes_per_s,
           accel.scale_out_bandwidth_bytes_per_s, layout, latency_s)
    if key not in _CACHE:
        n_racks = math.ceil(layout.n_accelerators / rack.n_accelerators)
        graph = build_cluster_graph([(rack, n_racks)], collective_latency_s=latency_s)
        members = accelerator_nodes(graph)[: layout.n_accelerators]
        _CACHE[key] = replica_links(graph, members, layout, latency_s)
    return _CACHE[key]


def _fraction(accel: Accelerator, kind: str) -> float:
    return accel.scale_out_bandwidth_fraction if kind == SCALE_OUT else accel.scale_up_bandwidth_fraction


def effective_links(links: ReplicaLinks, accel: Accelerator) -> EffectiveLinks:
    pp_kind = SCALE_OUT if links.pp_spans_domains else "scale_up"
    return EffectiveLinks(
        tp_bytes_per_s=links.tp.injection_bytes_per_s * _fraction(accel, links.tp.link_kind),
        stage_injection_bytes_per_s=links.stage.injection_bytes_per_s * _fraction(accel, links.stage.link_kind),
        stage_bisection_bytes_per_s=links.stage.bisection_bytes_per_s * _fraction(accel, links.stage.link_kind),
        pp_bytes_per_s=links.pp_bandwidth_bytes_per_s * _fraction(accel, pp_kind),
        latency_s=links.latency_s,
    )
