"""Shared command line of the claim examples: `--quick` (small sweeps, for the test suite) and
`--out DIR` (where charts go; default examples/out)."""

import argparse
from pathlib import Path


def parse_args(doc: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sweep points (used by the tests)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out", help="directory for charts")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def row(*cells, widths=None) -> str:
    widths = widths or [24] + [14] * (len(cells) - 1)
    return "".join(f"{c!s:<{w}}" if i == 0 else f"{c!s:>{w}}" for i, (c, w) in enumerate(zip(cells, widths)))
