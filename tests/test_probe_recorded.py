"""The probes of two real GPUs committed under probes/ (an H100 SXM and an H200 SXM, 2026-11-26, each
`tools/probe_gpu.sh` on one GPU) fed through `planner calibrate`. The fitted part is checked against
values worked out here from the recorded rows (the HBM copy rate, the GEMM floor and weight-streaming
rate), and the decode step of Llama-3.1-8B estimated on the probed curves against the whole step the
probe measured as a CUDA graph, and against the shipped curves of the same part (issue 25: within 10%)."""

from pathlib import Path

import numpy as np
import pytest
import yaml

pd = pytest.importorskip("pandas", reason="calibrate reads parquet tables (pandas, pyarrow)")
pytest.importorskip("pyarrow", reason="calibrate reads parquet tables (pandas, pyarrow)")

from planner.cli.estimate import estimate_inputs
from planner.cli.parser import build_parser
from planner.hardware.calibrate_probe import (
    calibrate_probe,
    shipped_specs,
    write_user_catalog,
)
from planner.hardware.catalog import load_hardware_catalog
from planner.physics.estimate import estimate

PROBES = Path(__file__).resolve().parent.parent / "probes"
# the datasheet peaks the fractions are taken of (topologies/accelerators/nvidia-hopper.yaml)
PARTS = {"h100-sxm": {"hbm_bytes_per_s": 3.35e12, "bf16_flops_per_s": 989.5e12},
         "h200-sxm": {"hbm_bytes_per_s": 4.8e12, "bf16_flops_per_s": 989.5e12}}
L2_BYTES = 50 * 2**20  # both parts' L2 cache (probe.yaml: l2_cache_bytes 52428800)


def _table(part: str, family: str, name: str) -> pd.DataFrame:
    return pd.read_parquet(next((PROBES / part / "probe" / family).glob(f"torch/*/{name}")))


@pytest.fixture(scope="module", params=sorted(PARTS))
def calibrated(request, tmp_path_factory):
    part = request.param
    accels, racks = shipped_specs()
    base = next(a for a in accels if a.id == part)
    calibration = calibrate_probe(PROBES / part, base, f"{part}-probed", "vllm", racks, load_hardware_catalog())
    out = tmp_path_factory.mktemp(part)
    write_user_catalog(out, calibration)
    return part, calibration, out


def test_the_hbm_fraction_is_the_rate_of_the_copies_that_dwarf_l2(calibrated):
    part, calibration, _ = calibrated
    copies = _table(part, "mem", "mem_perf.parquet").sort_values("bytes")
    large = copies[copies["bytes"] >= 8 * L2_BYTES]  # 512 MiB to 4 GiB: four copies
    assert len(large) == 4
    moved, seconds = large["bytes_moved"].to_numpy(), large["latency"].to_numpy() * 1e-3
    # the two largest: 4 GiB more moved (8 GiB against 4 GiB) in the time difference
    rate = (moved[-1] - moved[-2]) / (seconds[-1] - seconds[-2])
    assert calibration.accelerator.hbm_bandwidth_fraction == pytest.approx(rate / PARTS[part]["hbm_bytes_per_s"], rel=0.01)
    assert 0.85 < calibration.accelerator.hbm_bandwidth_fraction < 0.95  # H100 0.908 (3.04 TB/s), H200 0.893 (4.29 TB/s)


