"""A probe run: the shapes of the models given (shapes.py), measured class by class within a time
budget (kernels.py, collectives.py), written as kernel tables in aiconfigurator-core's parquet layout
and column names (milliseconds per layer and GPU) under `<out>/probe/<family>/torch/<torch version>/`,
with `<out>/probe.yaml` recording the machine and the run (provenance.py).

The time left is shared among the classes not yet measured, by weight. A class measures its shapes
coarse to fine and stops when its share is spent, but never before MIN_SHAPES: the budget trims
shapes, never classes.
Two tables are the probe's own (aiconfigurator has none): elementwise/.../elementwise_perf.parquet
(op, num_tokens, width, bytes, latency) and mem/.../mem_perf.parquet (op, bytes, bytes_moved, latency)."""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
import yaml

from planner.hardware.probe_layout import PROBE_ENGINE, PROBE_FILE, PROBE_SYSTEM
from planner.probe import decode_step, kernels
from planner.probe.collectives import collective_rows
from planner.probe.provenance import provenance, throttle_counters_us, throttled_us
from planner.probe.shapes import Plan
from planner.probe.timing import Device
from planner.units import MS

__all__ = ["CLASS_WEIGHTS", "MIN_SHAPES", "Budget", "ProbeRun", "run_probe"]

MIN_SHAPES = 8  # calibrate fits a table of at least 8 shapes (collectives: 4 sizes)
CLASS_WEIGHTS = {"gemm": 4.0, "moe": 1.5, "attention_decode": 1.5, "attention_prefill": 1.0, "mla_decode": 1.0, "mla_prefill": 1.0,
                 "elementwise": 0.5, "hbm": 0.5, "decode_step": 0.5, "collectives": 1.0}
KERNEL_ERRORS = (RuntimeError, ValueError)  # out of memory (a RuntimeError), or a shape or format the device's kernel refuses


@dataclass
class ProbeRun:
    """What a run measured: rows per table, shapes skipped, classes not measured and why."""

    tables: dict[tuple[str, str], list[dict]] = field(default_factory=dict)  # (family, file) -> rows
    skipped: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # the first error of each class that skipped shapes
    not_measured: dict[str, str] = field(default_factory=dict)
    measured: dict[str, int] = field(default_factory=dict)

    def add(self, family: str, name: str, row: dict) -> None:
        self.tables.setdefault((family, name), []).append(row)


def _timed(shapes: list[dict], budget_s: float, measure: Callable[[dict], float | None], progress: Callable[[str], None],
           label: str) -> list[tuple[dict, float]]:
    """(shape, seconds) of `shapes` in order until `budget_s` is spent (at least MIN_SHAPES measured)."""
    start, out = time.monotonic(), []
    for i, shape in enumerate(shapes):
        if len(out) >= MIN_SHAPES and time.monotonic() - start > budget_s:
            break
        progress(f"{label}: shape {i + 1}/{len(shapes)}")
        latency_s = measure(shape)
        if latency_s is not None:
            out.append((shape, latency_s))
    return out


