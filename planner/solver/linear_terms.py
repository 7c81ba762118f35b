"""Linear terms of a CP-SAT model read by index: the helpers the decomposition and its proof share."""

from collections.abc import Iterable

from ortools.sat.python import cp_model

__all__ = ["term_range", "weighted"]


def weighted(var: dict[int, cp_model.IntVar], coef: dict[int, int] | Iterable[tuple[int, int]]) -> cp_model.LinearExpr:
    """sum(c * var[i]) over the (index, coefficient) pairs whose index `var` maps."""
    pairs = coef.items() if isinstance(coef, dict) else coef
    terms = [(i, c) for i, c in pairs if c and i in var]
    return cp_model.LinearExpr.weighted_sum([var[i] for i, _ in terms], [c for _, c in terms])


def term_range(domain, c: int) -> tuple[int, int]:
    """The least and the most of c * x over a variable's flat domain."""
    ends = (c * domain[0], c * domain[len(domain) - 1])
    return min(ends), max(ends)
