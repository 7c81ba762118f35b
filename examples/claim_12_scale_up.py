"""Claim 12: the size of the scale-up domain (NVL72 -> Rubin NVL144 / NVL576), more than raw FLOP/s,
is what a new rack generation unlocks.

DeepSeek-V3 and Kimi K2 planned on each generation alone, and the same 64 Blackwell GPUs as one
NVL72 rack or eight HGX B200 boxes.
"""

from common import parse_args
from rich.console import Console

from planner.output.charts import plot_compare
from planner.output.sweep_report import render_compare
from planner.paths import data_dir
from planner.problem.schema import load_problem
from planner.quick import evaluate
from planner.studies.sweeps import compare_racks

args = parse_args(__doc__)
rack = evaluate("deepseek-v3", "gb200-nvl72", 4096, 2048, 512, ep=64, weights="fp8", kv_cache="fp8")
boxes = evaluate("deepseek-v3", "hgx-b200", 4096, 2048, 512, ep=64, weights="fp8", kv_cache="fp8")
flops = rack.inputs.rack.accelerator.dense_flops_per_s["fp8"] / boxes.inputs.rack.accelerator.dense_flops_per_s["fp8"]
speed = rack.output_tokens_per_s_per_accelerator / boxes.output_tokens_per_s_per_accelerator
print(f"64 Blackwell GPUs, EP64: one NVL72 rack makes {rack.output_tokens_per_s_per_accelerator:,.0f} tokens/s per GPU, eight HGX B200 "
      f"boxes {boxes.output_tokens_per_s_per_accelerator:,.0f} ({speed:.1f}x) for {flops:.2f}x the FLOP/s")
racks = ["hgx-h100", "hgx-b200", "gb200-nvl72", "vr-nvl144"] if args.quick else \
    ["hgx-h100", "hgx-h200", "hgx-b200", "gb200-nvl72", "gb300-nvl72", "vr-nvl144", "rubin-ultra-nvl576"]
problem = load_problem(data_dir("problems") / "kimi-k2-hgx-h100.yaml")
rows = compare_racks(problem, racks)
render_compare(rows, Console(width=150), "Kimi K2 on each rack generation (as many racks as needed)")
path = plot_compare(rows, args.out / "claim_12_generations.png", "Claim 12: Kimi K2 on each rack generation")
print(f"chart: {path}")
print(f"claim 12: the NVL72 domain gives {speed:.1f}x the throughput per GPU of the same GPUs in 8-GPU boxes, "
      f"with {flops:.2f}x the FLOP/s")
