"""Claim 4: on a Blackwell NVL72 rack, 256 experts over 64 GPUs is 4 experts per GPU with the
all-to-all on NVLink; an expert layer spread over two racks pays the ~8x slower scale-out network for
the copies that go to the other rack (half of a token's eight; the other half stay on NVLink).
The claim is about link bandwidth, so the script evaluates the ideal roofline (step_model="roofline"):
under the calibrated model the engine's all-to-all kernels add a fixed time per layer that hides the
difference at these token counts.
"""

from common import parse_args

from planner.quick import evaluate

parse_args(__doc__)
inside = evaluate("deepseek-v3", "gb200-nvl72", 4096, 2048, 512, ep=64, weights="fp8", kv_cache="fp8", step_model="roofline")
spanning = evaluate("deepseek-v3", "gb200-nvl72", 8192, 2048, 512, ep=128, weights="fp8", kv_cache="fp8", step_model="roofline")
print(f"EP64 in one rack: {256 // 64} experts per GPU, expert links {inside.links.stage.link_kind}, "
      f"communication {inside.decode_step.comm_s * 1e3:.2f} ms per token step")
print(f"EP128 over two racks: {256 // 128} experts per GPU, expert links {spanning.links.stage.link_kind}, "
      f"communication {spanning.decode_step.comm_s * 1e3:.2f} ms per token step (twice the tokens)")
per_token_inside = inside.decode_step.comm_s / 4096
per_token_spanning = spanning.decode_step.comm_s / 8192
up, out = inside.links.stage.injection_bytes_per_s, spanning.links.stage.injection_bytes_per_s
print(f"bandwidth per GPU for the all-to-all: {up / 1e9:.0f} GB/s on NVLink, {out / 1e9:.0f} GB/s over the NICs ({up / out:.1f}x)")
print(f"claim 4: crossing racks makes each token's all-to-all {per_token_spanning / per_token_inside:.1f}x slower")
