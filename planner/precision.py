"""Numeric formats: bytes per stored value and which tensor-core rate a format computes at."""

from enum import StrEnum

__all__ = ["FlopsFormat", "Precision", "bytes_per_value", "flops_format", "input_bytes_per_value", "matmul_format"]


class Precision(StrEnum):
    """Storage format of weights, KV cache or activations."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    FP4 = "fp4"
    MXFP4 = "mxfp4"  # OCP microscaling: 4-bit values + one 8-bit scale per 32 values
    NVFP4 = "nvfp4"  # NVIDIA: 4-bit values + one fp8 scale per 16 values


class FlopsFormat(StrEnum):
    """Tensor-core input format whose dense FLOP/s an accelerator datasheet quotes."""

    BF16 = "bf16"
    FP8 = "fp8"
    FP4 = "fp4"


_BYTES_PER_VALUE: dict[Precision, float] = {
    Precision.FP32: 4.0,
    Precision.BF16: 2.0,
    Precision.FP16: 2.0,
    Precision.FP8: 1.0,
    Precision.INT8: 1.0,
    Precision.FP4: 0.5,
    Precision.MXFP4: (4 + 8 / 32) / 8,  # OCP MX spec: E2M1 element + E8M0 scale per 32-block
    Precision.NVFP4: (4 + 8 / 16) / 8,  # NVFP4: E2M1 element + E4M3 scale per 16-block
}

_FLOPS_FORMAT: dict[Precision, FlopsFormat] = {
    Precision.FP32: FlopsFormat.BF16,  # no fp32 tensor-core entry in the catalog: bf16 is an upper bound
    Precision.BF16: FlopsFormat.BF16,
    Precision.FP16: FlopsFormat.BF16,
    Precision.FP8: FlopsFormat.FP8,
    Precision.INT8: FlopsFormat.FP8,  # int8 and fp8 run at the same tensor-core rate on every catalog part
    Precision.FP4: FlopsFormat.FP4,
    Precision.MXFP4: FlopsFormat.FP4,
    Precision.NVFP4: FlopsFormat.FP4,
}

# Bytes per value of an activation quantised for a matmul in each format (what an expert dispatch can
# send): fp8 values (per-token or per-block scales are under 3% more), fp4 values as NVFP4 blocks.
_INPUT_BYTES_PER_VALUE: dict[FlopsFormat, float] = {
    FlopsFormat.BF16: _BYTES_PER_VALUE[Precision.BF16],
    FlopsFormat.FP8: _BYTES_PER_VALUE[Precision.FP8],
    FlopsFormat.FP4: _BYTES_PER_VALUE[Precision.NVFP4],
}

# Narrowest first: used to fall back to a wider format an accelerator supports.
FLOPS_FORMATS_NARROW_TO_WIDE: tuple[FlopsFormat, ...] = (FlopsFormat.FP4, FlopsFormat.FP8, FlopsFormat.BF16)


def bytes_per_value(precision: Precision) -> float:
    """Bytes one stored value takes, scale factors of block formats included."""
    return _BYTES_PER_VALUE[precision]


def input_bytes_per_value(fmt: FlopsFormat) -> float:
    """Bytes one activation value takes once quantised for a matmul in `fmt`."""
    return _INPUT_BYTES_PER_VALUE[FlopsFormat(fmt)]


def flops_format(precision: Precision) -> FlopsFormat:
    """Tensor-core format a matmul in this precision runs at."""
    return _FLOPS_FORMAT[precision]


def matmul_format(compute: FlopsFormat, stored: Precision) -> FlopsFormat:
    """Tensor-core format a matmul on weights stored in `stored` runs at under the deployment's `compute`
    format: the wider of the two, since both operands enter the tensor cores in one format and an engine
    does not requantise stored weights every step (gpt-oss on Blackwell: MXFP4 experts with FP8
    activations beside BF16 attention and router GEMMs, as its checkpoint leaves them unquantised)."""
    order = FLOPS_FORMATS_NARROW_TO_WIDE
    return max(compute, flops_format(stored), key=order.index)
