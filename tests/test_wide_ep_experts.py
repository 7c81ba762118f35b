"""Expert GEMMs behind DeepEP (docs/step-model.md, "Expert GEMMs behind DeepEP"): SGLang's wide-EP tables price them
whatever the experts' format, since the fused-MoE tables time a different kernel path (every token fed to every rank)."""

import pytest

from planner.hardware.kernels import kernel_rates
from planner.modes import Engine


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
