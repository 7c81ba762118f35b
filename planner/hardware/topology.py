"""Clusters as networkx graphs, and the bandwidths a group of accelerators gets, read from the graph.

Nodes are accelerators and switches; every edge has a `kind` (scale_up or scale_out), a
`bandwidth_bytes_per_s` (per direction) and a `latency_s`. Scale-up domains are the connected
components of the scale-up edges; the scale-out fabric is one non-blocking switch that every
accelerator's NIC connects to (a full-bisection fat tree, stated as an assumption of every plan).
Nothing downstream hard-codes a topology: bandwidths come from max-flow on this graph.
"""

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import networkx as nx

from planner.hardware.catalog import RackType

__all__ = [
    "FABRIC",
    "SCALE_OUT",
    "SCALE_UP",
    "GroupLinks",
    "accelerator_nodes",
    "build_cluster_graph",
    "domain_map",
    "group_links",
    "group_to_group_bandwidth_bytes_per_s",
    "scale_up_domains",
]

FABRIC = "scale-out-fabric"
SCALE_UP = "scale_up"
SCALE_OUT = "scale_out"


def _add_switched(graph: nx.Graph, members: list[str], switch: str, rack: RackType, latency_s: float) -> None:
    graph.add_node(switch, kind="switch", rack=rack.id)
    for node in members:
        graph.add_edge(node, switch, kind=SCALE_UP, bandwidth_bytes_per_s=rack.accelerator.scale_up_bandwidth_bytes_per_s, latency_s=latency_s)


def _add_full_mesh(graph: nx.Graph, members: list[str], rack: RackType, latency_s: float) -> None:
    per_link = rack.accelerator.scale_up_bandwidth_bytes_per_s / max(1, len(members) - 1)
    for a, b in itertools.combinations(members, 2):
        graph.add_edge(a, b, kind=SCALE_UP, bandwidth_bytes_per_s=per_link, latency_s=latency_s)


def _add_torus(graph: nx.Graph, members: list[str], rack: RackType, latency_s: float) -> None:
    dims = rack.topology.dims
    default_link = rack.accelerator.scale_up_bandwidth_bytes_per_s / (2 * len(dims))
    axis_bw = rack.topology.axis_link_bandwidth_bytes_per_s or (default_link,) * len(dims)
    coords = list(itertools.product(*(range(side) for side in dims)))
    index = {c: i for i, c in enumerate(coords)}
    for c in coords:
        graph.nodes[members[index[c]]]["coords"] = c
        for axis, side in enumerate(dims):
            if c[axis] + 1 == side and not rack.topology.wraparound:
                continue
            neighbour = list(c)
            neighbour[axis] = (c[axis] + 1) % side
            a, b = members[index[c]], members[index[tuple(neighbour)]]
            if graph.has_edge(a, b):  # a ring of 2: both links join the same pair
                graph[a][b]["bandwidth_bytes_per_s"] += axis_bw[axis]
            else:
                graph.add_edge(a, b, kind=SCALE_UP, bandwidth_bytes_per_s=axis_bw[axis], latency_s=latency_s)


def _add_links(graph: nx.Graph, members: list[str], prefix: str, rack: RackType, latency_s: float) -> None:
    def node(end: int | str) -> str:
        return members[end] if isinstance(end, int) else f"{prefix}/{end}"

    for name in rack.topology.switches:
        graph.add_node(f"{prefix}/{name}", kind="switch", rack=rack.id)
    for a, b, bandwidth in rack.topology.links:
        u, v = node(a), node(b)
        if graph.has_edge(u, v):
            graph[u][v]["bandwidth_bytes_per_s"] += bandwidth
        else:
            graph.add_edge(u, v, kind=SCALE_UP, bandwidth_bytes_per_s=bandwidth, latency_s=latency_s)


def build_cluster_graph(
    rack_counts: Iterable[tuple[RackType, int]],
    *,
    collective_latency_s: float,
    unavailable: Iterable[str] = (),
) -> nx.Graph:
    """Graph of `count` instances of each rack type. Accelerator nodes are named
    `<rack-id>#<instance>/<index>`; `unavailable` names accelerators to mark as not usable."""
    graph = nx.Graph()
    graph.add_node(FABRIC, kind="switch", rack=None)
    down = set(unavailable)
    for rack, count in rack_counts:
        for instance in range(count):
            prefix = f"{rack.id}#{instance}"
            members = [f"{prefix}/{i}" for i in range(rack.n_accelerators)]
            for i, node in enumerate(members):
                graph.add_node(node, kind="accelerator", rack=rack.id, instance=prefix, index=i,
                               accelerator=rack.accelerator.id, available=node not in down)
                graph.add_edge(node, FABRIC, kind=SCALE_OUT,
                               bandwidth_bytes_per_s=rack.accelerator.scale_out_bandwidth_bytes_per_s, latency_s=collective_latency_s)
            kind = rack.topology.kind
            if kind == "switched" and rack.n_accelerators > 1:
                _add_switched(graph, members, f"{prefix}/switch", rack, collective_latency_s)
            elif kind == "full_mesh":
                _add_full_mesh(graph, members, rack, collective_latency_s)
            elif kind == "torus":
                _add_torus(graph, members, rack, collective_latency_s)
            elif kind == "links":
                _add_links(graph, members, prefix, rack, collective_latency_s)
    return graph


