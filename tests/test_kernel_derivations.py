"""Derived kernel curves (`topologies/kernel_derivations.yaml`): a reference part's curves carried to a
part without published kernel tables, each fraction of peak scaled by a sourced microbenchmark ratio."""

import pytest

from planner.hardware import kernels
from planner.hardware.kernel_specs import Derivation
from planner.hardware.kernels import (
    DecodeAttention,
    Elementwise,
    KernelRates,
    Ramp,
    Spread,
    kernel_rates,
)
from planner.modes import Engine
from planner.units import TB


def test_mi300x_hbm_fractions_are_the_reference_s_times_the_babelstream_ratio(hw):
    """AZURE_AIBENCH's BabelStream Triad: MI300X 4.10 TB/s, H200 4.18 TB/s; over the catalog's peaks
    (5.3 and 4.8 TB/s) the fractions are 0.7736 and 0.8708, so MI300X reaches 0.8883 of H200's fraction.
    Every HBM fraction of the derived curves is H200's times that (the yaml carries it to 3 digits)."""
    ratio = (4.10 * TB / hw.accelerators["mi300x"].hbm_bandwidth_bytes_per_s) / (4.18 * TB / hw.accelerators["h200-sxm"].hbm_bandwidth_bytes_per_s)
    assert ratio == pytest.approx(0.8883, abs=1e-4)
    mi300x, h200 = kernel_rates("mi300x", Engine.VLLM), kernel_rates("h200-sxm", Engine.VLLM)
    assert mi300x.derived_from == "h200-sxm" and "BabelStream" in mi300x.source
    for fmt in ("bf16", "fp8"):
        assert mi300x.gemm[fmt].eta_stream == pytest.approx(h200.gemm[fmt].eta_stream * ratio, rel=1e-3)
        assert mi300x.gemm[fmt].eta_m == pytest.approx(h200.gemm[fmt].eta_m * ratio, rel=1e-3)
        assert mi300x.attention_decode[fmt].eta_kv == pytest.approx(h200.attention_decode[fmt].eta_kv * ratio, rel=1e-3)
        assert mi300x.gemm[fmt].t0_s == h200.gemm[fmt].t0_s  # fixed times are not fractions of a peak


def test_a_derivation_without_a_memory_measurement_keeps_the_reference_fractions():
    tpu, h200 = kernel_rates("tpu-v5e", Engine.VLLM), kernel_rates("h200-sxm", Engine.VLLM)
    assert tpu.gemm["fp8"].eta_stream == h200.gemm["fp8"].eta_stream
    assert tpu.attention_decode["bf16"].eta_kv == h200.attention_decode["bf16"].eta_kv


def test_derive_on_hand_made_curves():
    """compute_scale 0.8 and memory_scale 0.5 on hand-made curves: eta_max 0.6 -> 0.48, eta_m 0.7 -> 0.35,
    eta_stream 0.8 -> 0.4, eta_kv 0.9 -> 0.45, eta_bw 0.6 -> 0.3; t0, m_half and c untouched; a spread of
    p10 0.9, p90 1.2 widened with log factor 2 becomes 0.81 and 1.44 around p50 1."""
    spread = Spread(0.9, 1.0, 1.2)
    rates = KernelRates("ref", Engine.VLLM, "hand", gemm={"fp8": Ramp(5e-6, 0.6, 100.0, 0.7, spread, 0.8)},
                        attention_decode={"bf16": DecodeAttention(1e-5, 0.9, 3e-9, spread)}, elementwise={"bf16": Elementwise(3e-6, 0.6)})
    d = Derivation(accelerator="new", reference="ref", compute_scale=0.8, memory_scale=0.5, spread_log_factor=2.0, basis="test")
    out = kernels._derive(rates, d)
    g, a = out.gemm["fp8"], out.attention_decode["bf16"]
    assert (g.eta_max, g.eta_m, g.eta_stream) == pytest.approx((0.48, 0.35, 0.4))
    assert (g.t0_s, g.m_half) == (5e-6, 100.0)
    assert (a.eta_kv, a.t0_s, a.c_s) == pytest.approx((0.45, 1e-5, 3e-9))
    assert out.elementwise["bf16"].eta_bw == pytest.approx(0.3)
    assert (g.spread.p10, g.spread.p50, g.spread.p90) == pytest.approx((0.81, 1.0, 1.44))
    assert out.derived_from == "ref" and out.accelerator == "new"


def test_an_expert_curve_is_read_at_the_rate_of_the_math_its_table_measured():
    """aiconfigurator's Blackwell MXFP4 expert tables run W4A8_MXFP4_MXFP8 (MXFP8 activations: FP8 tensor-core
    math; TensorRT-LLM's ModelConfig.get_mxfp4_quant_algo for SM >= 100), Hopper's W4A16_MXFP4 (BF16 math).
    The fitted eta_max is a fraction of that format's peak, so a gpt-oss deployment computing in bf16 must not
    read the Blackwell curve at the bf16 peak (half the rate the table measured)."""
    from planner.precision import FlopsFormat

    blackwell = kernel_rates("b200", Engine.SGLANG).moe_curve("mxfp4")
    hopper = kernel_rates("h100-sxm", Engine.TRTLLM).moe_curve("mxfp4")
    assert blackwell.flops_format is FlopsFormat.FP8
    assert hopper.flops_format is FlopsFormat.BF16
