"""Claim 7: long context is a memory-bandwidth wall. KV fetch overtakes compute at
S* = 2 N_active BW_hbm / (F kv), whatever the batch. Read backwards, a provider's price step at
~200K tokens implies a KV cache of about 2 KB per token.
"""

from pathlib import Path

from common import parse_args, row

from planner.hardware.catalog import load_hardware_catalog
from planner.model.architecture import kv_bytes_per_token, param_counts
from planner.model.catalog import load_model_catalog
from planner.output.charts import plt
from planner.physics.roofline import kv_compute_crossover_context_tokens
from planner.quick import evaluate
from planner.studies.prices import load_price_sheet, read_prices

args = parse_args(__doc__)
hw, models = load_hardware_catalog(), load_model_catalog()
h100 = hw.accelerators["h100-sxm"]
print(row("model (bf16 on H100)", "KV B/token", "S* tokens"))
for model_id in ("llama-3.1-8b", "llama-3.1-70b", "qwen3-32b", "deepseek-v3", "kimi-k2"):
    arch = models[model_id]
    kv = kv_bytes_per_token(arch, 2.0)
    s_star = kv_compute_crossover_context_tokens(param_counts(arch).active_matmul, h100.hbm_bandwidth_bytes_per_s,
                                                 h100.dense_flops_per_s["bf16"], kv)
    print(row(model_id, f"{kv:,.0f}", f"{s_star:,.0f}"))

contexts = [1024, 4096, 16384, 65536] if args.quick else [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
rows = []
for batch in (8, 32):
    for s in contexts:
        e = evaluate("llama-3.1-70b", "hgx-h100", batch, s, 1, tp=8, step_model="roofline")  # the claim is about the ideal terms
        rows.append((batch, s, e.decode_step.compute_s, e.decode_step.kv_s))
crossings = {}
for batch in (8, 32):
    mine = [r for r in rows if r[0] == batch]
    k = next(i for i, (_, _, c, kv) in enumerate(mine) if kv > c)
    crossings[batch] = (mine[k - 1][1], mine[k][1])
fig, ax = plt.subplots(figsize=(7, 4.5))
for batch, marker, colour in ((8, "o", "tab:blue"), (32, "s", "tab:red")):
    mine = [r for r in rows if r[0] == batch]
    ax.plot([r[1] for r in mine], [r[2] * 1e3 for r in mine], marker + "-", color=colour, label=f"compute, batch {batch}")
    ax.plot([r[1] for r in mine], [r[3] * 1e3 for r in mine], marker + "--", color=colour, label=f"KV fetch, batch {batch}")
ax.axvline(s_star_peak := kv_compute_crossover_context_tokens(
    param_counts(models["llama-3.1-70b"]).active_matmul, h100.hbm_bandwidth_bytes_per_s, h100.dense_flops_per_s["bf16"],
    kv_bytes_per_token(models["llama-3.1-70b"], 2.0)), color="0.4", linestyle=":", label=f"S* = {s_star_peak:,.0f} (peak rates)")
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("context per sequence (tokens)")
ax.set_ylabel("time per decode step (ms)")
ax.set_title("Claim 7: Llama 3.1 70B TP8 on H100, KV fetch against compute")
ax.legend(fontsize=8)
ax.grid(True, which="both", alpha=0.3)
fig.tight_layout()
fig.savefig(args.out / "claim_07_long_context.png", dpi=130)
print(f"chart: {args.out / 'claim_07_long_context.png'}")
arch = models["llama-3.1-70b"]
s_star = kv_compute_crossover_context_tokens(param_counts(arch).active_matmul, h100.hbm_bandwidth_bytes_per_s,
                                             h100.dense_flops_per_s["bf16"], kv_bytes_per_token(arch, 2.0))
print(f"claim 7: for Llama 3.1 70B on H100 KV fetch overtakes compute near S* = {s_star:,.0f} tokens (peak rates); "
      "the roofline crosses " + " and ".join(f"between {lo:,} and {hi:,} tokens at batch {b}" for b, (lo, hi) in crossings.items()))

# backwards: Gemini 2.5 Pro doubles its input price past 200K tokens (examples/prices/gemini-2.5-pro.yaml)
reading = read_prices(load_price_sheet(Path(__file__).parent / "prices" / "gemini-2.5-pro.yaml"), active_params=1e11)
print(reading.lines[1])
print(f"claim 7 (backwards): a price step at 200K tokens implies {reading.implied_kv_bytes_per_token:,.0f} bytes of KV per token "
      "for a 100B-active model on GB200 (lecture: about 2 KB)")
