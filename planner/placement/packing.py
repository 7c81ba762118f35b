"""Packing pipeline stages into racks: aligned power-of-two blocks, racks with broken accelerators.

A stage of `s` accelerators (s a power of two no larger than the rack) takes an aligned block
[k*s, (k+1)*s) of one rack's accelerators, all of them available. A stage that is a whole rack of
a non-power-of-two size, or larger than a rack, takes whole racks that have no broken accelerator.
Placing stages largest first into any free aligned block succeeds whenever it can succeed (item
sizes divide one another), so `place` is exact; `aligned_free_blocks` gives the capacities the
CP-SAT model's inequalities use.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from planner.modes import StageKind

__all__ = ["PlacementFailed", "RackSlots", "StageItem", "aligned_free_blocks", "place", "stage_kind"]


class PlacementFailed(Exception):
    pass


def stage_kind(stage_size: int, rack_size: int) -> tuple[StageKind, int]:
    """('slots', s) for a power-of-two stage inside one rack, ('racks', k) for a stage that needs
    k whole racks (a full non-power-of-two rack, or more than a rack)."""
    s, n = stage_size, rack_size
    if s <= n and s & (s - 1) == 0 and (n & (n - 1) == 0 or s < n):
        return StageKind.SLOTS, s
    return StageKind.RACKS, -(-s // n)


def aligned_free_blocks(rack_size: int, broken: Iterable[int], size: int) -> int:
    """Aligned blocks of `size` accelerators in one rack that contain no broken accelerator."""
    bad = set(broken)
    return sum(1 for k in range(rack_size // size) if not any(i in bad for i in range(k * size, (k + 1) * size)))


@dataclass
class RackSlots:
    """Free accelerators of one rack instance during packing."""

    name: str
    size: int
    free: list[bool]

    @property
    def perfect(self) -> bool:
        return all(self.free)

    def take_block(self, size: int) -> int | None:
        for k in range(self.size // size):
            block = range(k * size, (k + 1) * size)
            if all(self.free[i] for i in block):
                for i in block:
                    self.free[i] = False
                return k * size
        return None


@dataclass(frozen=True)
class StageItem:
    """One pipeline stage to place. `group` ties stages of one replica (kept in one rack if they can)."""

    key: tuple
    size: int
    group: tuple = ()


def _free_blocks(rack: RackSlots, size: int) -> int:
    return sum(1 for k in range(rack.size // size) if all(rack.free[k * size:(k + 1) * size]))


def _place_stage_by_stage(racks: Sequence[RackSlots], slots: Sequence[StageItem]) -> dict[tuple, list[tuple[int, int]]]:
    """Largest first into any free aligned block; a stage goes to the rack of its replica's previous
    stage when that rack has room. Exact: items whose sizes divide one another always fit when the
    aligned-block counts say they do."""
    assignment: dict[tuple, list[tuple[int, int]]] = {}
    last_rack: dict[tuple, int] = {}
    for item in sorted(slots, key=lambda it: -it.size):
        order = list(range(len(racks)))
        if item.group in last_rack:
            order.remove(last_rack[item.group])
            order.insert(0, last_rack[item.group])
        for r in order:
            start = racks[r].take_block(item.size)
            if start is not None:
                assignment[item.key] = [(r, start)]
                last_rack[item.group] = r
                break
        else:
            raise PlacementFailed(f"no rack has {item.size} free aligned accelerators for stage {item.key}")
    return assignment


def _place_replicas_whole(racks: Sequence[RackSlots], slots: Sequence[StageItem]) -> dict[tuple, list[tuple[int, int]]]:
    """Every replica's stages in one rack (its pipeline traffic stays on scale-up links): replicas
    largest stage first, each into the first rack with enough free aligned blocks; replicas that fit
    no single rack are split afterwards, stage by stage."""
    groups: dict[tuple, list[StageItem]] = {}
    for item in slots:
        groups.setdefault(item.group, []).append(item)
    assignment: dict[tuple, list[tuple[int, int]]] = {}
    leftovers: list[StageItem] = []
    for members in sorted(groups.values(), key=lambda m: -m[0].size):
        size = members[0].size
        if any(it.size != size for it in members):
            leftovers += members
            continue
        rack = next((r for r, rack in enumerate(racks) if _free_blocks(rack, size) >= len(members)), None)
        if rack is None:
            leftovers += members
            continue
        for it in members:
            assignment[it.key] = [(rack, racks[rack].take_block(size))]
    assignment.update(_place_stage_by_stage(racks, leftovers))
    return assignment


def place(racks: Sequence[RackSlots], items: Sequence[StageItem]) -> dict[tuple, list[tuple[int, int]]]:
    """Assign every item: key -> [(rack index, first accelerator index)] (several racks for a stage
    of whole racks). Stages of whole racks take perfect racks; the others go replica by replica into
    one rack where possible, and if that greedy order fails, largest stage first (which succeeds
    whenever any placement does). Raises PlacementFailed."""
    assignment: dict[tuple, list[tuple[int, int]]] = {}
    rack_size = racks[0].size if racks else 0
    whole = [it for it in items if stage_kind(it.size, rack_size)[0] is StageKind.RACKS]
    slots = [it for it in items if it not in whole]
    for item in whole:
        needed = stage_kind(item.size, rack_size)[1]
        chosen = [r for r, rack in enumerate(racks) if rack.perfect][:needed]
        if len(chosen) < needed:
            raise PlacementFailed(f"stage {item.key} needs {needed} whole racks with every accelerator available")
        for r in chosen:
            racks[r].take_block(rack_size)
        assignment[item.key] = [(r, 0) for r in chosen]
    saved = [list(rack.free) for rack in racks]
    try:
        assignment.update(_place_replicas_whole(racks, slots))
    except PlacementFailed:
        for rack, free in zip(racks, saved, strict=True):
            rack.free[:] = free
        assignment.update(_place_stage_by_stage(racks, slots))
    return assignment
