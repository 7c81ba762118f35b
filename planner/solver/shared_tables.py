"""Batch tables shared between workloads that differ only in their limits.

Workloads of one model and lengths on one rack type evaluate the same layouts with the same inputs;
only their TPOT and TTFT limits (and so where their batch refinement looks) differ. Their searches
(`batch_search`) run side by side: each round, the tables every search waits for are evaluated once
per distinct inputs, over the union of the batches asked for, and each search gets back its own rows,
the same numbers a table of its batches alone has (a batch's row depends on that batch alone).
"""

from collections.abc import Generator
from dataclasses import fields

import numpy as np

from planner.physics.batch_table import FixedParts, fixed_parts
from planner.physics.estimate import BatchTable, DeploymentInputs, evaluate_batches

__all__ = ["inputs_key", "run_together"]


def _part(value):
    try:
        hash(value)
        return value
    except TypeError:  # catalog objects (architecture, rack, overheads) outlive the searches
        return ("id", id(value))


def inputs_key(inp: DeploymentInputs) -> tuple:
    """Equal for inputs that give equal tables (the catalog objects compared by identity)."""
    return tuple(_part(getattr(inp, f.name)) for f in fields(inp))


def _tables(requests: list[tuple[DeploymentInputs, np.ndarray]], fixed: dict[tuple, FixedParts]) -> list[BatchTable]:
    """The table each request asks for, one evaluation per distinct inputs (their fixed parts kept in
    `fixed` for the next round)."""
    groups: dict[tuple, list[int]] = {}
    for i, (inp, _) in enumerate(requests):
        groups.setdefault(inputs_key(inp), []).append(i)
    out: list[BatchTable | None] = [None] * len(requests)
    for key, members in groups.items():
        asked = [np.asarray(requests[i][1], dtype=float) for i in members]
        union = np.unique(np.concatenate(asked))
        inp = requests[members[0]][0]
        if key not in fixed:
            fixed[key] = fixed_parts(inp)
        table = evaluate_batches(inp, union, fixed=fixed[key])
        for i, batches in zip(members, asked, strict=True):
            same = len(batches) == len(union) and bool(np.all(batches == union))
            out[i] = table if same else table.rows(np.searchsorted(union, batches))
    return out


def run_together(searches: list[Generator]) -> list:
    """Run `searches` (generators yielding (inputs, batches) and receiving that table) side by side;
    their return values, in order."""
    results: list = [None] * len(searches)
    fixed: dict[tuple, FixedParts] = {}
    waiting: list[tuple[int, tuple]] = []
    for i, search in enumerate(searches):
        try:
            waiting.append((i, next(search)))
        except StopIteration as done:
            results[i] = done.value
    while waiting:
        tables = _tables([request for _, request in waiting], fixed)
        still = []
        for (i, _), table in zip(waiting, tables, strict=True):
            try:
                still.append((i, searches[i].send(table)))
            except StopIteration as done:
                results[i] = done.value
        waiting = still
    return results
