"""Candidate deployments: for a workload and a rack type, every valid parallel layout at the largest
batch its limits allow, evaluated with the roofline, then pruned to the non-dominated ones.

Step 1 enumerates layouts (power-of-two stage sizes that fit a scale-up domain unless spanning is
allowed, tensor-parallel degrees that divide the heads, expert-parallel degrees that divide the
experts, enough pipeline stages for the weights).
Step 2 evaluates each layout on a grid of batch sizes at once and refines the largest batch that
fits HBM and meets TPOT and TTFT; it records which limit stopped the batch growing.
Step 3 keeps, per rack type, the candidates no other candidate beats on every axis.
"""

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from planner.architecture import ModelArch, param_counts
from planner.deployment import Layout, Precisions, layout_issues
from planner.estimate import BatchTable, DeploymentInputs, evaluate_batches
from planner.hardware import Overheads, RackType
from planner.links import default_replica_links
from planner.problem import PrecisionSpec, ResolvedWorkload, resolve_precisions
from planner.roofline import OverlapPolicy

__all__ = ["Candidate", "CandidateSettings", "RackAnalysis", "analyse_rack", "enumerate_layouts", "pareto_prune"]

MAX_PIPELINE_STAGES = 16
EXTRA_PIPELINE_DOUBLINGS = 2  # also try 2x and 4x the fewest stages that hold the weights
GRID_STEPS = (1.0, 1.5)
REFINE_POINTS = 257  # batch sizes evaluated at once when refining between two grid points  # batch grid: multiples 1, 1.5, 2, 3, 4, 6, 8, ... of the batch granularity


@dataclass(frozen=True)
class CandidateSettings:
    overlap: OverlapPolicy = OverlapPolicy.SERIAL
    prefill_chunk_tokens: int = 8192
    max_batch_per_replica: int = 65536
    allow_spanning_domains: bool = False
    keep_batch_ladder: bool = False  # also keep smaller batches (for latency objectives and frontiers)
    redundant_experts_per_rank: int = 0


@dataclass(frozen=True)
class Candidate:
    """One way to serve a workload on a rack type: a layout at one batch size, with its figures."""

    workload: str
    model_key: str
    rack_id: str
    accelerator_id: str
    layout: Layout
    batch: int
    precisions: Precisions
    tpot_s: float
    ttft_s: float
    decode_tokens_per_s: float
    output_tokens_per_s: float  # sustained per replica, prefill included
    usd_per_hour: float  # per replica
    hbm_fill_fraction: float
    dominant_term: str
    batch_limit: str  # what stopped the batch growing: hbm, tpot, ttft or max_batch (or 'ladder')
    spans_domains: bool  # a tensor or expert group crosses scale-up domains (its traffic at scale-out speed)
    notes: tuple[str, ...] = ()

    @property
    def accelerators(self) -> int:
        return self.layout.n_accelerators

    @property
    def stage_size(self) -> int:
        return self.layout.stage_size

    @property
    def stages(self) -> int:
        return self.layout.pp

    @property
    def usd_per_million_output_tokens(self) -> float:
        return self.usd_per_hour / 3600.0 / self.output_tokens_per_s * 1e6

    @property
    def output_tokens_per_s_per_accelerator(self) -> float:
        return self.output_tokens_per_s / self.accelerators

    def sort_key(self) -> tuple:
        """Canonical order used to break ties deterministically."""
        return (self.rack_id, self.accelerators, self.layout.pp, -self.layout.tp, self.layout.ep, self.batch)

    def describe(self) -> str:
        return f"{self.rack_id} {self.layout.describe()}, batch {self.batch}"


@dataclass
class RackAnalysis:
    """What the enumeration found for one workload on one rack type, including why layouts failed."""

    workload: str
    rack_id: str
    candidates: list[Candidate] = field(default_factory=list)
    layouts_tried: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # reason -> count of layouts
    min_hbm_need_bytes: float = math.inf  # smallest HBM need of any layout at its smallest batch
    hbm_capacity_bytes: float = 0.0
    min_tpot_s: float = math.inf  # best TPOT of any layout that fits HBM
    min_ttft_s: float = math.inf
    max_stage_size: int = 0

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


def _powers_of_two(limit: int) -> list[int]:
    return [2**k for k in range(int(math.log2(limit)) + 1)] if limit >= 1 else []


