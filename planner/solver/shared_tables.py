"""Batch tables shared between workloads that differ only in their limits.

Workloads of one model and lengths on one rack type evaluate the same layouts with the same inputs;
only their TPOT and TTFT limits (and so where their batch refinement looks) differ. Their searches
(`batch_search`) run side by side: each round, the tables every search waits for are evaluated once
per distinct inputs, over the union of the batches asked for, and each search gets back its own rows,
the same numbers a table of its batches alone has (a batch's row depends on that batch alone).
"""

from collections.abc import Generator

import numpy as np

from planner.physics.batch_table import FixedParts, fixed_parts, shares_prefill
from planner.physics.estimate import BatchTable, DeploymentInputs, evaluate_batches

__all__ = ["run_together"]


def _tables(requests: list[tuple[DeploymentInputs, np.ndarray]], fixed: list[tuple[DeploymentInputs, FixedParts]],
            reuse: dict | None) -> list[BatchTable]:
    """The table each request asks for, one evaluation per distinct inputs (their fixed parts kept in
    `fixed` for the next round; `reuse`: kernel times shared across layouts, `StepContext.reused`).
    Inputs compare by value; those of one layout share their catalog objects, so comparing them is cheap."""
    groups: list[tuple[DeploymentInputs, list[int]]] = []
    for i, (inp, _) in enumerate(requests):
        members = next((members for first, members in groups if first == inp), None)
        if members is None:
            groups.append((inp, [i]))
        else:
            members.append(i)
    out: list[BatchTable | None] = [None] * len(requests)
    for inp, members in groups:
        parts = next((parts for known, parts in fixed if known == inp), None)
        if parts is None:  # the prefill pass of inputs that differ only in role, prompt cache or draft tokens is the same
            parts = fixed_parts(inp, like=next((parts for known, parts in fixed if shares_prefill(known, inp)), None), reuse=reuse)
            fixed.append((inp, parts))
        if len(members) == 1:
            out[members[0]] = evaluate_batches(inp, requests[members[0]][1], fixed=parts)
            continue
        asked = [np.asarray(requests[i][1], dtype=float) for i in members]
        union = np.unique(np.concatenate(asked))
        table = evaluate_batches(inp, union, fixed=parts)
        for i, batches in zip(members, asked, strict=True):
            same = len(batches) == len(union) and bool(np.all(batches == union))
            out[i] = table if same else table.rows(np.searchsorted(union, batches))
    return out


def run_together(searches: list[Generator], reuse: dict | None = None) -> list:
    """Run `searches` (generators yielding (inputs, batches) and receiving that table) side by side;
    their return values, in order. `reuse`: kernel times kept across the layouts of one enumeration
    (`StepContext.reused`), or None."""
    results: list = [None] * len(searches)
    fixed: list[tuple[DeploymentInputs, FixedParts]] = []
    waiting: list[tuple[int, tuple]] = []
    for i, search in enumerate(searches):
        try:
            waiting.append((i, next(search)))
        except StopIteration as done:
            results[i] = done.value
    while waiting:
        tables = _tables([request for _, request in waiting], fixed, reuse)
        still = []
        for (i, _), table in zip(waiting, tables, strict=True):
            try:
                still.append((i, searches[i].send(table)))
            except StopIteration as done:
                results[i] = done.value
        waiting = still
    return results
