"""One timed kernel per shape, in PyTorch: the probe's measurements. Each function allocates its
operands on the device, times the kernel (planner/probe/timing.py: on a GPU calls back to back in a
CUDA graph, each on its own operands cold in L2, as a decode step's kernels find them after the
previous layer's weights have streamed through) and returns seconds.

Dense GEMMs run as `x @ w.T` (cuBLAS/hipBLASLt through PyTorch), their weights coming from HBM as in
a decode step; fp8 runs `torch._scaled_mm` with per-tensor
scales. Routed experts run as batched GEMMs (`torch.bmm`) over the experts a balanced router touches,
gate-up, activation, down: a stand-in for an engine's grouped-GEMM kernel, said so in the tables.
Attention runs flash-attn when it is importable on a GPU, else PyTorch's scaled_dot_product_attention
(which picks its own flash, memory-efficient or math kernel); MLA decode runs the absorbed latent
attention as two batched GEMMs around a softmax."""

import importlib.util

import torch
import torch.nn.functional as F

from planner.physics.stages import ACTIVATION_BYTES_PER_WIDTH, ADD_NORM_BYTES_PER_HIDDEN
from planner.probe.shapes import MLA_LATENT, MLA_QK, MLA_ROPE, MLA_V
from planner.probe.timing import Device

__all__ = [
    "attention_backend",
    "elementwise_bytes",
    "elementwise_s",
    "expert_gemm_s",
    "fp8_dtype",
    "gemm_s",
    "gqa_decode_s",
    "gqa_prefill_s",
    "hbm_copy_s",
    "mla_decode_s",
    "mla_prefill_s",
]

BF16 = torch.bfloat16
NORM_EPS = 1e-6


def attention_backend(device: Device) -> str:
    """flash-attn on a GPU when importable, else PyTorch SDPA."""
    return "flash-attn" if device.is_gpu and importlib.util.find_spec("flash_attn") is not None else "torch-sdpa"


def fp8_dtype(device: Device) -> torch.dtype | None:
    """The fp8 format this device's `torch._scaled_mm` runs (OCP e4m3; on ROCm also MI300's e4m3fnuz),
    None without fp8 GEMMs."""
    if not device.is_gpu or not hasattr(torch, "_scaled_mm"):
        return None
    candidates = (torch.float8_e4m3fn, torch.float8_e4m3fnuz) if torch.version.hip else (torch.float8_e4m3fn,)
    one = torch.ones((), device=device.torch_device)
    for dtype in candidates:
        try:
            a = torch.zeros(16, 16, device=device.torch_device).to(dtype)
            torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=BF16)
        except (RuntimeError, TypeError):
            continue
        return dtype
    return None


def gemm_s(device: Device, m: int, n: int, k: int, fp8: torch.dtype | None = None) -> float:
    """y[m, n] = x[m, k] w[n, k]^T, weights cold in L2; fp8 inputs with per-tensor scales when `fp8` is given."""
    dev = device.torch_device

    def make():
        x, w = torch.randn(m, k, device=dev, dtype=BF16), torch.randn(n, k, device=dev, dtype=BF16)
        if fp8 is None:
            return lambda: torch.matmul(x, w.t())
        xq, wq, one = x.to(fp8), w.to(fp8), torch.ones((), device=dev)
        return lambda: torch._scaled_mm(xq, wq.t(), scale_a=one, scale_b=one, out_dtype=BF16)

    return device.rotated_s(make)


