"""Expert placement benchmark: prints figures, asserts nothing (machines are noisy).

For DeepSeek-V3 (256 routed experts, 58 MoE layers) and Kimi K2 (384 experts, 60 MoE layers), on
skewed synthetic loads (lognormal sigma 0.9, the skew of docs/cpsat.md) and
several expert-parallel widths with one redundant slot per rank, compares:

- eplb:   the EPLB-style baseline (hot experts replicated, then longest-processing-time packing);
- ours:   the same two steps followed by the swap local search (planner's default);
- cpsat:  ours as a complete hint to CP-SAT min-max (method "cpsat"), a few layers only.

Per method: step imbalance (sum of the hottest rank's load over the sum of mean loads, the factor the
MoE step time pays), the worst layer's gap to the lower bound max(mean rank load, hottest copy) for the
replica counts the method chose, the median wall time over `--repeats` runs, and in how many layers
the method's hottest rank is above the EPLB-style baseline's on the same loads.

Part 2, re-placement in service: DeepSeek-V3 at EP64 placed for one profile, then the loads drift
(each expert's load times lognormal(0, 0.3)); for move budgets per layer, the imbalance reached on
the new loads and the expert copies that must be loaded.

Part 3, heavy skew: Zipf(1.4) loads (each layer a random permutation of 1/rank^1.4 over the experts),
EPLB-style against ours; the step imbalance and the worst layer's gap are against the mean rank load,
the bound no replica count can beat (the per-copy bound moves with the replica counts each method picks).

Part 4, group-limited routing: DeepSeek-V3 at EP64 over eight 8-GPU H100 domains, its experts spread
over all ranks against the planner's choice (whole groups per domain when that costs no balance,
planner/placement/groups.py): the imbalance each reaches, the domains a token is sent to, and an
SGLang prefill pass (2,048-token prompts, 512 per replica) estimated with both.

    python benchmarks/bench_experts.py [--repeats 3] [--cpsat-layers 4] [--cpsat-seconds 2] [--quick]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's planner, not an installed one

from planner.model.catalog import load_model_catalog
from planner.model.expert_loads import synthetic_profile
from planner.placement.experts import CPSAT_SHARE, eplb_baseline, place_experts

CASES = [("deepseek-v3", 32), ("deepseek-v3", 64), ("deepseek-v3", 128), ("kimi-k2", 48), ("kimi-k2", 96), ("kimi-k2", 128)]


class _FewLayers:
    """A model restricted to its first `n` MoE layers (for the slow CP-SAT runs)."""

    def __init__(self, arch, n: int):
        self.moe, self.n_layers, self.n_moe_layers = arch.moe, n, n
        self.layer_is_moe = (True,) * n


def _timed(fn, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpsat-layers", type=int, default=4)
    parser.add_argument("--cpsat-seconds", type=float, default=2.0, help="CP-SAT search time per layer")
    parser.add_argument("--quick", action="store_true", help="smoke run: one case, one repeat, one CP-SAT layer")
    args = parser.parse_args()
    cases = CASES[:1] if args.quick else CASES
    if args.quick:
        args.repeats, args.cpsat_layers, args.cpsat_seconds = 1, 1, 0.2
    catalog = load_model_catalog()
    head = f"{'model':12} {'EP':>4} {'layers':>6} {'method':6} {'imbalance':>10} {'worst gap':>10} {'time':>9} {'worse than eplb':>16}"
    print(head)
    print("-" * len(head))
    for model_id, ep in cases:
        arch = catalog[model_id]
        loads = synthetic_profile(arch, sigma=0.9, seed=0)
        rows = [
            ("eplb", arch, loads, lambda a=arch, lo=loads, ep=ep: eplb_baseline(a, lo, ep, 1)),
            ("ours", arch, loads, lambda a=arch, lo=loads, ep=ep: place_experts(a, lo, ep, 1)),
        ]
        few = _FewLayers(arch, args.cpsat_layers)
        few_loads = loads[: args.cpsat_layers]
        rows += [
            ("eplb", few, few_loads, lambda a=few, lo=few_loads, ep=ep: eplb_baseline(a, lo, ep, 1)),
            ("ours", few, few_loads, lambda a=few, lo=few_loads, ep=ep: place_experts(a, lo, ep, 1)),
            ("cpsat", few, few_loads, lambda a=few, lo=few_loads, ep=ep: place_experts(  # CP-SAT searches CPSAT_SHARE of the limit
                a, lo, ep, 1, method="cpsat", time_limit_s=args.cpsat_seconds * args.cpsat_layers / CPSAT_SHARE)),
        ]
        for method, a, _, fn in rows:
            placement, seconds = _timed(fn, 1 if method == "cpsat" else args.repeats)
            if method == "eplb":
                baseline = placement
            proven = f"  ({placement.layers_proven_optimal}/{len(placement.layers)} proven)" if method == "cpsat" else ""
            worse = "-" if method == "eplb" else f"{worse_layers(placement, baseline)} layers"
            print(f"{model_id:12} {ep:>4} {a.n_moe_layers:>6} {method:6} {placement.imbalance:>10.4f} "
                  f"{placement.worst_gap_to_bound:>10.2%} {seconds:>8.3f}s {worse:>16}{proven}")
        print()
    _drift(catalog["deepseek-v3"], args.repeats, budgets=(8,) if args.quick else (2, 8, 32, None))
    _zipf(catalog, cases, args.repeats)
    _groups(catalog["deepseek-v3"], quick=args.quick)


def worse_layers(placement, baseline) -> int:
    """Layers whose hottest rank is above the baseline's (beyond rounding)."""
    return sum(p.max_load > b.max_load * (1 + 1e-12) for p, b in zip(placement.layers, baseline.layers, strict=True))


