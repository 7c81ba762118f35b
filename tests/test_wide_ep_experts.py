"""Experts behind DeepEP (docs/step-model.md, "Expert GEMMs behind DeepEP" and "The exchange across domains"):
SGLang's wide-EP tables price the GEMMs whatever the experts' format, since the fused-MoE tables time a different
kernel path (every token fed to every rank); copies crossing scale-up domains pay the network's fixed latency."""

import numpy as np
import pytest

from planner.hardware.kernels import AllToAll, kernel_rates
from planner.modes import Engine
from planner.physics.kernels import all_to_all_kernel


@pytest.fixture(scope="module")
def gb200_sglang():
    return kernel_rates("gb200", Engine.SGLANG)


def test_behind_deepep_a_format_without_a_wide_ep_table_reads_the_wide_ep_one(gb200_sglang):
    wide = gb200_sglang.moe_wide_ep["low_latency"]
    assert set(wide["power_law_1.01"]) == {"fp8_block"}  # aiconfigurator's SGLang wide-EP tables: fp8_block only
    assert gb200_sglang.moe_curve("fp4", "power_law_1.01", "low_latency") is wide["power_law_1.01"]["fp8_block"]
    assert gb200_sglang.moe_curve("fp8_block", "power_law_1.01", "low_latency") is wide["power_law_1.01"]["fp8_block"]
    # prefill behind DeepEP (normal mode) likewise
    assert gb200_sglang.moe_curve("fp4", "balanced", "normal") is gb200_sglang.moe_wide_ep["normal"]["balanced"]["fp8_block"]


def test_without_deepep_each_format_keeps_its_own_fused_moe_table(gb200_sglang):
    assert gb200_sglang.moe_curve("fp4", "power_law_1.01") is gb200_sglang.moe_routing["power_law_1.01"]["fp4"]
    assert gb200_sglang.moe_curve("fp4", "power_law_1.01") is not gb200_sglang.moe_curve("fp4", "power_law_1.01", "low_latency")


def test_an_engine_without_wide_ep_tables_is_unchanged():
    trtllm = kernel_rates("gb200", Engine.TRTLLM)
    assert not trtllm.moe_wide_ep
    assert trtllm.moe_curve("fp4", "power_law_1.01", "low_latency") is trtllm.moe_routing["power_law_1.01"]["fp4"]


def test_an_exchange_crossing_domains_pays_the_network_latency_by_hand():
    # alpha 9 us and 400 GB/s in the domain; 100 kB stay in it; the NICs carry 43 GB/s with a 10 us fixed latency
    curve = AllToAll(alpha_s=9e-6, bytes_per_s=4e11)
    key = (7168.0, 8.0, 256.0)
    in_domain = 9e-6 + 1e5 / 4e11  # 9.25 us
    one_domain = all_to_all_kernel(curve, np.array([2.0]), key, np.array([1e5]), np.array([0.0]), 43e9, 58, None, 10e-6)
    assert one_domain == pytest.approx(58 * in_domain)  # nothing crosses: no network latency
    two = all_to_all_kernel(curve, np.array([2.0]), key, np.array([1e5]), np.array([1e5]), 43e9, 58, None, 10e-6)
    assert two == pytest.approx(58 * (9e-6 + 10e-6 + 1e5 / 43e9))  # 21.3 us a phase: the crossing part is the slower
    big = all_to_all_kernel(curve, np.array([2.0]), key, np.array([1e9]), np.array([1e5]), 43e9, 1, None, 10e-6)
    assert big == pytest.approx(9e-6 + 1e9 / 4e11)  # 2.5 ms in the domain outlasts the 21 us crossing
