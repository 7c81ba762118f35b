"""Numeric formats: a matmul's tensor-core format under a deployment's compute format."""

from planner.precision import FlopsFormat, Precision, bytes_per_value, matmul_format


def test_a_matmul_runs_at_the_wider_of_the_compute_and_stored_formats():
    # both operands enter the tensor cores in one format: BF16 weights with FP8 activations run as BF16
    # (gpt-oss on Blackwell: its checkpoint leaves attention and the router in BF16 beside FP8-activation experts)
    assert matmul_format(FlopsFormat.FP8, Precision.BF16) is FlopsFormat.BF16
    assert matmul_format(FlopsFormat.FP8, Precision.MXFP4) is FlopsFormat.FP8  # W4A8: 4-bit weights widened to fp8
    assert matmul_format(FlopsFormat.BF16, Precision.MXFP4) is FlopsFormat.BF16  # W4A16 on Hopper
    assert matmul_format(FlopsFormat.FP4, Precision.NVFP4) is FlopsFormat.FP4
    assert matmul_format(FlopsFormat.FP8, Precision.FP8) is FlopsFormat.FP8


def test_block_formats_carry_their_scales():
    assert bytes_per_value(Precision.MXFP4) == 0.53125  # OCP MX: 4-bit E2M1 + one 8-bit E8M0 scale per 32 values
    assert bytes_per_value(Precision.NVFP4) == 0.5625  # 4-bit E2M1 + one 8-bit E4M3 scale per 16 values