def accelerator_nodes(graph: nx.Graph, *, available_only: bool = True) -> list[str]:
    """Accelerators in canonical order: rack instance by instance, index within the instance."""
    nodes = [n for n, d in graph.nodes(data=True) if d["kind"] == "accelerator" and (d["available"] or not available_only)]
    return sorted(nodes, key=lambda n: (graph.nodes[n]["instance"].split("#")[0], int(graph.nodes[n]["instance"].split("#")[1]), graph.nodes[n]["index"]))


def _scale_up_subgraph(graph: nx.Graph) -> nx.Graph:
    """The accelerators and scale-up links of `graph`, without their attributes (all its components need)."""
    sub = nx.Graph()
    sub.add_edges_from((u, v) for u, v, d in graph.edges(data=True) if d["kind"] == SCALE_UP)
    sub.add_nodes_from(n for n, d in graph.nodes(data=True) if d["kind"] == "accelerator")
    return sub


def scale_up_domains(graph: nx.Graph) -> list[list[str]]:
    """Sets of accelerators joined by scale-up links (connected components), canonical order."""
    order = {n: i for i, n in enumerate(accelerator_nodes(graph, available_only=False))}
    domains = []
    for component in nx.connected_components(_scale_up_subgraph(graph)):
        accels = sorted((n for n in component if n in order), key=order.__getitem__)
        if accels:
            domains.append(accels)
    return sorted(domains, key=lambda d: order[d[0]])


@dataclass(frozen=True)
class GroupLinks:
    """What the graph offers a group of accelerators for a collective (raw link capacities).

    `injection_bytes_per_s`: per member and direction, the bandwidth of its links that lead to the
    other members (directly or through a switch); the minimum over members.
    `bisection_bytes_per_s`: max-flow, one direction, from the first half of the group to the second.
    `link_kind`: scale_out as soon as the group spans two scale-up domains (then the NICs set the pace).
    """

    n_members: int
    spans_domains: bool
    link_kind: str
    injection_bytes_per_s: float
    bisection_bytes_per_s: float
    latency_s: float


def _max_flow(graph: nx.Graph, keep: set[str], sources: Sequence[str], sinks: Sequence[str], kinds: set[str]) -> float:
    """Max-flow, bytes/s in one direction, from `sources` to `sinks` over edges of `kinds` between the
    nodes `keep`."""
    if not sources or not sinks:
        return 0.0
    adjacency, arcs, done = graph.adj, [], set()
    for u in keep:
        arcs += [(u, v, data["bandwidth_bytes_per_s"]) for v, data in adjacency[u].items()
                 if v in keep and v not in done and data["kind"] in kinds]
        done.add(u)
    total = sum(c for _, _, c in arcs)
    if not set(sources) & set(sinks) and all(float(c).is_integer() and c >= 0 for _, _, c in arcs) and 3 * total < 2**53:
        # whole numbers of bytes/s: every flow is a whole number, exact in floats below 2^53 (networkx's
        # preflow-push stands in 3 x the finite capacities for infinity), so any max-flow algorithm
        # gives the same float; augmenting paths on integers are the fast one
        return float(_whole_max_flow(arcs, sources, sinks, int(total) + 1))
    flow = nx.DiGraph()
    for u, v, data in graph.subgraph(keep).edges(data=True):
        if data["kind"] in kinds:
            flow.add_edge(u, v, capacity=data["bandwidth_bytes_per_s"])
            flow.add_edge(v, u, capacity=data["bandwidth_bytes_per_s"])
    for s in sources:
        flow.add_edge("__source__", s, capacity=math.inf)
    for t in sinks:
        flow.add_edge(t, "__sink__", capacity=math.inf)
    return float(nx.maximum_flow_value(flow, "__source__", "__sink__"))


def _whole_max_flow(arcs: list[tuple[str, str, float]], sources: Sequence[str], sinks: Sequence[str], unbounded: int) -> int:
    """Dinic's max-flow on whole-number capacities, each edge usable both ways at its capacity; the
    sources fed and the sinks drained by arcs of `unbounded` capacity (more than all edges carry)."""
    index: dict[str, int] = {"__source__": 0, "__sink__": 1}
    for u, v, _ in arcs:
        index.setdefault(u, len(index))
        index.setdefault(v, len(index))
    for x in (*sources, *sinks):
        index.setdefault(x, len(index))
    head: list[list[list[int]]] = [[] for _ in index]  # per node: [to, residual capacity, index of the reverse arc in head[to]]
    pairs = [(index[u], index[v], int(c)) for u, v, c in arcs]
    pairs += [(0, index[s], unbounded) for s in sources] + [(index[t], 1, unbounded) for t in sinks]
    for a, b, capacity in pairs:
        for x, y, forward, backward in ((a, b, capacity, 0), (b, a, capacity, 0)) if (a > 1 and b > 1) else ((a, b, capacity, 0),):
            head[x].append([y, forward, len(head[y])])
            head[y].append([x, backward, len(head[x]) - 1])
    total = 0
    while True:
        level = _levels(head)
        if level[1] < 0:
            return total
        total += _blocking_flow(head, level)


