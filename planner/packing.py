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

__all__ = ["PlacementFailed", "RackSlots", "StageItem", "aligned_free_blocks", "place", "stage_kind"]


class PlacementFailed(Exception):
    pass


def stage_kind(stage_size: int, rack_size: int) -> tuple[str, int]:
    """('slots', s) for a power-of-two stage inside one rack, ('racks', k) for a stage that needs
    k whole racks (a full non-power-of-two rack, or more than a rack)."""
    s, n = stage_size, rack_size
    if s <= n and s & (s - 1) == 0 and (n & (n - 1) == 0 or s < n):
        return "slots", s
    return "racks", -(-s // n)


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


def place(racks: Sequence[RackSlots], items: Sequence[StageItem]) -> dict[tuple, list[tuple[int, int]]]:
    """Assign every item: key -> [(rack index, first accelerator index)] (several racks for a stage
    of whole racks). Largest stages first; a stage goes to the rack of its replica's previous stage
    when that rack has a free block, else to the first rack that has one. Raises PlacementFailed."""
    assignment: dict[tuple, list[tuple[int, int]]] = {}
    rack_size = racks[0].size if racks else 0
    whole = [it for it in items if stage_kind(it.size, rack_size)[0] == "racks"]
    slots = sorted((it for it in items if it not in whole), key=lambda it: -it.size)
    for item in whole:
        needed = stage_kind(item.size, rack_size)[1]
        chosen = [r for r, rack in enumerate(racks) if rack.perfect][:needed]
        if len(chosen) < needed:
            raise PlacementFailed(f"stage {item.key} needs {needed} whole racks with every accelerator available")
        for r in chosen:
            racks[r].take_block(rack_size)
        assignment[item.key] = [(r, 0) for r in chosen]
    last_rack: dict[tuple, int] = {}
    for item in slots:
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
