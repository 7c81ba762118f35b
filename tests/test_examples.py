"""Every claim example runs in quick mode and prints its claim line (charts go to a temporary dir)."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("claim_*.py"))


def test_there_is_an_example_per_claim():
    numbers = {int(p.stem.split("_")[1]) for p in EXAMPLES}
    assert numbers == set(range(1, 13))  # every numbered claim of docs/physics.md


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(script, tmp_path):
    done = subprocess.run([sys.executable, str(script), "--quick", "--out", str(tmp_path)], capture_output=True, text=True, check=False,
                          timeout=300, cwd=script.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    number = int(script.stem.split("_")[1])
    assert f"claim {number}:" in done.stdout
    for line in done.stdout.splitlines():
        if line.startswith("chart: "):
            assert Path(line.removeprefix("chart: ")).read_bytes()[:4] == b"\x89PNG"