def _levels(head: list[list[list[int]]]) -> list[int]:
    """Breadth-first distance from the source (node 0) over arcs with residual capacity; -1 if unreached."""
    level = [-1] * len(head)
    level[0] = 0
    frontier = [0]
    while frontier:
        nxt = []
        for u in frontier:
            for v, capacity, _ in head[u]:
                if capacity > 0 and level[v] < 0:
                    level[v] = level[u] + 1
                    nxt.append(v)
        frontier = nxt
    return level


def _blocking_flow(head: list[list[list[int]]], level: list[int]) -> int:
    """Augment along shortest paths (level by level) from the source to the sink (node 1) until none is left."""
    pointer = [0] * len(head)
    total = 0
    while True:
        path, u = [], 0  # arcs taken: (node, arc index)
        while u != 1:
            arcs = head[u]
            while pointer[u] < len(arcs) and not (arcs[pointer[u]][1] > 0 and level[arcs[pointer[u]][0]] == level[u] + 1):
                pointer[u] += 1
            if pointer[u] == len(arcs):  # a dead end: back up and skip the arc that led here
                if not path:
                    return total
                level[u] = -1
                u, _ = path.pop()
                pointer[u] += 1
                continue
            path.append((u, pointer[u]))
            u = arcs[pointer[u]][0]
        pushed = min(head[a][i][1] for a, i in path)
        for a, i in path:
            to, _, back = head[a][i]
            head[a][i][1] -= pushed
            head[to][back][1] += pushed
        total += pushed


def _group_nodes(graph: nx.Graph, members: Sequence[str], include_fabric: bool) -> set[str]:
    """The members and the switches they attach to (and the fabric if asked). Links of accelerators
    outside the group are left out: in a serving replica every group runs its collectives at the
    same time, so a group cannot borrow its neighbours' links."""
    keep = set(members)
    frontier = list(members)
    while frontier:  # switches reachable through switches (a two-level tree of an explicitly wired unit)
        node = frontier.pop()
        for other in graph.neighbors(node):
            if other not in keep and other != FABRIC and graph.nodes[other]["kind"] == "switch":
                keep.add(other)
                frontier.append(other)
    if include_fabric:
        keep.add(FABRIC)
    return keep


def domain_map(graph: nx.Graph) -> dict[str, int]:
    """Accelerator -> index of its scale-up domain."""
    return {node: i for i, domain in enumerate(scale_up_domains(graph)) for node in domain}


def group_links(graph: nx.Graph, members: Sequence[str], domain_of: dict[str, int] | None = None) -> GroupLinks:
    """Link capacities a collective over `members` can use (see GroupLinks). Pass `domain_of`
    (from `domain_map`) when querying many groups of one graph."""
    n = len(members)
    domain_of = domain_of if domain_of is not None else domain_map(graph)
    spans = len({domain_of[m] for m in members}) > 1
    kind = SCALE_OUT if spans else SCALE_UP
    if n == 1:
        return GroupLinks(1, False, SCALE_UP, math.inf, math.inf, 0.0)
    group = set(members)
    injection = math.inf
    latency = 0.0
    for m in members:
        usable = 0.0
        for _, other, data in graph.edges(m, data=True):
            if data["kind"] != kind:
                continue
            if other in group or graph.nodes[other]["kind"] == "switch":
                usable += data["bandwidth_bytes_per_s"]
                latency = max(latency, data["latency_s"])
        injection = min(injection, usable)
    keep = _group_nodes(graph, members, include_fabric=spans)
    half = n // 2
    kinds = {SCALE_UP, SCALE_OUT} if spans else {SCALE_UP}
    bisection = _max_flow(graph, keep, members[:half], members[half:], kinds)
    return GroupLinks(n, spans, kind, injection, bisection, latency)


def group_to_group_bandwidth_bytes_per_s(
    graph: nx.Graph, sources: Sequence[str], sinks: Sequence[str], domain_of: dict[str, int] | None = None
) -> float:
    """Bottleneck bandwidth (max-flow, one direction) from one group of accelerators to another.
    Inside one scale-up domain only scale-up links count (collective libraries keep such traffic off
    the NICs); across domains both kinds do."""
    domain_of = domain_of if domain_of is not None else domain_map(graph)
    members = list(sources) + list(sinks)
    spans = len({domain_of[m] for m in members}) > 1
    keep = _group_nodes(graph, members, include_fabric=spans)
    return _max_flow(graph, keep, sources, sinks, {SCALE_UP, SCALE_OUT} if spans else {SCALE_UP})
