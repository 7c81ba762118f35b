"""What a solve returns: the chosen deployments (candidate, replicas, full estimate, expert
placement), the solver's statistics, and the plan's explanation or the infeasibility report."""

from dataclasses import dataclass

from planner.modes import ServingRole, SolveStatus
from planner.physics.cost import usd_per_million_tokens
from planner.physics.estimate import Estimate
from planner.placement.experts import ExpertPlacement
from planner.placement.fleet import FleetPlacement, PlacedDeployment
from planner.problem.resolve import ResolvedProblem
from planner.solver.candidates import (
    Candidate,
    RackAnalysis,
    pair_ttft_s,
    served_tokens_per_s,
)
from planner.solver.findings import InfeasibilityReport, PlanExplanation
from planner.solver.model_builder import PlanningData
from planner.units import SECONDS_PER_HOUR

__all__ = ["Deployment", "SolveResult", "SolverStats"]


@dataclass(frozen=True)
class SolverStats:
    status: SolveStatus
    objective: float | None  # in objective_unit
    best_bound: float | None
    gap: float | None  # |objective - bound| / |objective|
    wall_time_s: float  # CP-SAT solves only
    total_time_s: float  # candidates + model + solves
    objective_unit: str
    time_limit_s: float
    seed: int
    workers: int
    n_candidates: int
    n_variables: int
    n_constraints: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", SolveStatus(self.status))  # a status given by name


@dataclass(frozen=True)
class Deployment:
    candidate: Candidate
    replicas: int
    estimate: Estimate
    experts: ExpertPlacement | None = None

    @property
    def accelerators(self) -> int:
        return self.replicas * self.candidate.accelerators

    @property
    def usd_per_hour(self) -> float:
        return self.replicas * self.candidate.usd_per_hour

    @property
    def output_tokens_per_s(self) -> float:
        return self.replicas * self.candidate.output_tokens_per_s

    def placed(self) -> PlacedDeployment:
        """What the fleet placement needs of this deployment."""
        return PlacedDeployment(self.candidate.rack_id, self.candidate.layout, self.replicas, self.estimate.inputs.arch.n_layers)


@dataclass(frozen=True)
class SolveResult:
    """A solve: the chosen deployments with their figures, the solver's statistics, the data it
    chose from, and what explains the plan (or why there is none)."""

    problem: ResolvedProblem
    status: SolveStatus
    stats: SolverStats
    deployments: tuple[Deployment, ...]
    data: PlanningData
    analyses: dict[tuple[str, str], RackAnalysis]
    explanation: PlanExplanation | None = None
    infeasibility: InfeasibilityReport | None = None
    placement: FleetPlacement | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", SolveStatus(self.status))  # a status given by name
        object.__setattr__(self, "deployments", tuple(self.deployments))
        object.__setattr__(self, "notes", tuple(self.notes))

    @property
    def has_plan(self) -> bool:
        return self.status.has_plan and bool(self.deployments)

    @property
    def usd_per_hour(self) -> float:
        return sum(d.usd_per_hour for d in self.deployments)

    @property
    def accelerators(self) -> int:
        return sum(d.accelerators for d in self.deployments)

    def of_workload(self, workload: str, role: ServingRole | None = None) -> list[Deployment]:
        return [d for d in self.deployments if d.candidate.workload == workload and (role is None or d.candidate.role is role)]

    def is_split(self, workload: str) -> bool:
        """Served by prefill and decode pools."""
        return any(d.candidate.role is not ServingRole.AGGREGATED for d in self.of_workload(workload))

    def workload_ttft_s(self, workload: str) -> float:
        """Worst TTFT a request of `workload` sees: over aggregated replicas, or over every
        prefill-decode pair the plan may route it through."""
        if self.is_split(workload):
            return max(pair_ttft_s(p.candidate, q.candidate) for p in self.of_workload(workload, ServingRole.PREFILL)
                       for q in self.of_workload(workload, ServingRole.DECODE))
        return max(d.estimate.ttft_s for d in self.of_workload(workload))

    def workload_tpot_s(self, workload: str) -> float:
        return max(d.estimate.tpot_s for d in self.of_workload(workload) if d.candidate.role is not ServingRole.PREFILL)

    def workload_usd_per_million_output_tokens(self, workload: str) -> float:
        """The plan's cost per output token for `workload`: its deployments' cost over the tokens they
        make (with a demand), or the per-token cost of its one replica or replica pair."""
        mine = self.of_workload(workload)
        if self.data.demand_tokens_per_s.get(workload) is None:
            return sum(d.candidate.usd_per_million_output_tokens for d in mine)
        return usd_per_million_tokens(sum(d.usd_per_hour for d in mine) / SECONDS_PER_HOUR, self.served_output_tokens_per_s(workload))

    def served_output_tokens_per_s(self, workload: str) -> float:
        """Output tokens per second the plan serves for `workload`: its aggregated replicas', or with
        prefill and decode pools the smaller of what decode makes and prefill feeds."""
        return served_tokens_per_s((d.candidate, d.replicas) for d in self.of_workload(workload))

    def fed_output_tokens_per_s(self, workload: str) -> float | None:
        """Output tokens per second the prompts `workload`'s prefill pool prefills will make (None: no pool)."""
        pool = self.of_workload(workload, ServingRole.PREFILL)
        return sum(d.output_tokens_per_s for d in pool) if pool else None