def test_the_gemm_floor_and_streaming_rate_come_from_their_rows(calibrated):
    part, calibration, _ = calibrated
    peaks = PARTS[part]
    gemm = _table(part, "gemm", "gemm_perf.parquet")
    gemm = gemm[gemm["gemm_dtype"] == "bfloat16"]
    m, n, k = (gemm[c].to_numpy(dtype=float) for c in "mnk")
    seconds = gemm["latency"].to_numpy() * 1e-3
    # the floor: the median latency of the least-work 1% of the shapes (12 of 1148), work the larger of
    # FLOPs at the peak and bytes (weights, inputs, outputs in bf16) at the HBM peak
    work = np.maximum(2 * m * n * k / peaks["bf16_flops_per_s"], 2 * (n * k + m * k + m * n) / peaks["hbm_bytes_per_s"])
    t0 = np.median(seconds[np.argsort(work, kind="stable")[:12]])
    fit = calibration.record["accelerators"][f"{part}-probed"]["engines"]["vllm"]["gemm"]["bf16"]
    assert fit["t0_s"] == pytest.approx(t0, rel=1e-3)
    assert 3e-6 < fit["t0_s"] < 8e-6  # a cold GEMM in a graph: 5.6 us (H100), 5.8 us (H200)
    # streaming: GEMMs of at most 16 rows whose weights exceed 4 x L2, weight bytes over (latency - t0)
    streaming = (m <= 16) & (2 * n * k >= 4 * L2_BYTES)
    rate = np.median(2 * n[streaming] * k[streaming] / (seconds[streaming] - t0))
    assert fit["eta_stream"] == pytest.approx(rate / peaks["hbm_bytes_per_s"], rel=2e-3)


def _step_s(rack: str, batch: int, context: int, catalog: Path) -> float:
    # two output tokens after context - 1 prompt tokens: the pure decode step reads a mean context of `context`
    args = build_parser().parse_args(["estimate", "--model", "llama-3.1-8b", "--rack", rack, "--tp", "1", "--batch", str(batch),
                                      "--isl", str(context - 1), "--osl", "2", "--engine", "vllm", "--kernel-catalog", str(catalog)])
    return estimate(estimate_inputs(args)).decode_step.total_s


@pytest.mark.parametrize("batch,context", [(1, 1024), (1, 4096), (16, 1024), (16, 4096), (64, 1024), (64, 4096)])
def test_the_probed_decode_step_is_within_ten_percent_of_the_step_measured_whole(calibrated, batch, context):
    part, _, out = calibrated
    measured = _table(part, "step", "decode_step_perf.parquet")
    measured_s = float(measured[(measured["batch_size"] == batch) & (measured["context"] == context)]["latency"].iloc[0]) * 1e-3
    box = yaml.safe_load((out / "hardware.yaml").read_text())["racks"][0]["id"]  # the probed part's HGX box
    assert _step_s(box, batch, context, out) == pytest.approx(measured_s, rel=0.10)


@pytest.mark.parametrize("batch,context", [(1, 1024), (16, 4096), (64, 4096)])
def test_against_the_shipped_curves_the_gemm_class_is_the_difference(calibrated, batch, context, monkeypatch):
    """Issue 25: probed within 10% of the shipped curves (vLLM's, the probe's engine key) on a dense model's
    decode step, or the difference explained kernel by kernel. On the H100 at batch 1 it is 11%: the
    probe's cold GEMMs (weights streamed at 0.80 of the HBM peak against 0.89 in vLLM's table, a 5.6 us
    floor against 2.6 us). With the shipped GEMM curve in place of the probed one the step is within 3%."""
    import dataclasses

    from planner.hardware.kernels import kernel_rates
    from planner.modes import Engine
    from planner.physics import batch_table

    part, _, out = calibrated
    box = yaml.safe_load((out / "hardware.yaml").read_text())["racks"][0]["id"]
    rack = f"hgx-{part.split('-')[0]}"
    probed_s, shipped_s = _step_s(box, batch, context, out), _step_s(rack, batch, context, out)
    assert probed_s == pytest.approx(shipped_s, rel=0.10 if (part, batch) != ("h100-sxm", 1) else 0.15)
    probed = kernel_rates(f"{part}-probed", Engine.VLLM, out.resolve())
    shipped = kernel_rates(part, Engine.VLLM)
    swapped = dataclasses.replace(probed, accelerator=part, gemm=shipped.gemm)
    monkeypatch.setattr(batch_table, "kernel_rates", lambda *args, **kwargs: swapped)
    assert _step_s(rack, batch, context, out) == pytest.approx(shipped_s, rel=0.03)
