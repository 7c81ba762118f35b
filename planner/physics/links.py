"""The links one replica's collectives run over, read from a cluster graph.

A replica of `Layout` occupies the first `n_accelerators` accelerators of the graph in canonical
order: stage after stage, and inside a stage one tensor-parallel group after another. Its groups
are then asked for their bandwidth (topology.group_links); the worst group of each kind sets the
pace, since every group runs its collective at the same time.
"""

import itertools
import math
from dataclasses import dataclass

import networkx as nx

from planner.hardware.catalog import Accelerator, RackType
from planner.hardware.topology import (
    SCALE_OUT,
    GroupLinks,
    accelerator_nodes,
    build_cluster_graph,
    domain_map,
    group_links,
    group_to_group_bandwidth_bytes_per_s,
)
from planner.physics.deployment import Layout

__all__ = ["EffectiveLinks", "ReplicaLinks", "default_replica_links", "effective_links", "replica_links"]


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


@dataclass
class _Cluster:
    """A graph with its domain map and the group queries already answered on it. Graphs of one rack
    type in different numbers share their answers (`default_replica_links`): a group's links and a
    flow between groups depend only on the rack instances of their members, built alike in each."""

    graph: nx.Graph
    members: list[str]
    domain_of: dict[str, int]
    groups: dict[tuple[str, ...], GroupLinks]
    flows: dict[tuple[tuple[str, ...], tuple[str, ...]], float]

    def spans(self, nodes: list[str]) -> bool:
        return len({self.domain_of[m] for m in nodes}) > 1

    def group(self, nodes: list[str]) -> GroupLinks:
        key = tuple(nodes)
        if key not in self.groups:
            self.groups[key] = group_links(self.graph, nodes, self.domain_of)
        return self.groups[key]

    def flow(self, a: list[str], b: list[str]) -> float:
        key = (tuple(a), tuple(b))
        if key not in self.flows:
            self.flows[key] = group_to_group_bandwidth_bytes_per_s(self.graph, a, b, self.domain_of)
        return self.flows[key]


def _representatives(blocks: list[list[str]], cluster: _Cluster) -> list[list[str]]:
    """One group per distinct shape: the first inside one domain and the first spanning domains."""
    chosen: dict[bool, list[str]] = {}
    for block in blocks:
        chosen.setdefault(cluster.spans(block), block)
    return list(chosen.values())


def _replica_links(cluster: _Cluster, members: list[str], layout: Layout, latency_s: float) -> ReplicaLinks:
    n = layout.stage_size
    stages = [members[s * n:(s + 1) * n] for s in range(layout.pp)]
    tp_groups = [stage[r * layout.tp:(r + 1) * layout.tp] for stage in stages for r in range(layout.dp_attn)]
    tp = _worst([cluster.group(g) for g in _representatives(tp_groups, cluster)])
    stage = _worst([cluster.group(g) for g in _representatives(stages, cluster)])
    pairs: dict[bool, tuple[list[str], list[str]]] = {}
    for a, b in itertools.pairwise(stages):
        pairs.setdefault(cluster.spans(a + b), (a, b))
    pp_bandwidth = min((cluster.flow(a, b) for a, b in pairs.values()), default=math.inf)
    n_domains = len({cluster.domain_of[m] for m in members})
    return ReplicaLinks(tp, stage, pp_bandwidth, True in pairs, latency_s, n_domains)


def replica_links(graph: nx.Graph, members: list[str], layout: Layout, latency_s: float) -> ReplicaLinks:
    """Links of a replica placed on `members` (canonical order: stage-major, then TP groups)."""
    return _replica_links(_Cluster(graph, members, domain_map(graph), {}, {}), members, layout, latency_s)


_CLUSTERS: dict[tuple, _Cluster] = {}
_CACHE: dict[tuple, ReplicaLinks] = {}


def default_replica_links(rack: RackType, layout: Layout, latency_s: float) -> ReplicaLinks:
    """Links of a replica on as many instances of `rack` as it needs, filling them in order."""
    accel = rack.accelerator
    rack_key = (rack.id, rack.n_accelerators, rack.topology, accel.scale_up_bandwidth_bytes_per_s,
                accel.scale_out_bandwidth_bytes_per_s, latency_s)
    groups = Layout(tp=layout.tp, pp=layout.pp, dp_attn=layout.dp_attn)  # the groups do not depend on ep
    key = (rack_key, groups)
    if key not in _CACHE:
        n_racks = math.ceil(layout.n_accelerators / rack.n_accelerators)
        if (rack_key, n_racks) not in _CLUSTERS:
            graph = build_cluster_graph([(rack, n_racks)], collective_latency_s=latency_s)
            answered = next((c for (key, _), c in _CLUSTERS.items() if key == rack_key), None)
            groups, flows = (answered.groups, answered.flows) if answered is not None else ({}, {})
            _CLUSTERS[(rack_key, n_racks)] = _Cluster(graph, accelerator_nodes(graph), domain_map(graph), groups, flows)
        cluster = _CLUSTERS[(rack_key, n_racks)]
        _CACHE[key] = _replica_links(cluster, cluster.members[: layout.n_accelerators], layout, latency_s)
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


def kv_handoff_s(kv_bytes: float, *link_bytes_per_s: float) -> float:
    """Time to move one request's KV cache between two replicas: the slower side's links set the pace."""
    return kv_bytes / min(link_bytes_per_s)
