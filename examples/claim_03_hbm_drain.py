"""Claim 3: HBM drains in ~15-30 ms on every generation; a batch departs about every 20 ms and
worst-case queueing is about two departures.
"""

from common import parse_args, row

from planner.hardware.catalog import load_hardware_catalog
from planner.physics.roofline import hbm_drain_time_s
from planner.quick import evaluate

parse_args(__doc__)
hw = load_hardware_catalog()
print(row("accelerator", "HBM GB", "TB/s", "drain ms"))
drains = []
for a in hw.accelerators.values():
    t = hbm_drain_time_s(a.hbm_capacity_bytes, a.hbm_bandwidth_bytes_per_s)
    drains.append(t)
    print(row(a.id, f"{a.hbm_capacity_bytes / 1e9:.0f}", f"{a.hbm_bandwidth_bytes_per_s / 1e12:.2f}", f"{t * 1e3:.1f}"))
print(f"drain times span {min(drains) * 1e3:.0f}-{max(drains) * 1e3:.0f} ms")
# a batch that fills HBM departs once per step; a request arriving at random waits for the step in
# progress (half a step on average), then rides in the next: the worst case is two departures
e = evaluate("llama-3.1-70b", "hgx-h100", 200, 2048, 256, tp=8)
print(f"Llama 3.1 70B TP8 on HGX H100, batch 200 ({e.memory.used_bytes / e.memory.capacity_bytes:.0%} of HBM): step "
      f"{e.tpot_s * 1e3:.1f} ms, mean wait for the step in progress {e.queue_wait_s * 1e3:.1f} ms, "
      f"TTFT {e.ttft_s * 1e3:.0f} ms (p90 {e.ttft_p90_s * 1e3:.0f} ms)")
print(f"claim 3: HBM drains in {min(drains) * 1e3:.0f}-{max(drains) * 1e3:.0f} ms; a batch departs every "
      f"{e.tpot_s * 1e3:.0f} ms here, and the worst-case queueing is a whole departure waited before the one that "
      f"carries the prompt")
