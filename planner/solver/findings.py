"""What the solver says about a plan (planner.solver.explain) or about a problem without one
(planner.solver.infeasibility): records only, so that the solve result can carry them typed."""

from dataclasses import dataclass

from planner.modes import ConstraintFamily
from planner.units import format_usd

__all__ = ["TIE_FRACTION", "Alternative", "Conflict", "DeploymentExplanation", "InfeasibilityReport", "PlanExplanation", "RackComparison"]

# Objectives closer than this are ties: above the micro-dollar rounding of CP-SAT's integer objective
# (model_builder.USD_RESOLUTION on costs of cents and up), below any difference worth reporting.
TIE_FRACTION = 1e-5


@dataclass(frozen=True)
class DeploymentExplanation:
    workload: str
    rack: str
    binding: str
    dominant: str


@dataclass(frozen=True)
class RackComparison:
    workload: str
    rack: str
    best: str  # best layout on this rack type, or why there is none
    usd_per_million_output_tokens: float | None
    relative_to_chosen: float | None
    not_chosen_because: str = ""  # when it is cheaper per token than the plan: what ruled it out


@dataclass(frozen=True)
class Alternative:
    description: str
    objective: float | None
    delta_fraction: float | None
    reason: str

    @property
    def ties(self) -> bool:
        """Within the solver's objective resolution of the plan (the integer units of the CP-SAT objective)."""
        return self.delta_fraction is not None and abs(self.delta_fraction) < TIE_FRACTION


@dataclass(frozen=True)
class PlanExplanation:
    deployments: tuple[DeploymentExplanation, ...]
    fleet: tuple[str, ...]
    racks: tuple[RackComparison, ...]
    alternative: Alternative | None

    def lines(self) -> list[str]:
        out = [f"{d.workload} on {d.rack}: {d.binding}; {d.dominant}" for d in self.deployments]
        out += list(self.fleet)
        for r in self.racks:
            if r.relative_to_chosen is not None:
                out.append(f"{r.workload} on {r.rack}: best is {r.best} at {format_usd(r.usd_per_million_output_tokens)}/M output "
                           f"tokens ({r.relative_to_chosen:.2f}x the plan's blended cost for {r.workload})"
                           + (f"; not chosen: {r.not_chosen_because}" if r.not_chosen_because else ""))
            else:
                out.append(f"{r.workload} on {r.rack}: {r.best}")
        if self.alternative is not None and self.alternative.ties:
            out.append(f"an equally good alternative: {self.alternative.description} ({self.alternative.reason}); the plan is "
                       "the canonical choice among ties (fewer deployments, then catalog order, then fewer replicas)")
        elif self.alternative is not None:
            out.append(f"best rejected alternative: {self.alternative.description} ({self.alternative.reason})")
        return out



@dataclass(frozen=True)
class Conflict:
    families: tuple[ConstraintFamily, ...]
    message: str
    relax: tuple[str, ...]


@dataclass(frozen=True)
class InfeasibilityReport:
    summary: str
    conflicts: tuple[Conflict, ...]
