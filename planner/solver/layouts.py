"""Parallel layouts of a model on a rack type: power-of-two stage sizes that fit a scale-up domain
(unless spanning is allowed), TP degrees that divide the heads, EP degrees that divide the experts,
and enough pipeline stages for the weights."""

import math
from collections.abc import Iterable

from planner.hardware.catalog import Overheads, RackType
from planner.model.architecture import ModelArch, ParamCounts, param_counts
from planner.physics.deployment import Layout, Precisions

__all__ = ["enumerate_layouts"]

MAX_PIPELINE_STAGES = 16
EXTRA_PIPELINE_DOUBLINGS = 2  # also try 2x and 4x the fewest stages that hold the weights


def _powers_of_two(limit: int) -> list[int]:
    return [2**k for k in range(int(math.log2(limit)) + 1)] if limit >= 1 else []


def _weights_fit(counts: ParamCounts, layout: Layout, precisions: Precisions, capacity: float, reserve: float) -> bool:
    """Cheap screen before any graph work: even-split weights plus the runtime reserve fit HBM."""
    routed = counts.layers_routed_total
    dense = counts.total - routed
    per_accelerator = (dense * precisions.weight_bytes / layout.tp + routed * precisions.expert_weight_bytes / layout.stage_size) / layout.pp
    return per_accelerator + reserve <= capacity


def enumerate_layouts(arch: ModelArch, rack: RackType, precisions: Precisions, overheads: Overheads,
                      max_stage_size: int, max_accelerators: int | None) -> Iterable[Layout]:
    """Valid layouts with power-of-two stage sizes up to `max_stage_size`."""
    capacity = rack.accelerator.hbm_capacity_bytes
    reserve = overheads.runtime_reserved_bytes
    counts = param_counts(arch)
    for stage in _powers_of_two(max_stage_size):
        for tp in _powers_of_two(stage):
            dp_attn = stage // tp
            if not arch.is_moe and dp_attn > 1:
                continue
            ep_options = {1}
            if arch.is_moe:
                ep_options = {e for e in (1, dp_attn, stage) if arch.moe.n_routed_experts % e == 0}
            for ep in sorted(ep_options):
                base = Layout(tp=tp, ep=ep, pp=1, dp_attn=dp_attn)
                fewest = next((p for p in _powers_of_two(MAX_PIPELINE_STAGES) if _weights_fit(counts, Layout(tp, ep, p, dp_attn), precisions, capacity, reserve)), None)
                if fewest is None:
                    yield base  # reported as an HBM rejection
                    continue
                for k in range(EXTRA_PIPELINE_DOUBLINGS + 1):
                    pp = fewest * 2**k
                    if pp > min(MAX_PIPELINE_STAGES, arch.n_layers):
                        break
                    if pp > 1 and stage * pp <= max_stage_size:
                        break  # engines split a model into pipeline stages only past one scale-up domain; inside it they widen TP/EP
                    if max_accelerators is not None and stage * pp > max_accelerators:
                        break
                    yield Layout(tp=tp, ep=ep, pp=pp, dp_attn=dp_attn)
