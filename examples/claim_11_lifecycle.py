"""Claim 11: pre-training, RL and inference costs tend to equalise (6ND, ~2-6ND, 2ND), which puts
frontier models ~100x past Chinchilla-optimal token counts.

A DeepSeek-V3-sized model (37B active) served at 50M tokens/s for two months, inference priced by
the planner's plan for the bundled DeepSeek-V3 problem, trained on 8,192 GB200s with an 8-stage
pipeline.
"""

from common import parse_args

from planner.hardware.catalog import load_hardware_catalog
from planner.model.architecture import param_counts
from planner.model.catalog import load_model_catalog
from planner.paths import data_dir
from planner.problem.resolve import resolve_problem
from planner.problem.schema import load_problem
from planner.solver.solve import solve
from planner.studies.lifecycle import TrainingLayout, lifecycle

parse_args(__doc__)
n = param_counts(load_model_catalog()["deepseek-v3"]).active_matmul
plan = solve(resolve_problem(load_problem(data_dir("problems") / "deepseek-v3-gb200-nvl72.yaml")), explain=False)
per_token = plan.workload_usd_per_million_output_tokens("chat") / 1e6
gb200 = load_hardware_catalog().accelerators["gb200"]
layout = TrainingLayout("gb200", 8192, gb200.dense_flops_per_s["bf16"] * gb200.compute_fraction_by_format["bf16"], gb200.price_usd_per_hour, 8, 32)
result = lifecycle(n, 5e7, 60 * 86400, per_token, layout, 4.0, 14.8e12, "the planned DeepSeek-V3 deployment")
for line in result.lines:
    print(line)
print(f"claim 11: the balance puts pre-training {result.pretrain_tokens_equal_flops / result.chinchilla_tokens:.0f}x (equal FLOPs) "
      f"to {result.pretrain_tokens_equal_cost / result.chinchilla_tokens:.0f}x (equal cost) past Chinchilla (lecture: ~100x)")
