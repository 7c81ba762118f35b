"""Claim 1: batching is the biggest lever; unbatched decode costs ~1000x more per token.

DeepSeek-V3 (fp8) on one GB200 NVL72 rack: one sequence at a time on TP16 x EP16 against a batch of
4096 on EP64, then the planner's batch curve for the bundled problem (cost per token against batch).
TP16 is the widest tensor-parallel split of the fp8 checkpoint that the engines load: its 128-wide
scaling blocks divide the dense MLP (18432 = 144 blocks) 16 ways but not 32 or 64, and `evaluate`
refuses what `planner estimate` refuses.
"""

from common import parse_args

from planner.output.charts import plot_curve
from planner.paths import data_dir
from planner.problem.schema import load_problem
from planner.quick import evaluate
from planner.studies.sweeps import batch_curve

args = parse_args(__doc__)
batched = evaluate("deepseek-v3", "gb200-nvl72", 4096, 2048, 512, ep=64, weights="fp8", kv_cache="fp8")
single = evaluate("deepseek-v3", "gb200-nvl72", 1, 2048, 512, tp=16, ep=16, dp_attn=1, weights="fp8", kv_cache="fp8")
for name, e in (("batch 1 (TP16 x EP16)", single), ("batch 4096 (EP64)", batched)):
    print(f"{name:<20} TPOT {e.tpot_s * 1e3:7.2f} ms   ${e.usd_per_million_decode_tokens:10.4f} per million output tokens   "
          f"dominant: {e.decode_step.dominant_term}")
ratio = single.usd_per_million_decode_tokens / batched.usd_per_million_decode_tokens
print(f"claim 1: unbatched decode costs {ratio:.0f}x more per token (lecture: ~1000x)")

curve = batch_curve(load_problem(data_dir("problems") / "deepseek-v3-gb200-nvl72.yaml"), points=16 if args.quick else 48)
path = plot_curve(curve, args.out / "claim_01_batch_curve.png", "Claim 1: cost per token against batch, DeepSeek-V3 on GB200 NVL72")
print(f"chart: {path}")
