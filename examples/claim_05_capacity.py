"""Claim 5: a Hopper box holds 8 x 80 GB = 640 GB, a Blackwell NVL72 rack ~13-20 TB: a
trillion-parameter model and its KV cache fit in one Blackwell rack and not in one Hopper box.
"""

from common import parse_args, row

from planner.hardware.catalog import load_hardware_catalog
from planner.model.architecture import param_counts
from planner.model.catalog import load_model_catalog
from planner.precision import Precision, bytes_per_value

parse_args(__doc__)
hw, models = load_hardware_catalog(), load_model_catalog()
print(row("scale-up domain", "accelerators", "HBM TB"))
for rack_id in ("hgx-h100", "hgx-h200", "hgx-b200", "gb200-nvl72", "gb300-nvl72", "vr-nvl144", "rubin-ultra-nvl576", "tpu-v7-64"):
    r = hw.racks[rack_id]
    print(row(rack_id, r.n_accelerators, f"{r.n_accelerators * r.accelerator.hbm_capacity_bytes / 1e12:.2f}"))
print()
for model_id, fmt in (("kimi-k2", Precision.FP8), ("deepseek-v3", Precision.FP8), ("llama-3.1-405b", Precision.BF16)):
    weights = param_counts(models[model_id]).total * bytes_per_value(fmt)
    fits = [rid for rid in ("hgx-h100", "gb200-nvl72") if weights < hw.racks[rid].n_accelerators * hw.racks[rid].accelerator.hbm_capacity_bytes]
    print(f"{model_id} in {fmt}: {weights / 1e12:.2f} TB of weights; fits one domain of: {', '.join(fits) or 'neither'}")
kimi = param_counts(models["kimi-k2"]).total * bytes_per_value(Precision.FP8)
h100 = hw.racks["hgx-h100"]
nvl = hw.racks["gb200-nvl72"]
print(f"claim 5: Kimi K2 ({kimi / 1e12:.2f} TB in fp8) overflows an HGX H100 box "
      f"({h100.n_accelerators * h100.accelerator.hbm_capacity_bytes / 1e9:.0f} GB) and leaves "
      f"{(nvl.n_accelerators * nvl.accelerator.hbm_capacity_bytes - kimi) / 1e12:.1f} TB for KV cache in one GB200 NVL72 rack")
