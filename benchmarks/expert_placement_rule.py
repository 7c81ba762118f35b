"""How the fidelity benchmark maps a source's expert placement onto `planner estimate`.

A row whose source says it balanced its experts with DeepSeek's EPLB (`planner_expert_placement`
eplb) runs its expert kernels at the balanced
router's rate times the imbalance EPLB leaves: the planner's EPLB-style placement (replicate hot
experts, then longest-processing-time packing: `planner.placement.experts.eplb_baseline`) of the
planner's default skewed load profile (lognormal sigma 0.9, `planner.model.expert_loads`) on the
row's expert-parallel ranks and slots. This is how `planner solve` treats a placed load profile;
the sources' own load statistics are not published.
"""

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's planner

EPLB = "eplb"


@functools.lru_cache(maxsize=64)
def eplb_imbalance(model_id: str, ep: int, redundant_total: int) -> float:
    """The hottest rank's expert load over the mean after EPLB places the synthetic profile on `ep`
    ranks holding the experts plus `redundant_total` copies (slots per rank rounded down)."""
    from planner.model.catalog import load_model_catalog
    from planner.model.expert_loads import synthetic_profile
    from planner.placement.experts import eplb_baseline

    arch = load_model_catalog()[model_id]
    arch = getattr(arch, "arch", arch)
    experts = arch.moe.n_routed_experts
    per_rank = (experts + redundant_total) // ep - experts // ep  # SGLang's total copies as slots per rank
    return float(eplb_baseline(arch, synthetic_profile(arch), ep, per_rank).imbalance)


def placement_argv(row: dict) -> list[str]:
    """The estimate flags of a row's expert placement (none unless the row names one)."""
    if row.get("planner_expert_placement", "") != EPLB:
        return []
    imbalance = eplb_imbalance(row["planner_model"], int(row["planner_ep"]), int(row.get("planner_redundant_experts") or 0))
    return ["--expert-imbalance", f"{imbalance:.4f}", "--expert-routing", "balanced"]
