"""`planner probe`: measure the step model's kernels on this machine at the shapes of the models named
and write them as kernel tables for `planner calibrate` (planner/probe/). Needs PyTorch (the `probe` extra)."""

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console

from planner.cli.common import EXIT_OK
from planner.errors import InputIssue, PlannerInputError, unknown_name_issue
from planner.model.architecture import ModelArch
from planner.model.catalog import arch_from_spec, load_model_catalog
from planner.units import US

__all__ = ["probe_command"]

NEEDS = InputIssue("probe", "needs PyTorch, pandas and pyarrow", 'pip install "llm-deployment-planner[probe]" (or a PyTorch build for your GPU)')
SMOKE_WARMUP, SMOKE_ITERATIONS = 1, 3


def _archs(names: list[str]) -> list[ModelArch]:
    """Catalog ids or config.json paths."""
    from planner.model.hf_config import load_hf_config

    catalog, archs, issues = load_model_catalog(), [], []
    for name in names:
        if name in catalog:
            archs.append(catalog[name])
        elif name.endswith(".json") and Path(name).is_file():
            archs.append(arch_from_spec(load_hf_config(Path(name))))
        else:
            issues.append(unknown_name_issue("models", "model (catalog id or config.json file)", name, catalog))
    if issues:
        raise PlannerInputError(issues)
    return archs


class _Progress:
    """One status line, rewritten in place on a terminal, printed at most once a second elsewhere."""

    def __init__(self, budget_s: float):
        self.start, self.budget_s, self.last = time.monotonic(), budget_s, 0.0
        self.tty = sys.stderr.isatty()

    def __call__(self, text: str) -> None:
        now = time.monotonic()
        if not self.tty and now - self.last < 1.0:
            return
        self.last = now
        line = f"probe {now - self.start:6.1f} s of {self.budget_s:.0f} s  {text}"
        sys.stderr.write(f"\r{line:<80}" if self.tty else line + "\n")
        sys.stderr.flush()


def probe_command(args: argparse.Namespace, console: Console) -> int:
    try:
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
        import torch
    except ImportError:
        raise PlannerInputError(NEEDS) from None
    from planner.hardware.probe_layout import PROBE_FILE
    from planner.probe.run import run_probe
    from planner.probe.shapes import REFERENCE_MODELS, plan_shapes
    from planner.probe.timing import open_device

    archs = _archs(args.models)
    catalog = load_model_catalog()
    plan = plan_shapes(archs, {k: catalog[v] for k, v in REFERENCE_MODELS.items()}, args.smoke)
    warmup = SMOKE_WARMUP if args.smoke else args.warmup
    device = open_device(args.smoke, warmup, SMOKE_ITERATIONS if args.smoke else args.iterations)
    if not device.is_gpu and not args.smoke:
        raise PlannerInputError(InputIssue("probe", "PyTorch sees no GPU (CUDA or ROCm build) on this machine",
                                           "run it on the GPU node with a GPU build of PyTorch, or pass --smoke to check the path on a CPU"))
    ranks = args.ranks or (torch.cuda.device_count() if device.is_gpu else 1)
    out = Path(args.out)
    try:  # before measuring: a GPU's minutes are not spent on tables that cannot be written
        out.mkdir(parents=True, exist_ok=True)
        (out / PROBE_FILE).touch()
    except OSError as exc:
        raise PlannerInputError(InputIssue("--out", f"{out} cannot be written ({exc.strerror or exc})",
                                           "pass a directory you can write (new, or an earlier probe's)")) from None
    console.print(f"probing {device.torch_device} ({plan.count()} shapes of {', '.join(plan.models)}; budget {args.budget_s:.0f} s)", markup=False)
    record = run_probe(device, plan, out, args.budget_s, ranks, _Progress(args.budget_s), args.smoke)
    sys.stderr.write("\n")
    run = record["run"]
    console.print(f"{record['probe']['device']}: {sum(run['rows'].values())} shapes in {run['elapsed_s']:.1f} s", markup=False)
    for table, rows in run["rows"].items():
        console.print(f"  {table}: {rows}", markup=False)
    for what, count in run["skipped"].items():
        console.print(f"  skipped {count} shapes of {what}: {run['first_errors'].get(what, '')}", markup=False)
    for what, why in run["not_measured"].items():
        console.print(f"  not measured: {what}: {why}", markup=False)
    for reason, us in (record["probe"].get("throttled_during_probe_us") or {}).items():
        console.print(f"  throttled during the probe: {reason} for {us * US:.1f} s of {run['elapsed_s']:.1f} s (its rates may be below "
                      f"the part's: cool it or raise its power limit and probe again)", markup=False)
    console.print(f"wrote {out / PROBE_FILE} and its tables; next: planner calibrate {out} --out CATALOG_DIR", markup=False)
    return EXIT_OK