def _weights_fit(arch: ModelArch, layout: Layout, precisions: Precisions, capacity: float, reserve: float) -> bool:
    """Cheap screen before any graph work: even-split weights plus the runtime reserve fit HBM."""
    counts = param_counts(arch)
    routed = counts.layers_routed_total
    dense = counts.total - routed
    per_accelerator = (dense * precisions.weight_bytes / layout.tp + routed * precisions.expert_weight_bytes / layout.stage_size) / layout.pp
    return per_accelerator + reserve <= capacity


def enumerate_layouts(arch: ModelArch, rack: RackType, precisions: Precisions, overheads: Overheads,
                      max_stage_size: int, max_accelerators: int | None) -> Iterable[Layout]:
    """Valid layouts with power-of-two stage sizes up to `max_stage_size`."""
    capacity = rack.accelerator.hbm_capacity_bytes
    reserve = overheads.runtime_reserved_bytes
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
                fewest = next((p for p in _powers_of_two(MAX_PIPELINE_STAGES) if _weights_fit(arch, Layout(tp, ep, p, dp_attn), precisions, capacity, reserve)), None)
                if fewest is None:
                    yield base  # reported as an HBM rejection
                    continue
                for k in range(EXTRA_PIPELINE_DOUBLINGS + 1):
                    pp = fewest * 2**k
                    if pp > min(MAX_PIPELINE_STAGES, arch.n_layers):
                        break
                    if max_accelerators is not None and stage * pp > max_accelerators:
                        break
                    yield Layout(tp=tp, ep=ep, pp=pp, dp_attn=dp_attn)


def _batch_grid(granularity: int, max_batch: int) -> np.ndarray:
    multiples = sorted({round(step * 2**k) for k in range(40) for step in GRID_STEPS if step * 2**k * granularity <= max_batch})
    return np.array([m * granularity for m in multiples], dtype=float)


def _feasible(table: BatchTable, workload: ResolvedWorkload) -> np.ndarray:
    ok = table.fits.copy()
    if workload.tpot_limit_s is not None:
        ok &= table.tpot_s <= workload.tpot_limit_s
    if workload.ttft_limit_s is not None:
        ok &= table.ttft_s <= workload.ttft_limit_s
    return ok


def _limit_reason(table: BatchTable, workload: ResolvedWorkload, index: int) -> str:
    """Which constraint the batch after `index` violates (the one that stopped the batch growing)."""
    if not table.fits[index]:
        return "hbm"
    if workload.tpot_limit_s is not None and table.tpot_s[index] > workload.tpot_limit_s:
        return "tpot"
    if workload.ttft_limit_s is not None and table.ttft_s[index] > workload.ttft_limit_s:
        return "ttft"
    return "max_batch"


def _largest_feasible_batch(inp: DeploymentInputs, workload: ResolvedWorkload, table: BatchTable,
                            max_batch: int) -> tuple[BatchTable, int, str] | None:
    """From the layout's table on its batch grid: the largest feasible batch after an exact
    refinement between grid points, and the reason the next batch fails."""
    q = inp.layout.pp * inp.layout.dp_attn
    grid = table.batches
    ok = _feasible(table, workload)
    if not ok[0]:
        return None
    last = int(np.flatnonzero(ok)[-1])
    if last == len(grid) - 1:
        return table, last, "max_batch"
    lo, hi = int(grid[last]) // q, int(grid[last + 1]) // q  # multiples of q: lo feasible, hi not
    reason = _limit_reason(table, workload, last + 1)
    while hi - lo > 1:
        probe = np.unique(np.linspace(lo, hi, num=min(hi - lo + 1, REFINE_POINTS)).round().astype(int))
        fine = evaluate_batches(inp, probe * q)
        best = int(np.flatnonzero(_feasible(fine, workload))[-1])
        lo, hi = int(probe[best]), int(probe[best + 1])
        table, last, reason = fine, best, _limit_reason(fine, workload, best + 1)
    return table, last, reason


