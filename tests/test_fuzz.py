"""Property tests over hostile input (hypothesis): mutated problem files, every estimate flag and
mutated plan JSON. Whatever the input, a command exits 0, 1, 2 or 3 and never raises; a refusal
names a field or a flag.

The CI profile runs 80 examples per property (240 in all); for a longer campaign:
    HYPOTHESIS_PROFILE=long pytest tests/test_fuzz.py
"""

import copy
import json
import math
import os

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cli.main import main
from planner.errors import PlannerInputError
from planner.output.plan_report import solve_record
from planner.paths import data_dir
from planner.problem.resolve import resolve_problem
from planner.problem.schema import parse_problem

settings.register_profile("ci", max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.register_profile("long", max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

PROBLEMS = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(data_dir("problems").glob("*.yaml"))}
HOSTILE_VALUES = st.one_of(
    st.sampled_from([0, -1, 1, 2**31, 10**12, 0.5, -0.0, 1e308, math.nan, math.inf, -math.inf, "", " ", "a$(touch PWNED)",
                     "x\ny", "../../etc/passwd", None, True, [], {}, [None], {"a": 1}]),
    st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
)


def _paths(node, prefix=()):
    """Every path into a nested dict/list, leaves and inner nodes alike."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*prefix, i))


def _mutate(document, path, value, action):
    doc = copy.deepcopy(document)
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if action == "delete":
        del parent[last]
    elif action == "duplicate" and isinstance(parent, list):
        parent.append(copy.deepcopy(parent[last]))
    else:
        parent[last] = value
    return doc


@st.composite
def mutated_problems(draw):
    name = draw(st.sampled_from(sorted(PROBLEMS)))
    raw = PROBLEMS[name]
    paths = list(_paths(raw))
    doc = raw
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        doc = _mutate(doc, path, draw(HOSTILE_VALUES), draw(st.sampled_from(["set", "set", "delete", "duplicate"])))
        paths = list(_paths(doc)) or [()]
    return doc


@given(mutated_problems())
def test_a_mutated_problem_is_resolved_or_refused_by_name(doc):
    try:
        resolve_problem(parse_problem(doc, source="fuzz.yaml"), base_dir=data_dir("problems"))
    except PlannerInputError as exc:
        assert exc.issues and all(issue.field and issue.fix for issue in exc.issues)


ESTIMATE_FLAGS = ["--tp", "--ep", "--pp", "--dp-attn", "--batch", "--redundant-experts", "--expert-imbalance", "--isl", "--osl",
                  "--price", "--prefill-chunk"]


@given(st.lists(st.tuples(st.sampled_from(ESTIMATE_FLAGS), st.one_of(
    st.sampled_from(["0", "-1", "nan", "inf", "-inf", "1e308", "1000000000", "abc", "", "3.5", "1"]),
    st.integers(-10, 5000).map(str))), max_size=3),
    st.sampled_from(["llama-3.1-70b", "deepseek-v3", "qwen3-30b-a3b"]), st.sampled_from(["hgx-h100", "gb200-nvl72", "mi300x-8"]))
def test_estimate_flags_exit_cleanly(capsys, flags, model, rack):
    argv = ["estimate", "--model", model, "--rack", rack] + [w for pair in flags for w in pair]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: a flag's own message
        code = exc.code
        assert "argument" in capsys.readouterr().err or code == 0
    assert code in (0, 1, 2, 3)
    assert "Traceback" not in capsys.readouterr().err


@pytest.fixture(scope="module")
def plan_record(solved_bundled):
    return solve_record(solved_bundled["deepseek-v3-wide-ep-skewed"][1])


@given(data=st.data())
def test_a_mutated_plan_is_checked_exported_or_refused(plan_record, tmp_path_factory, capsys, data):
    doc = plan_record
    for _ in range(data.draw(st.integers(1, 2))):
        paths = [p for p in _paths(doc) if p[:1] != ("problem_spec",) or len(p) < 4] or [()]
        path = data.draw(st.sampled_from(paths))
        doc = _mutate(doc, path, data.draw(HOSTILE_VALUES), data.draw(st.sampled_from(["set", "set", "delete"])))
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(json.dumps(doc))  # NaN and Infinity become the non-standard tokens, which must be refused too
    for argv in (["check", str(path)], ["export", str(path), "--format", "sglang"], ["view", str(path)]):
        code = main(argv)
        assert code in (0, 1, 2), argv
        assert "Traceback" not in capsys.readouterr().err
