"""What each engine keeps out of its KV pool at its default memory setting (planner/physics/memory.py
engine_kv_margin_bytes), counted with the reserves: TensorRT-LLM's free_gpu_memory_fraction, vLLM's
gpu_memory_utilization, SGLang's mem_fraction_static reserve. The ideal roofline keeps nothing back."""

import pytest

from planner.modes import Engine, StepModel

CAL, ROOF = StepModel.CALIBRATED, StepModel.ROOFLINE


def _hbm(run_estimate, engine, model="llama-3.1-8b", rack="hgx-h100", batch=64, **kw):
    cal = run_estimate(model, rack, batch, 1024, 1024, step_model=CAL, engine=engine, **kw).memory
    roof = run_estimate(model, rack, batch, 1024, 1024, step_model=ROOF, engine=engine, **kw).memory
    return cal, roof


def test_each_engine_keeps_its_default_margin_out_of_the_kv_pool(run_estimate):
    """An H100 reports 81,559 MiB. TensorRT-LLM gives the KV cache 90% of what weights and a forward pass leave
    (free_gpu_memory_fraction 0.9): 10% of (C - W - A) stays out. vLLM 0.20+ lets weights, activations and KV
    share 92% of the whole (gpu_memory_utilization 0.92): 8% of C stays out. SGLang leaves its reserve free:
    512 + 1.5 x 8192 (chunked_prefill_size) + 2 x 256 (CUDA-graph batches under tp 4) + 1024 x 1 / 8 = 13,440 MiB
    at tp 1 on a part under 90 GB, which replaces the planner's smaller activation estimate. The ideal roofline
    keeps nothing back."""
    from planner.units import MIB

    capacity = 81559 * MIB
    trt, trt_roof = _hbm(run_estimate, Engine.TRTLLM)
    assert trt.activations_bytes - trt_roof.activations_bytes == pytest.approx(
        0.1 * (capacity - trt_roof.weights_bytes - trt_roof.activations_bytes), rel=1e-9)
    vllm, vllm_roof = _hbm(run_estimate, Engine.VLLM)
    assert vllm.activations_bytes - vllm_roof.activations_bytes == pytest.approx(0.08 * capacity, rel=1e-9)
    sglang, sglang_roof = _hbm(run_estimate, Engine.SGLANG)
    assert sglang_roof.activations_bytes < 13440 * MIB
    assert sglang.activations_bytes == pytest.approx(13440 * MIB, rel=1e-12)


def test_sglang_reserve_grows_with_the_part_and_the_tensor_parallel_group(run_estimate):
    """On a B200 (over 160 GB): chunked_prefill_size 16384 and 512 CUDA-graph batches, 512 + 24,576 + 1,024 + 128 =
    26,240 MiB at tp 1; on an H200 at tp 8: 512 + 12,288 + 2 x 512 + 1,024 = 14,848 MiB."""
    from planner.units import MIB

    b200, _ = _hbm(run_estimate, Engine.SGLANG, rack="hgx-b200")
    assert b200.activations_bytes == pytest.approx(26240 * MIB, rel=1e-12)
    h200, _ = _hbm(run_estimate, Engine.SGLANG, model="llama-3.1-70b", rack="hgx-h200", tp=8)
    assert h200.activations_bytes == pytest.approx(14848 * MIB, rel=1e-12)