def _candidate(inp: DeploymentInputs, workload: ResolvedWorkload, table: BatchTable, i: int, reason: str,
               spans: bool, notes: tuple[str, ...]) -> Candidate:
    step = dict(zip(("compute", "weights", "kv", "comm"), (float(term[i]) for term in table.serving_step), strict=True))
    return Candidate(
        workload=workload.name,
        model_key=workload.model_key,
        rack_id=inp.rack.id,
        accelerator_id=inp.rack.accelerator.id,
        layout=inp.layout,
        batch=int(table.batches[i]),
        precisions=inp.precisions,
        tpot_s=float(table.tpot_s[i]),
        ttft_s=float(table.ttft_s[i]),
        decode_tokens_per_s=float(table.decode_tokens_per_s[i]),
        output_tokens_per_s=float(table.sustained_output_tokens_per_s[i]),
        usd_per_hour=inp.rack.accelerator.price_usd_per_hour * inp.layout.n_accelerators,
        hbm_fill_fraction=float(table.used_bytes[i] / table.capacity_bytes),
        dominant_term=max(step, key=step.__getitem__),
        batch_limit=reason,
        spans_domains=spans,
        notes=notes,
    )


def analyse_rack(arch: ModelArch, precision_spec: PrecisionSpec, rack: RackType, workload: ResolvedWorkload,
                 overheads: Overheads, settings: CandidateSettings, max_accelerators: int | None,
                 expert_imbalance: Callable[[int], float] = lambda ep: 1.0) -> RackAnalysis:
    """All candidates for `workload` on `rack`, and the reasons other layouts were rejected.
    `expert_imbalance(ep)` is the hottest rank's expert load over the mean for `ep` ranks."""
    precisions, notes = resolve_precisions(precision_spec, arch, rack.accelerator)
    analysis = RackAnalysis(workload.name, rack.id, hbm_capacity_bytes=rack.accelerator.hbm_capacity_bytes)
    max_stage = rack.n_accelerators if not settings.allow_spanning_domains else max(rack.n_accelerators, max_accelerators or 1024)
    analysis.max_stage_size = max_stage
    for layout in enumerate_layouts(arch, rack, precisions, overheads, max_stage, max_accelerators):
        analysis.layouts_tried += 1
        if layout_issues(arch, layout, layout.pp * layout.dp_attn):
            analysis.reject("invalid")
            continue
        spread = arch.is_moe and layout.ep > 1
        inp = DeploymentInputs(arch, rack, layout, layout.pp * layout.dp_attn, workload.input_tokens, workload.output_tokens,
                               precisions, overheads, settings.overlap, settings.prefill_chunk_tokens, notes,
                               expert_imbalance(layout.ep) if spread else 1.0,
                               settings.redundant_experts_per_rank if spread else 0)
        grid = evaluate_batches(inp, _batch_grid(layout.pp * layout.dp_attn, settings.max_batch_per_replica))
        analysis.min_hbm_need_bytes = min(analysis.min_hbm_need_bytes, float(grid.used_bytes[0]))
        if not grid.fits[0]:
            analysis.reject("hbm")
            continue
        analysis.min_tpot_s = min(analysis.min_tpot_s, float(grid.tpot_s[0]))
        analysis.min_ttft_s = min(analysis.min_ttft_s, float(grid.ttft_s[0]))
        found = _largest_feasible_batch(inp, workload, grid, settings.max_batch_per_replica)
        if found is None:
            analysis.reject(_limit_reason(grid, workload, 0))
            continue
        table, best, reason = found
        links = default_replica_links(rack, layout, overheads.collective_latency_s)
        spans = links.tp.spans_domains or links.stage.spans_domains  # pipeline stages may sit in different racks
        analysis.candidates.append(_candidate(inp, workload, table, best, reason, spans, notes))
        if settings.keep_batch_ladder:
            ladder = evaluate_batches(inp, _batch_grid(layout.pp * layout.dp_attn, int(table.batches[best])))
            for i in np.flatnonzero(_feasible(ladder, workload)):
                analysis.candidates.append(_candidate(inp, workload, ladder, int(i), "ladder", spans, notes))
    return analysis


def pareto_prune(candidates: list[Candidate], use_latency: bool = False) -> list[Candidate]:
    """Drop every candidate another one beats: no more accelerators, at least the throughput (and,
    with `use_latency`, no worse TPOT), strictly better somewhere. Ties keep the canonical first."""
    ordered = sorted(candidates, key=lambda c: (c.accelerators, -c.output_tokens_per_s, c.tpot_s, c.sort_key()))
    kept: list[Candidate] = []
    for c in ordered:
        dominated = any(
            k.accelerators <= c.accelerators and k.output_tokens_per_s >= c.output_tokens_per_s
            and (not use_latency or k.tpot_s <= c.tpot_s)
            for k in kept
        )
        if not dominated:
            kept.append(c)
    return kept
