"""A dense model's whole decode step, measured to check the step model's sum of kernels: every layer
(RMSNorm, fused QKV GEMM, attention over a bf16 KV cache of `context` tokens per sequence, output
projection, RMSNorm, fused gate-up GEMM, SiLU x up, down projection, residual adds), the final norm
and the LM head, for `batch_size` sequences of one new token each, on one device. On a GPU the step
is captured once as a CUDA graph and replayed, as engines run decode steps; on a CPU it runs eagerly.
Rotary embeddings, writing the new token's K/V and sampling are left out (a few elementwise kernels
per layer). Weights are random bf16 of the model's shapes; no checkpoint is read."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from planner.probe.timing import Device

__all__ = ["StepModel", "build_step_model", "decode_step_s"]

BF16 = torch.bfloat16
NORM_EPS = 1e-6


@dataclass
class StepModel:
    """Random weights of a dense GQA model (one dict of tensors per layer) and its dims."""

    dims: dict
    layers: list[dict[str, torch.Tensor]]
    final_norm: torch.Tensor
    head: torch.Tensor


def build_step_model(device: Device, dims: dict) -> StepModel:
    dev, h, i = device.torch_device, dims["hidden_size"], dims["inter_size"]
    q, kv = dims["num_heads"] * dims["head_dim"], dims["num_key_value_heads"] * dims["head_dim"]

    def weight(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=BF16) * shape[-1] ** -0.5

    layers = [{"norm1": torch.ones(h, device=dev, dtype=BF16), "qkv": weight(q + 2 * kv, h), "o": weight(h, q),
               "norm2": torch.ones(h, device=dev, dtype=BF16), "gate_up": weight(2 * i, h), "down": weight(h, i)}
              for _ in range(dims["num_layers"])]
    return StepModel(dims, layers, torch.ones(h, device=dev, dtype=BF16), weight(dims["vocab_size"], h))


def _forward(model: StepModel, x: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    d = model.dims
    b, h, heads, head_dim, inter = x.shape[0], d["hidden_size"], d["num_heads"], d["head_dim"], d["inter_size"]
    gqa = heads != d["num_key_value_heads"]
    for w, (k, v) in zip(model.layers, caches, strict=True):
        qkv = F.rms_norm(x, (h,), w["norm1"], NORM_EPS) @ w["qkv"].t()
        query = qkv[:, :heads * head_dim].reshape(b, heads, 1, head_dim)
        attended = F.scaled_dot_product_attention(query, k, v, enable_gqa=gqa).reshape(b, heads * head_dim)
        x = x + attended @ w["o"].t()
        gate_up = F.rms_norm(x, (h,), w["norm2"], NORM_EPS) @ w["gate_up"].t()
        x = x + (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]) @ w["down"].t()
    return F.rms_norm(x, (h,), model.final_norm, NORM_EPS) @ model.head.t()


def decode_step_s(device: Device, model: StepModel, batch_size: int, context: int) -> float:
    """The median time of one decode step of `batch_size` sequences holding `context` cached tokens."""
    d, dev = model.dims, device.torch_device
    shape = (batch_size, d["num_key_value_heads"], context, d["head_dim"])
    caches = [(torch.randn(shape, device=dev, dtype=BF16), torch.randn(shape, device=dev, dtype=BF16)) for _ in model.layers]
    x = torch.randn(batch_size, d["hidden_size"], device=dev, dtype=BF16)
    return device.median_s(lambda: _forward(model, x, caches))  # on a GPU, captured once and replayed (Device.median_s)
