"""Claim 10: "fast mode": a smaller batch buys per-user speed at a steep price per token; the
cost-against-speed Pareto frontier shows it (the lecture: ~2.5x the speed for ~6x the price).
"""

from common import parse_args

from planner.output.charts import plot_frontier
from planner.output.sweep_report import frontier_summary
from planner.paths import data_dir
from planner.problem.schema import load_problem
from planner.studies.sweeps import FAST_MODE_SPEEDUP, sweep_frontier

args = parse_args(__doc__)
problem = load_problem(data_dir("problems") / "deepseek-v3-gb200-nvl72.yaml")
frontier = sweep_frontier(problem, points=8 if args.quick else 20)
for p in sorted(frontier.frontier, key=lambda p: p.tokens_per_s_per_user):
    multiple = frontier.price_multiple(p)
    print(f"{p.tokens_per_s_per_user:7.1f} tokens/s per user   ${p.usd_per_million_output_tokens:9.4f}/M   "
          f"{'' if multiple is None else f'{FAST_MODE_SPEEDUP:g}x speed costs {multiple:5.1f}x   '}{p.plan}")
for line in frontier_summary(frontier):
    print(line)
path = plot_frontier(frontier, args.out / "claim_10_frontier.png", "Claim 10: DeepSeek-V3 on GB200 NVL72, cost against speed")
print(f"chart: {path}")
steep = max(m for p in frontier.frontier if (m := frontier.price_multiple(p)) is not None)
print(f"claim 10: {FAST_MODE_SPEEDUP:g}x the per-user speed costs up to {steep:.1f}x per token along the frontier "
      f"(lecture: ~6x); at slow baselines it is nearly free, at fast ones steep")
