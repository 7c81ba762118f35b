"""Claim 8: decode is memory-bound and prefill compute-bound, which is why output tokens are priced
~5x input tokens.
"""

from pathlib import Path

from common import parse_args, row

from planner.quick import evaluate
from planner.studies.prices import load_price_sheet, read_prices

parse_args(__doc__)
cases = [("llama-3.1-8b", "hgx-h100", 128, 1, {}), ("llama-3.1-70b", "hgx-h100", 64, 8, {}),
         ("qwen3-32b", "hgx-h200", 128, 2, {}), ("deepseek-v3", "gb200-nvl72", 4096, 1, {"ep": 64, "weights": "fp8", "kv_cache": "fp8"})]
print(row("model on rack", "decode", "prefill", "$/M in", "$/M out", "out/in", widths=[34, 10, 10, 10, 10, 8]))
ratios = []
for model, rack, batch, tp, extra in cases:
    e = evaluate(model, rack, batch, 1024, 256, tp=tp, **extra)
    ratio = e.usd_per_million_decode_tokens / e.usd_per_million_prefill_tokens
    ratios.append(ratio)
    print(row(f"{model} on {rack}", e.decode_step.bound, e.prefill_chunk_step.bound, f"{e.usd_per_million_prefill_tokens:.3f}",
              f"{e.usd_per_million_decode_tokens:.3f}", f"{ratio:.1f}x", widths=[34, 10, 10, 10, 10, 8]))
print(f"claim 8: output tokens cost {min(ratios):.1f}-{max(ratios):.1f}x input tokens (lecture: ~5x)")

# backwards: Claude Sonnet's $15 output / $3 input (examples/prices/claude-sonnet.yaml)
reading = read_prices(load_price_sheet(Path(__file__).parent / "prices" / "claude-sonnet.yaml"))
print(next(line for line in reading.lines if line.startswith("2.")))
