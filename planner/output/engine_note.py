"""The NOTE an export carries when it starts another engine than the one the plan was sized for: the
plan's batch and layout were chosen with that engine's measured kernel rates, and the export's engine
reaches other ones. The note gives the planner's figures for the same deployment with the export
engine's rates (the plan's embedded problem re-resolved with `engine` changed), so the operator sees
what to expect, and how to size the fleet for that engine instead."""

from pathlib import Path

from planner.errors import PlannerInputError
from planner.output.plan import Plan
from planner.output.validate import deployment_inputs_of
from planner.physics.estimate import estimate
from planner.problem.resolve import resolve_problem
from planner.problem.schema import parse_problem
from planner.units import MS

__all__ = ["engine_mismatch_notes"]


def _figures(plan: Plan, engine: str) -> dict[int, tuple[float, float]]:
    """TPOT and TTFT (s) of every deployment with `engine`'s kernel rates; empty when the plan's problem
    cannot be re-resolved here (a profile file next to the problem, an engine without rates for it)."""
    spec = {**plan.problem_spec, "engine": engine}
    try:
        resolved = resolve_problem(parse_problem(spec), base_dir=Path(plan.problem_dir or "."))
        out = {}
        for i, d in enumerate(plan.deployments):
            inp = deployment_inputs_of(resolved, d, f"deployments[{i}]", [])
            if inp is not None:
                e = estimate(inp)
                out[i] = (e.tpot_s, e.ttft_s)
        return out
    except (PlannerInputError, OSError, KeyError, ValueError):
        return {}


def engine_mismatch_notes(plan: Plan, engine: str) -> list[str]:
    """One NOTE per deployment planned for another engine than `engine`."""
    others = [i for i, d in enumerate(plan.deployments) if d.engine != engine]
    if not others:
        return []
    figures = _figures(plan, engine)
    notes = []
    for i in others:
        d = plan.deployments[i]
        text = f"deployment {i} was sized with {d.engine}'s measured kernel rates"
        if d.tpot_s is not None and d.ttft_s is not None:
            text += f" (TPOT {d.tpot_s / MS:.4g} ms, TTFT {d.ttft_s / MS:.4g} ms)"
        if i in figures:
            tpot_s, ttft_s = figures[i]
            text += f"; with {engine}'s the planner gives TPOT {tpot_s / MS:.4g} ms, TTFT {ttft_s / MS:.4g} ms for the same layout"
        else:
            text += f"; the planner has no figure for {engine} here"
        notes.append(text + f" (solve with engine: {engine} to size the plan for it)")
    return notes
