"""Expert placement that keeps group-limited routing local: whole expert groups per node.

DeepSeek-V3 routes a token to the experts of at most `groups_per_token` (4) of its `expert_groups`
(8) groups, the groups being contiguous ranges of expert ids. A token then reaches at most 4 nodes
only if every group's experts, copies included, sit in one node. Like the hierarchical policy of
DeepSeek's EPLB, the groups are first spread over the nodes (equal numbers per node, heaviest group
first onto the least-loaded node), then each node places its own experts on its own ranks with the
flat per-layer search (planner/placement/replicas.py), using its share of the redundant slots.
"""

import heapq

import numpy as np

from planner.placement.replicas import GOOD_ENOUGH_GAP, place_layer

__all__ = ["expert_groups_local", "grouping_is_free", "groups_fit_nodes", "groups_kept_local", "place_layer_by_groups",
           "ranks_per_domain"]


def ranks_per_domain(domain_accelerators: int, ep: int, stage_size: int) -> int:
    """Expert-parallel ranks in one scale-up domain when `ep` ranks share a stage of `stage_size`
    accelerators (an expert rank is stage_size / ep accelerators); 1 when a rank is larger than a
    domain (each rank then has domains of its own)."""
    return max(1, domain_accelerators * ep // stage_size)


def groups_fit_nodes(n_experts: int, expert_groups: int, groups_per_token: int, n_ranks: int, ranks_per_node: int | None) -> bool:
    """Whether whole groups can be kept per node: routing is group-limited, the ranks span several
    whole nodes, and the groups split evenly over them."""
    if ranks_per_node is None or n_ranks <= ranks_per_node or n_ranks % ranks_per_node:
        return False
    nodes = n_ranks // ranks_per_node
    return 1 < expert_groups and groups_per_token < expert_groups and n_experts % expert_groups == 0 and expert_groups % nodes == 0


def _groups_to_nodes(group_loads: np.ndarray, nodes: int) -> list[list[int]]:
    """Equal numbers of groups per node, heaviest group first onto the least-loaded node with room."""
    per_node = len(group_loads) // nodes
    held: list[list[int]] = [[] for _ in range(nodes)]
    open_nodes = [(0.0, n) for n in range(nodes)]
    for g in sorted(range(len(group_loads)), key=lambda g: (-group_loads[g], g)):
        load, n = heapq.heappop(open_nodes)
        held[n].append(g)
        if len(held[n]) < per_node:
            heapq.heappush(open_nodes, (load + float(group_loads[g]), n))
    return held


def place_layer_by_groups(loads: np.ndarray, n_ranks: int, slots_per_rank: int, expert_groups: int, ranks_per_node: int,
                          swap_s: float, deadline: float) -> tuple[np.ndarray, list[list[int]]]:
    """Replica counts and rank contents of one layer with every group's experts inside one node."""
    nodes = n_ranks // ranks_per_node
    group_size = len(loads) // expert_groups
    group_loads = loads.reshape(expert_groups, group_size).sum(axis=1)
    copies = np.zeros(len(loads), dtype=int)
    ranks: list[list[int]] = []
    for node_groups in _groups_to_nodes(group_loads, nodes):
        experts = np.concatenate([np.arange(g * group_size, (g + 1) * group_size) for g in sorted(node_groups)])
        node_copies, node_ranks = place_layer(loads[experts], ranks_per_node, slots_per_rank, swap_s, deadline)
        copies[experts] = node_copies
        ranks.extend([int(experts[i]) for i in rank] for rank in node_ranks)
    return copies, ranks


def grouping_is_free(loads: np.ndarray, expert_groups: int, nodes: int) -> bool:
    """Whether keeping groups whole costs no balance: with the groups spread over the domains, the
    step's hottest domain (summed over layers) is within GOOD_ENOUGH_GAP of the mean domain load.
    Group-local placement saves NIC copies only in DeepEP's normal (prefill) mode and never in
    decode, so it is chosen only when it loses nothing; the flat placement balances better otherwise."""
    hottest = mean = 0.0
    for row in loads:
        group_loads = row.reshape(expert_groups, -1).sum(axis=1)
        domain_loads = [sum(group_loads[g] for g in held) for held in _groups_to_nodes(group_loads, nodes)]
        hottest += max(domain_loads)
        mean += sum(domain_loads) / nodes
    return hottest <= mean * (1 + GOOD_ENOUGH_GAP)


def groups_kept_local(layers: list[list[list[int]]], n_experts: int, expert_groups: int, ranks_per_node: int) -> bool:
    """Whether every layer keeps each group's experts, copies included, inside one domain (`layers`:
    per layer, the experts each rank holds)."""
    size = n_experts // expert_groups
    for ranks in layers:
        domain_of: dict[int, int] = {}
        for r, experts in enumerate(ranks):
            for e in experts:
                if domain_of.setdefault(e // size, r // ranks_per_node) != r // ranks_per_node:
                    return False
    return True


def expert_groups_local(arch, n_ranks: int, ranks_per_node: int, layers: list[list[list[int]]]) -> bool:
    """What the step model takes from a placement (`layers`: per MoE layer, the experts each rank
    holds): whether group-limited routing caps the domains a token reaches. Trivially so inside one
    domain or without groups."""
    if not arch.is_moe or n_ranks <= ranks_per_node or arch.moe.expert_groups <= 1:
        return True
    return groups_kept_local(layers, arch.moe.n_routed_experts, arch.moe.expert_groups, ranks_per_node)
