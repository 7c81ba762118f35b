"""The part of a plan in service that a new problem reads: each deployment's expert map.

`placement.previous_plan` names the plan file (`planner solve --json`) of the deployment that is
serving now, so that new expert maps stay close to its maps. The problem stage comes before the
output stage that owns the plan schema, so it reads the file through this typed view of the few
fields it needs; every other field of the plan is ignored here (the full schema checks them)."""

from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
)

from planner.errors import InputIssue, PlannerInputError, load_json_file
from planner.model.architecture import ModelArch

__all__ = ["previous_expert_maps"]

FIELD = "placement.previous_plan"


class _Read(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)


class _ExpertMap(_Read):
    n_ranks: PositiveInt
    slots_per_rank: PositiveInt
    physical_to_logical_map: list[list[NonNegativeInt]] = Field(min_length=1)


class _Deployment(_Read):
    model: str
    expert_map: _ExpertMap | None = None


class _PlanInService(_Read):
    deployments: list[_Deployment]


def _read(path: Path) -> _PlanInService:
    document = load_json_file(path, fix="point it at the JSON of the plan in service")
    try:
        return _PlanInService.model_validate(document)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise PlannerInputError(InputIssue(FIELD, f"{path} is not a plan written by `planner solve --json` ({where}: {first['msg']})",
                                           "point it at the JSON of the plan in service")) from None


def _shape_issues(maps: dict[tuple[str, int, int], list[list[int]]], archs: dict[str, ModelArch]) -> list[InputIssue]:
    issues = []
    for (model_id, ranks, slots), rows in maps.items():
        arch = archs.get(model_id)
        if arch is not None and (len(rows) != arch.n_layers or any(len(row) != ranks * slots for row in rows)):
            issues.append(InputIssue(FIELD, f"the expert map of {model_id} has {len(rows)} rows of {len(rows[0])} slots, "
                                            f"{arch.n_layers} rows of {ranks * slots} expected", "use a plan of the same model"))
    return issues


def previous_expert_maps(path: Path, archs: dict[str, ModelArch], issues: list[InputIssue]) -> dict[tuple[str, int, int], list[list[int]]]:
    """Expert maps of the plan in service, keyed by (model id, ranks, slots per rank); what is wrong
    with the file goes to `issues` under the problem's field name."""
    try:
        plan = _read(path)
    except PlannerInputError as exc:
        issues += [issue if issue.field == FIELD else InputIssue(FIELD, f"{issue.field}: {issue.problem}", issue.fix) for issue in exc.issues]
        return {}
    maps = {(d.model, d.expert_map.n_ranks, d.expert_map.slots_per_rank): [list(row) for row in d.expert_map.physical_to_logical_map]
            for d in plan.deployments if d.expert_map is not None}
    issues += _shape_issues(maps, archs)
    return maps
