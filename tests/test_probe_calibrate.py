"""`planner calibrate <probe dir> --out DIR` on recorded GPU-like probe tables (written here in the
layout `planner probe` writes, from rates chosen here): the fitted curves must give the chosen rates
back, worked by hand below against the H200 SXM's catalog peaks (989.5 TFLOP/s bf16, 4.8 TB/s HBM); the
user catalog must define the new accelerator and its racks, and be what the step model reads."""

import hashlib
import itertools
from pathlib import Path

import numpy as np
import pytest
import yaml

pd = pytest.importorskip("pandas", reason="calibrate needs pandas (the calibrate/test extras)")
pytest.importorskip("pyarrow", reason="calibrate reads parquet tables (pyarrow)")

from planner.hardware.calibrate_probe import (
    calibrate_probe,
    match_accelerator,
    shipped_specs,
    write_user_catalog,
)
from planner.hardware.catalog import load_hardware_catalog
from planner.hardware.kernels import kernel_rates
from planner.hardware.user_catalog import with_user_catalog
from planner.modes import Engine
from planner.paths import data_dir
from planner.physics.kernels import elementwise_kernel

PEAK_BF16_FLOPS, HBM_BYTES_PER_S = 989.5e12, 4.8e12  # topologies/accelerators/nvidia-hopper.yaml, h200-sxm
VERSION = "2.11.0+cu130"

# chosen rates of the recorded tables
GEMM_T0_S, GEMM_ETA_MAX, GEMM_M_HALF, GEMM_ETA_M = 8e-6, 0.7, 50.0, 0.75
DECODE_T0_S, DECODE_ETA_KV = 6e-6, 0.8
PREFILL_T0_S, PREFILL_ETA_MAX, PREFILL_S_HALF = 7e-6, 0.6, 500.0
ELEMENTWISE_T0_S, ELEMENTWISE_RATE = 2e-6, 2.88e12  # 0.6 x 4.8 TB/s
COPY_ALPHA_S, COPY_RATE = 5e-6, 4.0e12  # 4.0 / 4.8 = 0.8333 of the HBM peak
ALL_REDUCE_ALPHA_S, ALL_REDUCE_BUS = 10e-6, 100e9


def _write(root: Path, family: str, name: str, rows: pd.DataFrame, engine: str = "torch") -> None:
    folder = root / "probe" / family / engine / VERSION
    folder.mkdir(parents=True, exist_ok=True)
    rows.to_parquet(folder / name, index=False)


def _gemm_rows() -> pd.DataFrame:
    """Launch-bound shapes (the floor), weight-streaming shapes (m <= 16, weights > 4 x 50 MB L2) and the rest."""
    shapes = [(1, 64, 64), (2, 64, 64), (4, 64, 64)]
    shapes += list(itertools.product([1, 2, 4, 8, 16], [16384, 32768], [16384]))
    shapes += list(itertools.product([32, 128, 512, 2048, 8192], [4096, 14336], [4096, 8192]))
    m, n, k = (np.array(c, dtype=float) for c in zip(*shapes, strict=True))
    flops, n_bytes = 2 * m * n * k, 2 * (n * k + m * k + m * n)
    t = GEMM_T0_S + np.maximum(flops / (PEAK_BF16_FLOPS * GEMM_ETA_MAX * m / (m + GEMM_M_HALF)), n_bytes / (HBM_BYTES_PER_S * GEMM_ETA_M))
    return pd.DataFrame({"gemm_dtype": "bfloat16", "m": m, "n": n, "k": k, "latency": t * 1e3})


def _decode_rows() -> pd.DataFrame:
    shapes = pd.DataFrame(list(itertools.product([1, 4, 16, 64], [256, 4096, 32768], [32, 8])), columns=["batch_size", "isl", "num_heads"])
    kv_bytes = shapes["batch_size"] * shapes["isl"] * 2 * 8 * 128 * 2.0
    t = DECODE_T0_S + kv_bytes / (HBM_BYTES_PER_S * DECODE_ETA_KV)
    return shapes.assign(step=0, num_key_value_heads=8, head_dim=128, kv_cache_dtype="bfloat16", window_size=0, latency=t * 1e3)


