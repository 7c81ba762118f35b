"""Claim 2: compute equals weight fetch at B* = (F / BW_hbm) (b_w / 2) (N_total / N_active).

F / BW is ~300 on every HBM generation at matched precision, so B* ~ 300 x sparsity: a few thousand
tokens in flight for a DeepSeek-V3-like MoE.
"""

from common import parse_args, row

from planner.hardware.catalog import load_hardware_catalog
from planner.model.architecture import param_counts
from planner.model.catalog import load_model_catalog
from planner.physics.roofline import critical_batch_size
from planner.precision import FlopsFormat

parse_args(__doc__)
hw, models = load_hardware_catalog(), load_model_catalog()
print(row("accelerator", "format", "F/BW (peak)", "B* dense"))
for accel_id in ("h100-sxm", "h200-sxm", "b200", "gb200", "b300", "mi300x", "mi355x", "tpu-v5p", "tpu-v6e", "tpu-v7", "trainium2"):
    a = hw.accelerators[accel_id]
    fmt = FlopsFormat.BF16
    ratio = a.dense_flops_per_s[fmt] / a.hbm_bandwidth_bytes_per_s
    print(row(accel_id, fmt, f"{ratio:.0f}", f"{critical_batch_size(a.dense_flops_per_s[fmt], a.hbm_bandwidth_bytes_per_s, 2.0, 1, 1):.0f}"))
print()
gb200 = hw.accelerators["gb200"]
print(row("model on GB200 (fp8)", "sparsity", "B*"))
for model_id in ("llama-3.1-70b", "qwen3-235b-a22b", "deepseek-v3", "kimi-k2", "gpt-oss-120b"):
    counts = param_counts(models[model_id])
    sparsity = counts.total / counts.active_matmul
    b_star = critical_batch_size(gb200.dense_flops_per_s["fp8"], gb200.hbm_bandwidth_bytes_per_s, 1.0, counts.total, counts.active_matmul)
    print(row(model_id, f"{sparsity:.1f}", f"{b_star:.0f}"))
ds = param_counts(models["deepseek-v3"])
b = critical_batch_size(gb200.dense_flops_per_s["fp8"], gb200.hbm_bandwidth_bytes_per_s, 1.0, ds.total, ds.active_matmul)
print(f"claim 2: F/BW ~300 at matched precision; DeepSeek-V3 needs B* = {b:.0f} tokens in flight on GB200 (a few thousand)")
