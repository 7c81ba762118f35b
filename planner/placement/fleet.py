"""Concrete placement of a solved plan: every pipeline stage of every replica onto accelerators.

Stages are packed into the fleet's racks with `packing.place` (aligned blocks, broken accelerators
skipped, a replica's stages kept in one rack when they fit, so that pipeline hand-offs stay on the
scale-up network). Inside a stage, accelerator k is tensor-parallel rank k % tp of attention
data-parallel rank k // tp, and expert-parallel rank k // expert_tp (expert tensor rank k % expert_tp).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planner.hardware.catalog import RackType
from planner.modes import StageKind
from planner.physics.deployment import Layout, stage_of_layer
from planner.placement.packing import (
    PlacementFailed,
    RackSlots,
    StageItem,
    place,
    stage_kind,
)

__all__ = ["AcceleratorRole", "FleetPlacement", "PlacedDeployment", "PlacementFailed", "place_plan"]


@dataclass(frozen=True)
class AcceleratorRole:
    accelerator: str  # graph node name, "<rack-id>#<instance>/<index>"
    rack: str  # rack instance, "<rack-id>#<instance>"
    deployment: int
    replica: int
    stage: int
    layers: tuple[int, int]  # first layer, one past the last
    tp_rank: int
    dp_rank: int
    ep_rank: int | None
    expert_tp_rank: int | None

    def describe(self) -> str:
        role = f"stage {self.stage} layers {self.layers[0]}-{self.layers[1] - 1}, dp {self.dp_rank} tp {self.tp_rank}"
        return role + (f", ep {self.ep_rank}" if self.ep_rank is not None else "")


@dataclass(frozen=True)
class FleetPlacement:
    roles: tuple[AcceleratorRole, ...]
    racks: dict[str, tuple[int, tuple[int, ...]]]  # rack instance -> (accelerators, unavailable indices)

    def of_deployment(self, index: int) -> list[AcceleratorRole]:
        return [r for r in self.roles if r.deployment == index]


@dataclass(frozen=True)
class PlacedDeployment:
    """What placing one deployment needs: its rack type, layout, replicas and the model's layers."""

    rack_id: str
    layout: Layout
    replicas: int
    n_layers: int


def _layer_ranges(n_layers: int, pp: int) -> list[tuple[int, int]]:
    stages = stage_of_layer(n_layers, pp)
    return [(int(next(i for i, s in enumerate(stages) if s == k)), int(sum(1 for s in stages if s <= k))) for k in range(pp)]


def _racks_needed(deployments: list[PlacedDeployment], rack_id: str, size: int) -> int:
    """Racks of an unlimited type the plan needs (each stage its own block; at least 1)."""
    total = 0
    for d in deployments:
        if d.rack_id == rack_id:
            kind, k = stage_kind(d.layout.stage_size, size)
            total += d.replicas * d.layout.pp * (k * size if kind is StageKind.RACKS else d.layout.stage_size)
    return max(1, -(-total // size))


def _roles(d_index: int, lay: Layout, replica: int, stage: int, nodes: list[str], layers: tuple[int, int]) -> list[AcceleratorRole]:
    spread = lay.ep > 1
    return [AcceleratorRole(node, node.rsplit("/", 1)[0], d_index, replica, stage, layers, k % lay.tp, k // lay.tp,
                            k // lay.expert_tp if spread else None, k % lay.expert_tp if spread else None)
            for k, node in enumerate(nodes)]


def place_plan(rack_counts: Sequence[tuple[RackType, int | None]], unavailable: Mapping[str, Mapping[int, tuple[int, ...]]],
               deployments: Sequence[PlacedDeployment]) -> FleetPlacement:
    """Accelerators for every replica of `deployments` (a plan's, in its order) in a fleet of
    `rack_counts` (None: as many racks as needed) whose `unavailable` accelerators (rack id ->
    instance -> indices) are skipped."""
    roles: list[AcceleratorRole] = []
    rack_map: dict[str, tuple[int, tuple[int, ...]]] = {}
    for rack, count in rack_counts:
        mine = [(i, d) for i, d in enumerate(deployments) if d.rack_id == rack.id]
        if not mine and count is None:
            continue
        n_racks = count if count is not None else _racks_needed([d for _, d in mine], rack.id, rack.n_accelerators)
        broken = unavailable.get(rack.id, {})
        slots = [RackSlots(f"{rack.id}#{k}", rack.n_accelerators, [i not in broken.get(k, ()) for i in range(rack.n_accelerators)])
                 for k in range(n_racks)]
        for k in range(n_racks):
            rack_map[f"{rack.id}#{k}"] = (rack.n_accelerators, broken.get(k, ()))
        items = [StageItem((i, r, s), d.layout.stage_size, (i, r)) for i, d in mine for r in range(d.replicas) for s in range(d.layout.pp)]
        assignment = place(slots, items)
        for i, d in mine:
            ranges = _layer_ranges(d.n_layers, d.layout.pp)
            width = min(d.layout.stage_size, rack.n_accelerators)
            for r in range(d.replicas):
                for s in range(d.layout.pp):
                    nodes = [f"{rack.id}#{rack_index}/{start + k}" for rack_index, start in assignment[(i, r, s)] for k in range(width)]
                    roles += _roles(i, d.layout, r, s, nodes, ranges[s])
    return FleetPlacement(tuple(roles), rack_map)