def _guarded(call: Callable[[], float], run: ProbeRun, label: str, device: Device) -> float | None:
    """`call()`, or None (counted as skipped, the first error kept) when the shape does not fit the
    device's memory or its kernel refuses it."""
    try:
        return call()
    except KERNEL_ERRORS as exc:
        run.skipped[label] = run.skipped.get(label, 0) + 1
        run.errors.setdefault(label, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        if device.is_gpu:
            torch.cuda.empty_cache()
        return None


def _gemm(device: Device, plan: Plan, run: ProbeRun, budget_s: float, progress) -> None:
    formats = {"bfloat16": None}
    fp8 = kernels.fp8_dtype(device)
    if fp8 is not None:
        formats["fp8"] = fp8
    else:
        run.not_measured["gemm fp8"] = "no fp8 GEMM on this device (torch._scaled_mm)"
    for name, dtype in formats.items():
        measure = lambda s, name=name, dtype=dtype: _guarded(lambda: kernels.gemm_s(device, s["m"], s["n"], s["k"], dtype), run, f"gemm {name}", device)
        for shape, latency_s in _timed(plan.shapes["gemm"], budget_s / len(formats), measure, progress, f"gemm {name}"):
            run.add("gemm", "gemm_perf.parquet", {"gemm_dtype": name, **shape, "latency": latency_s / MS})


def _moe(device: Device, plan: Plan, run: ProbeRun, budget_s: float, progress) -> None:
    measure = lambda s: _guarded(lambda: kernels.expert_gemm_s(device, **s), run, "moe", device)
    for shape, latency_s in _timed(plan.shapes["moe"], budget_s, measure, progress, "moe"):
        run.add("moe", "moe_perf.parquet", {"moe_dtype": "bfloat16", "distribution": "balanced", "kernel_source": "torch_bmm", **shape,
                                            "latency": latency_s / MS})


def _attention(device: Device, plan: Plan, run: ProbeRun, budgets: "Budget", progress) -> None:
    backend = kernels.attention_backend(device)
    kv = {"attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "window_size": 0}
    jobs = (
        ("attention_decode", "attention", "generation_attention_perf.parquet", kv | {"kernel_source": backend},
         lambda s: kernels.gqa_decode_s(device, backend, **s)),
        ("attention_prefill", "attention", "context_attention_perf.parquet", kv | {"kernel_source": backend},
         lambda s: kernels.gqa_prefill_s(device, backend, **s)),
        ("mla_decode", "mla", "generation_mla_perf.parquet", {"kv_cache_dtype": "bfloat16", "kernel_source": "torch-bmm"},
         lambda s: kernels.mla_decode_s(device, **s)),
        ("mla_prefill", "mla", "context_mla_perf.parquet", {"mla_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "kernel_source": "torch-sdpa"},
         lambda s: kernels.mla_prefill_s(device, **s)),
    )
    for label, family, name, fixed, kernel in jobs:
        measure = lambda s, kernel=kernel, label=label: _guarded(lambda: kernel(s), run, label, device)
        for shape, latency_s in _timed(plan.shapes[label], budgets[label], measure, progress, label):
            run.add(family, name, fixed | shape | {"latency": latency_s / MS})


def _memory(device: Device, plan: Plan, run: ProbeRun, budgets: "Budget", progress) -> None:
    measure = lambda s: _guarded(lambda: kernels.elementwise_s(device, **s), run, "elementwise", device)
    for shape, latency_s in _timed(plan.shapes["elementwise"], budgets["elementwise"], measure, progress, "elementwise"):
        run.add("elementwise", "elementwise_perf.parquet", {**shape, "dtype": "bfloat16", "bytes": kernels.elementwise_bytes(**shape),
                                                            "latency": latency_s / MS})
    measure = lambda s: _guarded(lambda: kernels.hbm_copy_s(device, s["bytes"]), run, "hbm", device)
    for shape, latency_s in _timed(plan.shapes["hbm"], budgets["hbm"], measure, progress, "hbm"):
        run.add("mem", "mem_perf.parquet", {"op": "copy", "bytes": shape["bytes"], "bytes_moved": 2 * shape["bytes"], "latency": latency_s / MS})


def _decode_steps(device: Device, plan: Plan, run: ProbeRun, budget_s: float, progress) -> None:
    """Whole decode steps of the dense models (a check of the kernels' sum, not fitted), model by model."""
    models: dict[str, object] = {}

    def measure(shape: dict) -> float | None:
        dims = {k: v for k, v in shape.items() if k not in ("batch_size", "context")}
        if shape["model"] not in models:
            models.clear()  # one model's weights on the device at a time
            if device.is_gpu:
                torch.cuda.empty_cache()
            models[shape["model"]] = _guarded(lambda: decode_step.build_step_model(device, dims), run, "decode_step", device)
        model = models[shape["model"]]
        return None if model is None else _guarded(lambda: decode_step.decode_step_s(device, model, shape["batch_size"], shape["context"]),
                                                   run, "decode_step", device)

    source = "cuda-graph" if device.is_gpu else "eager"
    for shape, latency_s in _timed(plan.shapes["decode_step"], budget_s, measure, progress, "decode step"):
        run.add("step", "decode_step_perf.parquet", shape | {"kernel_source": source, "latency": latency_s / MS})


def _collectives(device: Device, plan: Plan, run: ProbeRun, ranks: int, progress) -> None:
    if ranks < 2:
        run.not_measured["collectives"] = "one device: collectives need two or more (on a CPU, --ranks 2 runs them over gloo)"
        return
    progress(f"collectives over {ranks} ranks")
    sizes = [s["message_size"] for s in plan.shapes["collectives"]]
    for row in collective_rows(device, ranks, sizes):
        run.add("comm", "nccl_perf.parquet", {"nccl_dtype": "half", "op_name": row["op_name"], "num_gpus": ranks,
                                              "message_size": row["message_size"], "latency": row["latency_s"] / MS})


class Budget:
    """The time left, shared among the classes not yet measured by CLASS_WEIGHTS: a class that ends
    early leaves its time to the ones after it."""

    def __init__(self, budget_s: float, weights: dict[str, float]):
        self.deadline = time.monotonic() + budget_s
        self.weights = dict(weights)

    def __getitem__(self, name: str) -> float:
        """The share of class `name` (taken when it starts; it is then no longer waiting)."""
        left = max(0.0, self.deadline - time.monotonic())
        share = left * self.weights[name] / sum(self.weights.values())
        del self.weights[name]
        return share


def measure_all(device: Device, plan: Plan, budget_s: float, ranks: int, progress: Callable[[str], None]) -> ProbeRun:
    """Every class of `plan` on `device`, within `budget_s` (trimming shapes, never classes)."""
    weights = {k: w for k, w in CLASS_WEIGHTS.items() if k != "collectives" or ranks > 1}
    budgets = Budget(budget_s, weights)
    run = ProbeRun()
    with torch.inference_mode():
        _gemm(device, plan, run, budgets["gemm"], progress)
        _moe(device, plan, run, budgets["moe"], progress)
        _attention(device, plan, run, budgets, progress)
        _memory(device, plan, run, budgets, progress)
        _decode_steps(device, plan, run, budgets["decode_step"], progress)
    _collectives(device, plan, run, ranks, progress)
    run.measured = {f"{family}/{name}": len(rows) for (family, name), rows in run.tables.items()}
    return run


def write_tables(out: Path, run: ProbeRun, record: dict) -> Path:
    """The tables under `out/probe/...` and `out/probe.yaml`; returns the probe.yaml path."""
    version = str(torch.__version__)
    for (family, name), rows in run.tables.items():
        engine = "nccl" if family == "comm" else PROBE_ENGINE
        folder = out / PROBE_SYSTEM / family / engine / version
        folder.mkdir(parents=True, exist_ok=True)
        frame = pd.DataFrame(rows)
        for i, (column, value) in enumerate((("framework", "PyTorch"), ("version", version), ("device", str(record["probe"]["device"])))):
            frame.insert(i, column, value)  # the leading columns of aiconfigurator's tables
        frame.to_parquet(folder / name, index=False)
    path = out / PROBE_FILE
    path.write_text(yaml.safe_dump(record, sort_keys=False, width=200))
    return path


def run_probe(device: Device, plan: Plan, out: Path, budget_s: float, ranks: int, progress: Callable[[str], None], smoke: bool) -> dict:
    """Measure, write the tables and probe.yaml; returns the probe.yaml record."""
    start, counters = time.monotonic(), throttle_counters_us(device)
    run = measure_all(device, plan, budget_s, ranks, progress)
    throttled = throttled_us(counters, throttle_counters_us(device)) if counters else None
    backends = {"attention": kernels.attention_backend(device), "mla_decode": "torch-bmm", "mla_prefill": "torch-sdpa",
                "gemm": "torch.matmul / torch._scaled_mm", "moe": "torch.bmm (balanced routing)"}
    # how long the GPU ran throttled during the probe, by reason (nvidia-smi's counters; absent where it has none)
    during = {"throttled_during_probe_us": throttled} if throttled is not None else {}
    record = {"probe": provenance(device, backends) | {"ranks": ranks} | during,
              "run": {"models": list(plan.models), "budget_s": budget_s, "elapsed_s": round(time.monotonic() - start, 2),
                      "smoke": smoke,
                      "rows": run.measured, "skipped": run.skipped, "first_errors": run.errors, "not_measured": run.not_measured},
              "layout": {"system": PROBE_SYSTEM, "engine": PROBE_ENGINE, "version": str(torch.__version__),
                         "latency": "milliseconds per layer and device (aiconfigurator-core's tables)"}}
    write_tables(out, run, record)
    return record