def zipf_profile(arch, s: float = 1.4, seed: int = 0):
    """One row per MoE layer: 1/rank^s over the experts, in a random order per layer."""
    rng = np.random.default_rng(seed)
    base = 1.0 / np.arange(1, arch.moe.n_routed_experts + 1) ** s
    return np.stack([rng.permutation(base) for _ in range(arch.n_moe_layers)])


def _zipf(catalog, cases, repeats: int) -> None:
    print("Zipf 1.4 loads, one redundant slot per rank: step imbalance and worst layer against the mean rank load")
    print(f"{'model':12} {'EP':>4} {'eplb':>8} {'ours':>8} {'worst gap':>10} {'time (ours)':>12} {'worse than eplb':>16}")
    for model_id, ep in cases:
        arch = catalog[model_id]
        loads = zipf_profile(arch)
        base = eplb_baseline(arch, loads, ep, 1)
        ours, seconds = _timed(lambda a=arch, lo=loads, ep=ep: place_experts(a, lo, ep, 1), repeats)
        gap = max(p.max_load / p.mean_load - 1 for p in ours.layers)
        print(f"{model_id:12} {ep:>4} {base.imbalance:>8.4f} {ours.imbalance:>8.4f} {gap:>10.2%} {seconds:>11.3f}s "
              f"{worse_layers(ours, base):>9} layers")


def _drift(arch, repeats: int, ep: int = 64, budgets: tuple = (2, 8, 32, None)) -> None:
    loads = synthetic_profile(arch, sigma=0.9, seed=0)
    previous = place_experts(arch, loads, ep, 1).physical_to_logical(arch)
    drifted = loads * np.random.default_rng(7).lognormal(0, 0.3, size=loads.shape)
    print(f"re-placement after drift: {arch.id}, EP{ep}, {arch.n_moe_layers} MoE layers, {ep * (arch.moe.n_routed_experts // ep + 1)} "
          "slots per layer")
    print(f"{'budget/layer':>12} {'imbalance':>10} {'moves':>7} {'time':>9}")
    stay = place_experts(arch, drifted, ep, 1, previous=previous, max_moves_per_layer=0)
    print(f"{'(unchanged)':>12} {stay.imbalance:>10.4f} {stay.moves:>7}")
    for budget in budgets:
        placement, seconds = _timed(lambda b=budget: place_experts(arch, drifted, ep, 1, previous=previous, max_moves_per_layer=b), repeats)
        label = "free" if budget is None else str(budget)
        print(f"{label:>12} {placement.imbalance:>10.4f} {placement.moves:>7} {seconds:>8.3f}s")


def _groups(arch, quick: bool = False, ep: int = 64, rack: str = "hgx-h100") -> None:
    """Part 4: DeepSeek-V3's group-limited routing at EP64 over eight 8-GPU domains. Whole groups per
    domain send each token to 4 domains instead of 5.25 (DeepEP normal mode, prefill); the planner
    keeps them whole only when that costs no balance. An SGLang prefill pass is estimated with each."""
    from dataclasses import replace

    from planner.cli.estimate import estimate_inputs
    from planner.cli.parser import build_parser
    from planner.physics.estimate import estimate
    from planner.physics.roofline import domains_per_token
    from planner.placement.groups import expert_groups_local

    print()
    print(f"Group-limited routing, {arch.id} EP{ep} on {rack} (8 accelerators per domain): groups spread, and the planner's choice")
    print(f"{'profile':10} {'placement':9} {'groups local':>12} {'imbalance':>10} {'domains/token':>14} {'prefill pass':>13} {'time':>8}")
    args = build_parser().parse_args(["estimate", "--model", arch.id, "--rack", rack, "--ep", str(ep), "--batch", "512", "--isl", "2048",
                                      "--osl", "1", "--role", "prefill", "--engine", "sglang", "--weights-precision", "fp8",
                                      "--kv-precision", "fp8"])
    base = estimate_inputs(args)
    for name in (("uniform",) if quick else ("uniform", "lognormal")):
        loads = synthetic_profile(arch, distribution=name, sigma=0.9, seed=0)
        for label, rpn in (("spread", None), ("planner", 8)):
            start = time.perf_counter()
            placement = place_experts(arch, loads, ep, 1, ranks_per_node=rpn)
            seconds = time.perf_counter() - start
            local = rpn is not None and expert_groups_local(arch, ep, 8, [[list(r) for r in layer.slots] for layer in placement.layers])
            groups = (arch.moe.expert_groups, arch.moe.groups_per_token) if local else (1, 1)
            result = estimate(replace(base, expert_imbalance=placement.imbalance, expert_routing="balanced", expert_groups_local=local))
            reach = domains_per_token(arch.moe.experts_per_token, ep // 8, *groups)
            print(f"{name:10} {label:9} {local!s:>12} {placement.imbalance:>10.4f} {reach:>14.2f} "
                  f"{result.prefill_latency_s * 1e3:>10.1f} ms {seconds:>7.2f}s")

if __name__ == "__main__":
    main()
