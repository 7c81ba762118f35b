"""README.md's "Python API" example runs as printed and prints what the README says it prints; the
package docstring's example runs too."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_the_readme_python_example_runs_as_printed():
    section = _section((ROOT / "README.md").read_text(), "Python API")
    code, printed = re.findall(r"```(?:python)?\n(.*?)```", section, flags=re.DOTALL)[:2]
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout == printed


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_package_docstring_example_runs():
    import planner

    lines = planner.__doc__.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    "))
    block = [line[4:] for line in lines[start:] if line.startswith("    ") or not line.strip()]
    code = "\n".join(block[:next((i for i, line in enumerate(block) if not line.strip()), len(block))])
    assert "planner.check_plan(resolved, record)" in code and "planner.solve(resolved)" in code
    done = _run(code)
    assert done.returncode == 0, done.stderr