def _prefill_rows() -> pd.DataFrame:
    """Causal prefill of one sequence, 32 heads of 128: 2 x 32 x 128 x s^2 FLOPs at 0.6 x 989.5 TFLOP/s x s/(s + 500)."""
    isl = np.array([128, 256, 512, 1024, 2048, 4096, 8192, 16384], dtype=float)
    t = PREFILL_T0_S + 2 * 32 * 128 * isl**2 / (PEAK_BF16_FLOPS * PREFILL_ETA_MAX * isl / (isl + PREFILL_S_HALF))
    return pd.DataFrame({"attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "window_size": 0, "batch_size": 1,
                         "isl": isl.astype(int), "num_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "latency": t * 1e3})


def _probe_dir(root: Path) -> Path:
    _write(root, "gemm", "gemm_perf.parquet", _gemm_rows())
    _write(root, "attention", "generation_attention_perf.parquet", _decode_rows())
    _write(root, "attention", "context_attention_perf.parquet", _prefill_rows())
    moved = np.array([2, 2, 2, 2**26, 2**28, 2**30, 2**32], dtype=float)  # a copy of n bytes moves 2n
    _write(root, "mem", "mem_perf.parquet", pd.DataFrame({"op": "copy", "bytes": moved / 2, "bytes_moved": moved,
                                                          "latency": (COPY_ALPHA_S + moved / COPY_RATE) * 1e3}))
    tokens, width = np.array([1, 2, 4, 4096, 16384, 4096]), np.array([8, 8, 8, 8192, 8192, 14336])
    moved = np.array([8, 8, 8, 8, 8, 6]) * tokens * width  # add_norm 8 bytes per hidden unit, activation 6
    _write(root, "elementwise", "elementwise_perf.parquet", pd.DataFrame(
        {"op": ["add_norm"] * 5 + ["activation"], "num_tokens": tokens, "width": width, "bytes": moved,
         "latency": (ELEMENTWISE_T0_S + moved / ELEMENTWISE_RATE) * 1e3}))
    elements = np.array([1, 2, 4, 2**20, 2**24, 2**27], dtype=float)  # bf16: 2 bytes each; ring factor 2 (n - 1) / n = 1 on 2 GPUs
    _write(root, "comm", "nccl_perf.parquet", pd.DataFrame(
        {"nccl_dtype": "half", "op_name": "all_reduce", "num_gpus": 2, "message_size": elements,
         "latency": (ALL_REDUCE_ALPHA_S + 2 * elements / ALL_REDUCE_BUS) * 1e3}), engine="nccl")
    _write(root, "step", "decode_step_perf.parquet", pd.DataFrame({"model": ["llama-3.1-8b"], "batch_size": [16], "context": [4096],
                                                                   "kernel_source": ["cuda-graph"], "latency": [9.5]}))
    (root / "probe.yaml").write_text(yaml.safe_dump({"probe": {
        "device": "NVIDIA H200", "device_type": "cuda", "device_count": 2, "ranks": 2, "date": "2026-11-26T00:00:00+00:00",
        "libraries": {"torch": VERSION}, "runtime": "13.0", "driver_and_clocks": {"driver_version": "580.00", "clocks.max.sm": "1980 MHz"},
        "backends": {"attention": "torch-sdpa"}}}))
    return root


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    root = _probe_dir(tmp_path_factory.mktemp("probe"))
    accels, racks = shipped_specs()
    base = next(a for a in accels if a.id == match_accelerator("NVIDIA H200", accels))
    shipped = hashlib.sha256((data_dir("topologies") / "kernels.yaml").read_bytes()).hexdigest()
    calibration = calibrate_probe(root, base, "lab-h200", "vllm", racks, load_hardware_catalog())
    out = tmp_path_factory.mktemp("catalog")
    write_user_catalog(out, calibration)
    assert hashlib.sha256((data_dir("topologies") / "kernels.yaml").read_bytes()).hexdigest() == shipped
    return calibration, out


def test_the_probed_device_name_finds_its_catalog_part():
    accels, _ = shipped_specs()
    assert match_accelerator("NVIDIA H200", accels) == "h200-sxm"
    assert match_accelerator("Some Accelerator", accels) is None


def test_fitted_curves_give_the_recorded_rates_back(calibrated):
    calibration, _ = calibrated
    engine = calibration.record["accelerators"]["lab-h200"]["engines"]["vllm"]
    gemm = engine["gemm"]["bf16"]
    assert gemm["t0_s"] == pytest.approx(GEMM_T0_S, rel=1e-3)  # the launch-bound shapes: 8 us + under 1 ns of work
    assert gemm["eta_max"] == pytest.approx(0.7, rel=0.01)
    assert gemm["m_half"] == pytest.approx(50.0, rel=0.03)
    assert gemm["eta_m"] == pytest.approx(0.75, rel=0.01)
    # streaming shapes: weights / (t - t0) = 0.75 BW x weight bytes / all bytes, and m <= 16 rows add at most 16/16384 of them
    assert engine["gemm"]["bf16"]["eta_stream"] == pytest.approx(0.75, rel=2e-3)
    assert engine["attention_decode"]["bf16"]["eta_kv"] == pytest.approx(0.8, rel=0.01)
    # the floor is the least-work shapes' latency: 1 sequence x 256 tokens x 2 x 8 heads x 128 x 2 B = 1,048,576 B
    # at 0.8 x 4.8 TB/s = 0.273 us over the 6 us fixed time
    assert engine["attention_decode"]["bf16"]["t0_s"] == pytest.approx(6.273e-6, rel=1e-3)
    assert engine["elementwise"]["bf16"]["t0_s"] == pytest.approx(2e-6, rel=1e-3)
    assert engine["elementwise"]["bf16"]["eta_bw"] == pytest.approx(0.6, rel=1e-3)  # 2.88 / 4.8
    reduce = calibration.record["accelerators"]["lab-h200"]["nccl"]["all_reduce"]["2"]
    assert reduce["alpha_s"] == pytest.approx(10e-6, rel=1e-3)
    assert reduce["bus_bytes_per_s"] == pytest.approx(100e9, rel=1e-3)


def test_the_new_accelerator_carries_the_measured_fractions_and_provenance(calibrated):
    calibration, out = calibrated
    spec = calibration.accelerator
    assert spec.id == "lab-h200" and spec.hbm_bandwidth_tb_per_s == 4.8
    assert spec.hbm_bandwidth_fraction == pytest.approx(0.8333, abs=1e-4)  # 4.0 / 4.8
    assert spec.compute_fraction["bf16"] == pytest.approx(0.7, rel=0.01)
    assert [r.id for r in calibration.racks] == ["lab-h200-hgx-h200"]
    source = yaml.safe_load((out / "kernels.yaml").read_text())["source"]
    assert source["package"] == "planner probe" and source["device"] == "NVIDIA H200" and "580.00" in source["driver_and_clocks"]


def test_the_user_catalog_is_what_the_step_model_reads(calibrated):
    _, out = calibrated
    hardware = with_user_catalog(load_hardware_catalog(), out)
    rack = hardware.racks["lab-h200-hgx-h200"]
    assert rack.accelerator.id == "lab-h200" and rack.accelerator.kernels_dir == out.resolve()
    assert hardware.accelerators["h200-sxm"].kernels_dir is None
    rates = kernel_rates("lab-h200", Engine.TRTLLM, rack.accelerator.kernels_dir)  # any engine falls back to the probed one
    assert rates.source.startswith("planner probe") and rates.gemm["bf16"].eta_max == pytest.approx(0.7, rel=0.01)
    curve = rates.elementwise["bf16"]
    # 2.88 GB at 0.6 x 4.8 TB/s is 1 ms; ten ops at 2 us each add 20 us
    time = elementwise_kernel(2.88e9, 10, HBM_BYTES_PER_S, curve.eta_bw, curve.t0_s)
    assert float(time.memory_s) == pytest.approx(1e-3, rel=1e-3)
    assert float(time.fixed_s) == pytest.approx(20e-6, rel=1e-3)
    assert kernel_rates("lab-h200", Engine.TRTLLM) is None  # the shipped catalog does not know it


def test_the_measured_decode_steps_are_read_back_in_seconds(tmp_path_factory):
    from planner.cli.probe_compare import measured_points

    root = _probe_dir(tmp_path_factory.mktemp("again"))
    assert measured_points(root) == [("llama-3.1-8b", 1, 16, 4096, pytest.approx(9.5e-3))]  # 9.5 ms at tensor parallelism 1


def test_a_probe_of_one_device_keeps_the_shipped_collectives_and_says_so(tmp_path_factory):
    import shutil

    from planner.hardware.kernel_grids import read_grid_file

    root = _probe_dir(tmp_path_factory.mktemp("one-device"))
    shutil.rmtree(root / "probe" / "comm")  # one device: the probe measured no collective
    accels, racks = shipped_specs()
    base = next(a for a in accels if a.id == "h200-sxm")
    calibration = calibrate_probe(root, base, "lab-h200", "vllm", racks, load_hardware_catalog())
    out = tmp_path_factory.mktemp("one-device-catalog")
    write_user_catalog(out, calibration)
    shipped = yaml.safe_load((data_dir("topologies") / "kernels.yaml").read_text())["accelerators"]["h200-sxm"]
    engine = calibration.record["accelerators"]["lab-h200"]["engines"]["vllm"]
    assert engine["all_reduce"] == shipped["engines"]["vllm"]["all_reduce"]
    assert engine["all_to_all"] == shipped["engines"]["vllm"]["all_to_all"]
    assert calibration.record["accelerators"]["lab-h200"]["nccl"] == shipped["nccl"]
    assert engine["versions"]["collectives"] == "shipped h200-sxm vllm curves (the probe measured none)"
    assert calibration.kept_collectives == engine["versions"]["collectives"]
    assert "all_reduce" not in calibration.measured_record()["accelerators"]["lab-h200"]["engines"]["vllm"]  # not shown as fitted
    grids = read_grid_file(out / "kernel_grids" / "lab-h200.zip")
    assert {"vllm/all_reduce/4", "nccl/all_reduce/8"} <= set(grids)  # their grids came along
    rates = kernel_rates("lab-h200", Engine.VLLM, out.resolve())
    assert rates.all_reduce_curve(4).alpha_s == shipped["engines"]["vllm"]["all_reduce"]["4"]["alpha_s"]
    assert "collectives shipped h200-sxm vllm curves" in rates.source


def test_without_any_all_reduce_curve_the_links_price_the_all_reduces(monkeypatch):
    import dataclasses

    from planner.cli.estimate import estimate_inputs
    from planner.cli.parser import build_parser
    from planner.physics import batch_table
    from planner.physics.estimate import estimate

    shipped = kernel_rates("h100-sxm", Engine.VLLM)
    bare = dataclasses.replace(shipped, all_reduce={})  # a part probed on one device, with no shipped curves to keep
    assert bare.all_reduce_curve(4) is None
    monkeypatch.setattr(batch_table, "kernel_rates", lambda *args, **kwargs: bare)
    args = build_parser().parse_args(["estimate", "--model", "llama-3.1-70b", "--rack", "hgx-h100", "--tp", "4", "--batch", "64",
                                      "--isl", "1023", "--osl", "2", "--engine", "vllm"])
    step = estimate(estimate_inputs(args)).decode_step
    hardware = load_hardware_catalog()
    accel = hardware.accelerators["h100-sxm"]
    # 80 layers x 2 all-reduces of 64 tokens x 8192 x 2 B = 1 MiB, ring 2 x 3/4 of it over NVLink at 450 GB/s x its
    # achievable fraction, each plus the collective latency
    message = 64 * 8192 * 2
    ring_s = 2 * 3 / 4 * message / (450e9 * accel.scale_up_bandwidth_fraction)
    assert step.comm_s == pytest.approx(160 * (ring_s + hardware.overheads.collective_latency_s), rel=1e-6)


def _calibrate(root: Path, out: Path, capsys) -> tuple[int, str]:
    from planner.cli.main import main

    code = main(["calibrate", str(root), "--out", str(out)])
    return code, " ".join(capsys.readouterr().err.split())  # the console wraps long lines


@pytest.mark.parametrize("damage,message", [
    ("yaml-list", "is not a probe record (no 'probe' section)"),
    ("yaml-scalar", "is not a probe record (no 'probe' section)"),
    ("parquet", "is not a readable parquet table"),
    ("column", "has no column 'bytes_moved'"),
    ("zero-latency", "no gemm table under"),
    ("out-is-a-file", "is a file"),
])
def test_damaged_probe_input_gets_one_line_and_the_fix(tmp_path, capsys, damage, message):
    root = _probe_dir(tmp_path / "probe")
    out = tmp_path / "catalog"
    gemm = next((root / "probe" / "gemm").rglob("gemm_perf.parquet"))
    if damage == "yaml-list":
        (root / "probe.yaml").write_text("- a\n- b\n")
    elif damage == "yaml-scalar":
        (root / "probe.yaml").write_text("just text\n")
    elif damage == "parquet":
        gemm.write_bytes(b"junk")
    elif damage == "column":
        copies = next((root / "probe" / "mem").rglob("mem_perf.parquet"))
        pd.read_parquet(copies).drop(columns=["bytes_moved"]).to_parquet(copies)
    elif damage == "zero-latency":
        pd.read_parquet(gemm).assign(latency=0.0).to_parquet(gemm)
    elif damage == "out-is-a-file":
        out.write_text("")
    code, err = _calibrate(root, out, capsys)
    assert code == 2 and message in err and "fix:" in err and "Traceback" not in err


def test_rows_without_a_measured_latency_are_dropped_not_fitted(tmp_path, capsys):
    root = _probe_dir(tmp_path / "probe")
    gemm = next((root / "probe" / "gemm").rglob("gemm_perf.parquet"))
    rows = pd.read_parquet(gemm)
    rows.loc[rows.index[-3:], "latency"] = [np.nan, -1.0, 0.0]  # three of the 33 shapes measured nothing
    rows.to_parquet(gemm)
    code, _ = _calibrate(root, tmp_path / "catalog", capsys)
    assert code == 0
    fit = yaml.safe_load((tmp_path / "catalog" / "kernels.yaml").read_text())["accelerators"]["h200-sxm-probed"]["engines"]["vllm"]
    assert fit["gemm"]["bf16"]["rows"] == 30 and fit["gemm"]["bf16"]["eta_max"] == pytest.approx(0.7, rel=0.01)


def test_a_catalog_without_a_gemm_curve_is_an_input_error_not_a_traceback(calibrated, tmp_path, capsys):
    import shutil

    from planner.cli.main import main

    _, out = calibrated
    edited = tmp_path / "edited"
    shutil.copytree(out, edited)
    record = yaml.safe_load((edited / "kernels.yaml").read_text())
    record["accelerators"]["lab-h200"]["engines"]["vllm"]["gemm"] = {}  # a hand edit
    (edited / "kernels.yaml").write_text(yaml.safe_dump(record))
    code = main(["estimate", "--kernel-catalog", str(edited), "--rack", "lab-h200-hgx-h200", "--model", "llama-3.1-8b", "--batch", "4"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "no dense GEMM curve (lab-h200)" in err and "Traceback" not in err
