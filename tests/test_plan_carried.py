"""The typed plan is carried end to end: the writer builds a `Plan`, every reader takes one, and no
reader looks a plan field up by its name in a dict (`planner/output/plan.py` and its parts,
`plan_records.py`, are the one place that knows the file's keys)."""

import ast
import json
from pathlib import Path

import pytest

from planner.output import plan as plan_module
from planner.output import plan_records
from planner.output.plan import Plan, PlanDeployment, parse_plan, plan_document
from planner.output.plan_writer import solve_plan, solve_record
from planner.output.validate import check_plan
from planner.paths import data_dir
from planner.problem.resolve import resolve_problem
from planner.problem.schema import load_problem
from planner.solver.solve import solve

PACKAGE = Path(__file__).resolve().parents[1] / "planner"
SCHEMA_HOME = {PACKAGE / "output" / "plan.py", PACKAGE / "output" / "plan_records.py"}
# the modules that read or write plans; any other module of output/, cli/ or service/ that imports the
# plan's schema joins them (`_plan_readers`)
READERS = [PACKAGE / "output" / name for name in ("validate.py", "plan_view.py", "plan_report.py", "plan_writer.py", "placement_picture.py",
                                                  "export.py", "engines.py", "kubernetes.py", "k8s_pods.py", "engine_note.py",
                                                  "checkpoints.py")] + \
          [PACKAGE / "cli" / "plans.py", PACKAGE / "cli" / "common.py", PACKAGE / "service" / "actions.py", PACKAGE / "service" / "inputs.py"]
REQUEST_BODIES = {"body"}  # the service's request bodies: what a client sent, read before it becomes a plan


def _plan_field_names() -> set[str]:
    models = [Plan, PlanDeployment] + [value for value in vars(plan_records).values()
                                       if isinstance(value, type) and issubclass(value, plan_records.BaseModel) and value.__module__ == plan_records.__name__]
    return set().union(*(m.model_fields for m in models))


def _imports_plan_schema(tree: ast.AST) -> bool:
    return any(isinstance(node, ast.ImportFrom) and node.module in ("planner.output.plan", "planner.output.plan_records")
               for node in ast.walk(tree))


def _plan_readers() -> list[Path]:
    found = set(READERS)
    for folder in ("output", "cli", "service"):
        found |= {p for p in (PACKAGE / folder).glob("*.py") if _imports_plan_schema(ast.parse(p.read_text()))}
    return sorted(found - SCHEMA_HOME)


def _key_lookups(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """`x["name"]`, `x.get("name")`, `x.pop("name")`, `x.setdefault("name")` and `"name" in x` with a plan field's name."""
    found = []
    for node in ast.walk(tree):
        key = target = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key, target = node.slice.value, node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop", "setdefault") \
                and node.args and isinstance(node.args[0], ast.Constant):
            key, target = node.args[0].value, node.func.value
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and isinstance(node.ops[0], ast.In | ast.NotIn):
            key, target = node.left.value, node.comparators[0]
        if isinstance(key, str) and key in names and not (isinstance(target, ast.Name) and target.id in REQUEST_BODIES):
            found.append((node.lineno, ast.unparse(node)[:90]))
    return found


def test_the_check_finds_a_dict_lookup_of_a_plan_field():
    """The scanner itself: the lookups the readers made before the plan was typed are found."""
    names = _plan_field_names()
    assert {"deployments", "placement", "ep_rank", "physical_to_logical_map", "tpot_s", "kv_tier", "accelerators_per_host"} <= names
    old = ast.parse('d.get("role", "aggregated")\nrecord["deployments"][0]\nif "placement" not in d: pass\nemap["n_ranks"]\nbody.get("plan")')
    assert sorted(text for _, text in _key_lookups(old, names)) == ["'placement' not in d", "d.get('role', 'aggregated')", "emap['n_ranks']",
                                                                     "record['deployments']"]


def test_no_reader_looks_up_a_plan_field_by_name():
    names = _plan_field_names()
    readers = _plan_readers()
    assert len(readers) >= len(READERS)
    offending = {str(p.relative_to(PACKAGE)): hits for p in readers if (hits := _key_lookups(ast.parse(p.read_text()), names))}
    assert offending == {}, f"plan fields looked up by name outside output/plan.py (read the typed Plan instead): {offending}"


@pytest.fixture(scope="module")
def written():
    """Two bundled problems solved: an MoE plan with expert maps, and a pair of prefill and decode pools."""
    out = {}
    for name in ("deepseek-v3-wide-ep-skewed", "disaggregation-wins-long-prompts"):
        path = data_dir("problems") / f"{name}.yaml"
        resolved = resolve_problem(load_problem(path), base_dir=path.parent)
        out[name] = (resolved, solve(resolved, workers=1))
    return out


def test_a_written_plan_reads_back_to_the_same_bytes(written):
    """What `planner solve --json` writes, read through the schema and written again: the same text,
    so readers that take the typed plan see exactly what the file holds."""
    for _, result in written.values():
        text = json.dumps(solve_record(result), indent=2)
        again = plan_document(parse_plan(json.loads(text), "plan.json"))
        assert json.dumps(again, indent=2) == text


def test_readers_take_the_typed_plan(written):
    resolved, result = written["disaggregation-wins-long-prompts"]
    plan = solve_plan(result)
    assert isinstance(plan, Plan) and all(isinstance(d, PlanDeployment) for d in plan.deployments)
    assert check_plan(resolved, plan, placement=True) == []
    # a deployment's typed accessors against its own fields, worked by hand: replicas x tp x dp_attn x pp entries
    for d in plan.deployments:
        assert d.expected_placement == d.replicas * d.tp * d.dp_attn * d.pp == len(d.placement)
    assert plan.placed_accelerators == sum(d.replicas * d.accelerators_per_replica for d in plan.deployments)
    assert plan_module.plan_document(plan) == solve_record(result)
