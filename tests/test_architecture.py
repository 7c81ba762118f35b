"""The package's shape: subpackages follow the pipeline without cycles, modules and functions stay
small, and unit constants live in one place. Read from the source with `ast`, not by importing."""

import ast
import re
import sys
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "planner"
# The pipeline, upstream first: a subpackage may import only from those before it (and the leaves).
PIPELINE = ["model", "hardware", "physics", "probe", "problem", "placement", "solver", "studies", "output", "cli", "service"]
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
UNIT_HOME = PACKAGE / "units.py"
BARE_UNIT_LITERAL = re.compile(r"(?<![\w.])(3600(\.0)?|1e6|1e9|1e12)(?![\w.])")


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_data" not in p.parts)


FACES = {"__init__.py", "__main__.py", "quick.py"}  # the public face sits on top of everything


def _group(module: Path) -> str:
    """The subpackage a module belongs to, 'face' for the public face, 'leaf' for other top-level modules."""
    rel = module.relative_to(PACKAGE).parts
    return rel[0] if len(rel) > 1 else "face" if rel[0] in FACES else "leaf"


def _imported_groups(module: Path) -> set[str]:
    groups = set()
    for node in ast.walk(ast.parse(module.read_text())):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        for name in names:
            parts = name.split(".")
            if parts[0] == "planner" and len(parts) > 1:
                groups.add(parts[1] if parts[1] in PIPELINE else "leaf")
    return groups


def _package_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for module in _modules():
        for target in _imported_groups(module) - {_group(module)}:
            graph.add_edge(_group(module), target)
    return graph


def test_subpackages_import_without_cycles():
    cycles = list(nx.simple_cycles(_package_graph()))
    assert cycles == [], f"import cycles between subpackages: {cycles}"


def _module_of(name: str) -> Path | None:
    """The file of dotted module `name` inside the package (a package's __init__.py), None outside it."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py" if (path / "__init__.py").exists() else None


def _imported_modules(module: Path) -> set[Path]:
    """Every package file `module` imports, wherever the import sits (under TYPE_CHECKING, inside a
    function): `from a.b import c` imports a/b/c.py when that is a module, else a/b.py."""
    found = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Import):
            found |= {_module_of(a.name) for a in node.names if a.name.startswith("planner.")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("planner"):
            subs = {_module_of(f"{node.module}.{a.name}") for a in node.names} - {None}
            found |= subs or {_module_of(node.module)}
    return found - {None, module}


def test_modules_import_without_cycles():
    """No file imports itself through others (a circle makes import order matter and splits one
    idea over two files), with imports under TYPE_CHECKING and inside functions counted."""
    graph = nx.DiGraph()
    for module in _modules():
        graph.add_node(module)
        graph.add_edges_from((module, target) for target in _imported_modules(module))
    cycles = [[str(m.relative_to(PACKAGE)) for m in cycle] for cycle in nx.simple_cycles(graph)]
    assert cycles == [], f"import cycles between modules: {cycles}"


def test_the_cycle_check_sees_a_circle(tmp_path, monkeypatch):
    """The check above finds a circle hidden under TYPE_CHECKING (a check that cannot fail is none)."""
    package = tmp_path / "planner"
    package.mkdir()
    (package / "a.py").write_text("from planner.b import f\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from planner import a\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    with pytest.raises(AssertionError, match="a.py"):
        test_modules_import_without_cycles()


def test_subpackages_import_only_upstream_in_pipeline_order():
    rank = {name: i for i, name in enumerate(["leaf", *PIPELINE, "face"])}
    backwards = [(a, b) for a, b in _package_graph().edges if rank[b] > rank[a]]
    assert backwards == [], f"imports against the pipeline order: {backwards}"


@pytest.mark.parametrize("module", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_and_functions_stay_small(module):
    text = module.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{module.name}: {len(text.splitlines())} lines"
    long = [(f.name, f.end_lineno - f.lineno + 1) for f in ast.walk(ast.parse(text))
            if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == [], f"{module.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def _code_lines(module: Path) -> list[tuple[int, str]]:
    """Lines of code with comments and docstrings removed (a unit named in prose is fine)."""
    text = module.read_text()
    docstrings = {n.value.lineno for n in ast.walk(ast.parse(text))
                  if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
    return [(i, line.split("#", 1)[0]) for i, line in enumerate(text.splitlines(), 1) if i not in docstrings]


def test_unit_constants_have_one_home():
    bare = [f"{m.relative_to(PACKAGE)}:{i}: {line.strip()}" for m in _modules() if m != UNIT_HOME
            for i, line in _code_lines(m) if BARE_UNIT_LITERAL.search(line)]
    assert bare == [], "write these with the constants of planner/units.py:\n" + "\n".join(bare)


REPO = PACKAGE.parent
LINK = re.compile(r"\]\(([^)#\s]+)[^)]*\)|`(\.\./[^`\s]+)`")


def test_nothing_points_outside_the_repository():
    """A clone has only this repository: no file refers to the team's shared folder, and every
    relative link in the Markdown resolves to a file inside the repository."""
    texts = [p for d in ("planner", "tests", "examples", "benchmarks", "docs", "topologies", "models", "problems")
             for p in (REPO / d).rglob("*") if p.suffix in {".py", ".md", ".yaml", ".csv"}] + [REPO / "README.md"]
    team_folder = "../" + "shared"  # written in two parts so that this test does not find itself
    outside = [str(p.relative_to(REPO)) for p in texts if team_folder in p.read_text()]
    assert outside == []
    broken = []
    for md in [p for p in texts if p.suffix == ".md"]:
        for match in LINK.finditer(md.read_text()):
            target = match.group(1) or match.group(2)
            if "://" in target or target.startswith("mailto:"):
                continue
            resolved = (md.parent / target).resolve()
            if not resolved.is_relative_to(REPO) or not resolved.exists():
                broken.append(f"{md.relative_to(REPO)}: {target}")
    assert broken == []