def expert_gemm_s(device: Device, num_tokens: int, hidden_size: int, inter_size: int, topk: int, num_experts: int,
                  moe_tp_size: int, moe_ep_size: int) -> float:
    """One gated MoE layer's routed experts on one rank under balanced routing: the tokens x topk / ep
    rows this rank receives spread evenly over the experts they touch, gate-up, SiLU x up, down."""
    dev = device.torch_device
    rows = max(1, -(-num_tokens * topk // moe_ep_size))
    active = min(rows, num_experts // moe_ep_size)
    per_expert, inter = -(-rows // active), inter_size // moe_tp_size

    def make():
        x = torch.randn(active, per_expert, hidden_size, device=dev, dtype=BF16)
        gate_up = torch.randn(active, hidden_size, 2 * inter, device=dev, dtype=BF16)
        down = torch.randn(active, inter, hidden_size, device=dev, dtype=BF16)

        def layer():
            h = torch.bmm(x, gate_up)
            return torch.bmm(F.silu(h[..., :inter]) * h[..., inter:], down)

        return layer

    return device.rotated_s(make)


def gqa_decode_s(device: Device, backend: str, batch_size: int, isl: int, num_heads: int, num_key_value_heads: int, head_dim: int,
                 **_) -> float:
    """One query token per sequence against `isl` cached tokens (contiguous KV, bf16)."""
    dev, b, kvh = device.torch_device, batch_size, num_key_value_heads

    def make():
        if backend == "flash-attn":
            from flash_attn import flash_attn_with_kvcache

            q = torch.randn(b, 1, num_heads, head_dim, device=dev, dtype=BF16)
            k, v = (torch.randn(b, isl, kvh, head_dim, device=dev, dtype=BF16) for _ in range(2))
            return lambda: flash_attn_with_kvcache(q, k, v)
        q = torch.randn(b, num_heads, 1, head_dim, device=dev, dtype=BF16)
        k, v = (torch.randn(b, kvh, isl, head_dim, device=dev, dtype=BF16) for _ in range(2))
        return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=num_heads != kvh)

    return device.rotated_s(make)


def gqa_prefill_s(device: Device, backend: str, batch_size: int, isl: int, num_heads: int, num_key_value_heads: int, head_dim: int) -> float:
    """Causal attention over `isl` new tokens per sequence."""
    dev, b, kvh = device.torch_device, batch_size, num_key_value_heads

    def make():
        if backend == "flash-attn":
            from flash_attn import flash_attn_func

            q = torch.randn(b, isl, num_heads, head_dim, device=dev, dtype=BF16)
            k, v = (torch.randn(b, isl, kvh, head_dim, device=dev, dtype=BF16) for _ in range(2))
            return lambda: flash_attn_func(q, k, v, causal=True)
        q = torch.randn(b, num_heads, isl, head_dim, device=dev, dtype=BF16)
        k, v = (torch.randn(b, kvh, isl, head_dim, device=dev, dtype=BF16) for _ in range(2))
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=num_heads != kvh)

    return device.rotated_s(make)


def mla_decode_s(device: Device, batch_size: int, isl: int, num_heads: int, **_) -> float:
    """Absorbed MLA decode: queries in the 576-wide latent space against the cached latents, values
    the first 512 latent dims."""
    dev, latent = device.torch_device, MLA_LATENT + MLA_ROPE
    scale = latent ** -0.5

    def make():
        q = torch.randn(batch_size, num_heads, latent, device=dev, dtype=BF16)
        kv = torch.randn(batch_size, isl, latent, device=dev, dtype=BF16)

        def attend():
            weights = torch.softmax(torch.bmm(q, kv.transpose(1, 2)) * scale, dim=-1)
            return torch.bmm(weights, kv[..., :MLA_LATENT])

        return attend

    return device.rotated_s(make)


def mla_prefill_s(device: Device, batch_size: int, isl: int, num_heads: int) -> float:
    """Causal MLA prefill with per-head keys (192 = 128 + 64 rope) and values (128)."""
    dev = device.torch_device

    def make():
        q, k = (torch.randn(batch_size, num_heads, isl, MLA_QK, device=dev, dtype=BF16) for _ in range(2))
        v = torch.randn(batch_size, num_heads, isl, MLA_V, device=dev, dtype=BF16)
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return device.rotated_s(make)


def elementwise_bytes(op: str, num_tokens: int, width: int) -> float:
    """Bytes an elementwise op moves, as the step model counts them (16-bit activations)."""
    per_unit = ADD_NORM_BYTES_PER_HIDDEN if op == "add_norm" else ACTIVATION_BYTES_PER_WIDTH
    return float(per_unit * num_tokens * width)


def elementwise_s(device: Device, op: str, num_tokens: int, width: int) -> float:
    """add_norm: residual add then RMSNorm over `width`; activation: SiLU(gate) x up over `width`."""
    dev = device.torch_device

    def make():
        if op == "add_norm":
            x, residual = (torch.randn(num_tokens, width, device=dev, dtype=BF16) for _ in range(2))
            weight = torch.ones(width, device=dev, dtype=BF16)
            return lambda: F.rms_norm(x + residual, (width,), weight, NORM_EPS)
        gate_up = torch.randn(num_tokens, 2 * width, device=dev, dtype=BF16)
        return lambda: F.silu(gate_up[:, :width]) * gate_up[:, width:]

    return device.rotated_s(make)


def hbm_copy_s(device: Device, n_bytes: int) -> float:
    """A device-to-device copy of `n_bytes` (it reads and writes them: 2 x n_bytes through HBM), issued
    eagerly: captured in a graph, a copy becomes a memcpy node that a copy engine may run, slower than
    the kernels a decode step reads HBM with."""
    src = torch.empty(n_bytes, dtype=torch.uint8, device=device.torch_device).random_(0, 255)
    dst = torch.empty_like(src)
    return device.median_s(lambda: dst.copy_(src), cold=True, graphed=False)
