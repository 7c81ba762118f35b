"""Candidate deployments: for a workload and a rack type, every valid parallel layout at the largest
batch its limits allow, evaluated with the roofline, then pruned to the non-dominated ones.

Step 1 enumerates layouts (power-of-two stage sizes that fit a scale-up domain unless spanning is allowed,
TP degrees that divide the heads, EP degrees that divide the experts, enough pipeline stages for the weights).
Step 2 evaluates each layout on a grid of batch sizes at once and refines the largest batch that fits
HBM and meets TPOT and TTFT, noting what stopped it (batch_search); workloads that differ only in their
limits are analysed together and share these tables (shared_tables).
Step 3 keeps, per rack type, the candidates no other candidate beats on every axis.
"""

import functools
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from planner.hardware.catalog import Overheads, RackType
from planner.model.architecture import (
    ModelArch,
    kv_bytes_per_sequence,
)
from planner.modes import (
    BatchLimit,
    Confidence,
    ServingRole,
    StepTerm,
)
from planner.physics.estimate import BatchTable, DeploymentInputs
from planner.physics.inputs import (
    ExpertFigures,
    ServingOptions,
    deployment_inputs,
    deployment_issues,
)
from planner.physics.kv_cache import CacheUse, tiers_for
from planner.physics.links import default_replica_links
from planner.physics.prefill import packed_prompts
from planner.placement.groups import ranks_per_domain
from planner.problem.resolve import ResolvedWorkload, resolve_precisions
from planner.problem.schema import PrecisionSpec
from planner.solver.batch_search import (
    Limits,
    Reach,
    Request,
    batch_grid,
    every_batch,
    feasible,
    feasible_chain,
    first_batches,
    limit_reason,
    limits_for,
)
from planner.solver.candidate import (
    Candidate,
    handoff_s,
    pair_ttft_p90_s,
    pair_ttft_s,
    served_tokens_per_s,
)
from planner.solver.layouts import enumerate_layouts
from planner.solver.shared_tables import run_together
from planner.units import SECONDS_PER_HOUR

__all__ = ["Candidate", "CandidateSettings", "Chain", "RackAnalysis", "analyse_rack", "enumerate_layouts", "handoff_s", "pair_ttft_p90_s",
           "pair_ttft_s", "replica_usd_per_hour", "served_tokens_per_s"]

@dataclass(frozen=True)
class CandidateSettings:
    serving: ServingOptions = field(default_factory=ServingOptions)
    max_batch_per_replica: int = 65536
    allow_spanning_domains: bool = False
    keep_batch_ladder: bool = False  # also keep smaller batches (for latency objectives and frontiers)
    redundant_experts_per_rank: int = 0
    confidence: Confidence = Confidence.MEDIAN
    every_batch: bool = False  # a candidate at every feasible batch, with no grid (the exhaustive reference)


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
    min_ttft_s: float = math.inf  # the lowest 90th-percentile TTFT of any layout that fits HBM
    max_stage_size: int = 0
    chains: list["Chain"] = field(default_factory=list)  # decode layouts' feasible batches (pair_batches picks among them)

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


@dataclass
class Chain:
    """A layout's feasible batches in one role: its table at every multiple of its batch granularity
    up to the largest feasible batch, and what a candidate at one of them needs."""

    inp: DeploymentInputs
    workload: ResolvedWorkload
    table: BatchTable
    members: np.ndarray  # indices (into the table) of the batches that meet every limit
    reason: str  # what stops the largest of them growing
    spans: bool
    handoff: tuple[float, float]

    def candidate(self, i: int, limit: str) -> Candidate:
        return _candidate(self.inp, self.workload, self.table, i, limit, self.spans, self.handoff)

    def best_reason(self) -> str:
        """What stops the fastest feasible batch: what stops the largest, or, below it, the peak."""
        return self.reason if self.best() == int(self.members[-1]) else BatchLimit.PEAK

    def ladder(self) -> list[int]:
        """Table indices of the feasible batches on the batch grid up to the fastest, and the fastest."""
        q = self.inp.layout.pp * self.inp.layout.dp_attn
        best = self.best()
        on_grid = set(batch_grid(q, int(self.table.batches[best])).astype(int))
        return sorted({int(i) for i in self.members if int(self.table.batches[i]) in on_grid and i <= best} | {best})

    @functools.cached_property
    def rates(self) -> np.ndarray:
        """Output tokens per second at every batch of the table (asked for many times by pair_batches)."""
        return self.table.sustained_output_tokens_per_s

    def best(self, among: np.ndarray | None = None) -> int:
        """The feasible batch (of `among`, table indices) with the most output tokens per second; of
        equal rates the smallest. None of `among`: all feasible batches."""
        among = self.members if among is None else among
        rates = self.rates[among]
        return int(among[np.flatnonzero(rates == rates.max())[0]])


def replica_usd_per_hour(inp: DeploymentInputs, table: BatchTable, i: int) -> float:
    """One replica's price per hour at the table's batch i: its accelerators and the prompt cache it holds outside HBM."""
    return inp.rack.accelerator.price_usd_per_hour * inp.layout.n_accelerators + float(table.storage_usd_per_s[i]) * SECONDS_PER_HOUR


def _candidate(inp: DeploymentInputs, workload: ResolvedWorkload, table: BatchTable, i: int, reason: str,
               spans: bool, handoff: tuple[float, float] = (0.0, 0.0)) -> Candidate:
    step = dict(zip(("compute", "weights", "kv", "comm", "overhead"), (float(term[i]) for term in table.serving_step), strict=True))
    if inp.role is ServingRole.PREFILL:  # cost and demand are counted in the output tokens its prompts feed
        output_rate = float(table.sustained_input_tokens_per_s[i]) * workload.output_tokens / inp.prefilled_tokens
    else:
        output_rate = float(table.sustained_output_tokens_per_s[i])
    return Candidate(
        workload=workload.name,
        model_key=workload.model_key,
        inputs=replace(inp, batch_per_replica=int(table.batches[i])),
        tpot_s=0.0 if inp.role is ServingRole.PREFILL else float(table.tpot_s[i]),
        ttft_s=float(table.ttft_s[i]),
        ttft_p90_s=float(table.ttft_p90_s[i]),
        decode_tokens_per_s=float(table.decode_tokens_per_s[i]),
        output_tokens_per_s=output_rate,
        usd_per_hour=replica_usd_per_hour(inp, table, i),
        hbm_fill_fraction=float(table.used_bytes[i] / table.memory.capacity_bytes),
        dominant_term=StepTerm(max(step, key=step.__getitem__)),
        batch_limit=reason,
        spans_domains=spans,
        storage_usd_per_hour=float(table.storage_usd_per_s[i]) * SECONDS_PER_HOUR,
        input_tokens_per_s=float(table.sustained_input_tokens_per_s[i]),
        kv_handoff_bytes=handoff[0],
        nic_bytes_per_s=handoff[1],
    )


def analyse_rack(arch: ModelArch, precision_spec: PrecisionSpec, rack: RackType, workloads: Sequence[ResolvedWorkload],
                 overheads: Overheads, settings: CandidateSettings, max_accelerators: int | None,
                 expert_load: Callable[[int, int], tuple[float, bool]] = lambda ep, ranks_per_domain: (1.0, True),
                 expert_routing: str | None = None) -> list[RackAnalysis]:
    """For each of `workloads` (of one model and lengths, differing in their limits), all candidates
    on `rack` in each serving role the workload allows, and the reasons other layouts were rejected;
    their batch tables are evaluated together. `expert_load(ep, ranks_per_domain)` is the hottest
    rank's expert load over the mean for `ep` ranks, that many of them in each scale-up domain, and
    whether that placement keeps the expert groups in their domains (as the final placement will);
    `expert_routing` the skew of the expert kernels (None: the model's)."""
    precisions, notes = resolve_precisions(precision_spec, arch, rack.accelerator)
    max_stage = rack.n_accelerators if not settings.allow_spanning_domains else max(rack.n_accelerators, max_accelerators or 1024)
    analyses = [RackAnalysis(w.name, rack.id, hbm_capacity_bytes=rack.accelerator.hbm_capacity_bytes, max_stage_size=max_stage)
                for w in workloads]
    accel = rack.accelerator
    # kernel times layouts share: those of a MoE model that differ only in expert parallelism, mostly (a dense model's share none)
    reuse: dict | None = {} if arch.is_moe else None
    reach = Reach()  # how far its layouts' first tables go
    for layout in enumerate_layouts(arch, rack, precisions, overheads, max_stage, max_accelerators):
        for analysis in analyses:
            analysis.layouts_tried += 1
        if deployment_issues(arch, layout, layout.pp * layout.dp_attn, precisions):
            for analysis in analyses:
                analysis.reject("invalid")
            continue
        spread = arch.is_moe and layout.ep > 1
        per_domain = ranks_per_domain(rack.n_accelerators, layout.ep, layout.stage_size)
        imbalance, groups_local = expert_load(layout.ep, per_domain) if spread else (1.0, True)
        experts = ExpertFigures(imbalance, settings.redundant_experts_per_rank, routing=expert_routing, groups_local=groups_local)
        links = default_replica_links(rack, layout, overheads.collective_latency_s)
        spans = links.tp.spans_domains or links.stage.spans_domains  # pipeline stages may sit in different racks
        searches = []
        for workload, analysis in zip(workloads, analyses, strict=True):
            base = deployment_inputs(arch, rack, layout, layout.pp * layout.dp_attn, (workload.input_tokens, workload.output_tokens),
                                     precisions, overheads, settings.serving, notes=notes, experts=experts)
            handoff = (float(kv_bytes_per_sequence(arch, base.prefilled_tokens, precisions.kv_bytes).sum()),
                       layout.n_accelerators * accel.achievable_scale_out_bytes_per_s)
            searches.append(_layout_candidates(base, workload, settings, spans, handoff, analysis, reach))
        run_together(searches, reuse)
    if reuse is not None:  # what a table evaluates later (its full prefill pass, on first use) need not keep all this alive
        reuse.clear()
    return analyses


def _layout_candidates(base: DeploymentInputs, workload: ResolvedWorkload, settings: CandidateSettings, spans: bool,
                       handoff: tuple[float, float], analysis: RackAnalysis, reach: Reach) -> Generator[Request, BatchTable, None]:
    """One layout's candidates for `workload` in each role it allows, each number of draft tokens it
    allows (speculative decoding) and each place for its prompt cache (which is cheapest depends on
    the fleet: holding a prefix costs its tier's price, recomputing it prefill time), into `analysis`."""
    reasons, found = [], False
    for role in workload.roles:
        for spec in [None] if workload.speculative is None else workload.speculative.for_role(role):
            inp = replace(base, role=role, speculative=spec)
            for option in _cache_options(inp, workload):
                result = yield from _role_candidates(inp if inp.prefix_cache is option else replace(inp, prefix_cache=option), workload,
                                                     settings, spans, handoff, analysis, reach)
                if isinstance(result, str):
                    reasons.append(result)
                else:
                    analysis.candidates.extend(result)
                    found = True
    if not found:
        analysis.reject(reasons[0] if reasons else "hbm")


def _cache_options(inp: DeploymentInputs, workload: ResolvedWorkload) -> list[CacheUse | None]:
    """No prompt cache, or the workload's cache in each tier it allows on this accelerator."""
    request = workload.prefix_cache
    if request is None or inp.role is ServingRole.DECODE:
        return [None]
    tiers = [t for t in tiers_for(inp.rack.accelerator) if request.allows(t.id)]
    options = [CacheUse(request.hit_rate, request.prefix_tokens, request.retention_s, t) for t in tiers]
    return ([None] if request.any_tier else []) + options


def _role_candidates(inp: DeploymentInputs, workload: ResolvedWorkload, settings: CandidateSettings, spans: bool,
                     handoff: tuple[float, float], analysis: RackAnalysis, reach: Reach) -> Generator[Request, BatchTable, list[Candidate] | str]:
    """The layout's candidates in one role, or the reason it has none: its largest feasible batch;
    for a latency objective every feasible batch; for a decode role also its chain of feasible
    batches, from which prepare() adds the smaller batches its prefill partners need (pair_batches)."""
    layout = inp.layout
    limits = limits_for(workload, inp.role, handoff[1], handoff[0], settings.confidence is Confidence.HIGH)
    if inp.role is ServingRole.PREFILL:  # prompts per pass: from one per attention rank and micro-batch to what the budget holds
        return (yield from _prefill_candidates(inp, workload, limits, spans, handoff, analysis))
    if layout.pp * layout.dp_attn > settings.max_batch_per_replica:  # one sequence per stage and attention rank at the least
        return BatchLimit.MAX_BATCH
    if settings.every_batch:
        table = yield from every_batch(inp, settings.max_batch_per_replica)
        ok = np.flatnonzero(feasible(table, limits))
        return [_candidate(inp, workload, table, int(i), BatchLimit.LADDER, spans, handoff) for i in ok] if len(ok) else "limits"
    q = layout.pp * layout.dp_attn
    batches, grid_index, head = first_batches(q, settings.max_batch_per_replica, reach.head(q, settings.max_batch_per_replica))
    first = yield inp, batches  # row 0: the smallest batch
    analysis.min_hbm_need_bytes = min(analysis.min_hbm_need_bytes, float(first.used_bytes[0]))
    if not first.fits[0]:
        return "hbm"
    analysis.min_tpot_s = min(analysis.min_tpot_s, float(first.tpot_s[0]))
    analysis.min_ttft_s = min(analysis.min_ttft_s, float(first.ttft_p90_s[0]))
    found = yield from feasible_chain(inp, limits, first, grid_index, head)  # every feasible batch: the fastest is not always the largest
    if found is None:
        return limit_reason(first, limits, 0)
    table, members, reason, top = found
    reach.saw(q, top)
    kept = inp.role is ServingRole.DECODE or settings.keep_batch_ladder  # a kept chain's table is its `top` rows
    chain = Chain(inp, workload, table.rows(slice(0, top)) if kept and top < len(table.batches) else table, members, reason, spans, handoff)
    if kept:  # workload_candidates picks its batches: once its prefill partners are known (decode), and for a
        analysis.chains.append(chain)  # latency objective, which trades TPOT against throughput
    return [chain.candidate(chain.best(), chain.best_reason())]


def _prefill_candidates(inp: DeploymentInputs, workload: ResolvedWorkload, limits: Limits, spans: bool,
                        handoff: tuple[float, float], analysis: RackAnalysis) -> Generator[Request, BatchTable, list[Candidate] | str]:
    """A prefill layout's candidates: its batch is the prompts one pass holds, so a larger batch
    prefills more per second and makes each prompt wait longer. Every batch within the TTFT limit and
    HBM (a pass holds at most what the token budget packs, so they are few): a prefill-decode pair's
    TTFT adds the KV hand-off and the decode join, so a faster, dearer prefill pass can be the only
    one that pairs, and without a demand a slower one may need fewer replicas to feed a decode one."""
    layout = inp.layout
    unit = layout.pp * layout.dp_attn
    table = yield inp, np.arange(1, max(packed_prompts(inp.input_tokens, inp.prefill_chunk_tokens), 1) + 1) * float(unit)
    analysis.min_hbm_need_bytes = min(analysis.min_hbm_need_bytes, float(table.used_bytes[0]))
    if not table.fits[0]:
        return "hbm"
    analysis.min_ttft_s = min(analysis.min_ttft_s, float(table.ttft_p90_s[0]))
    ok = feasible(table, limits)
    if not ok[0]:
        return limit_reason(table, limits, 0)
    last = int(np.flatnonzero(ok)[-1])
    reason = BatchLimit.PREFILL if last == len(table.batches) - 1 else limit_reason(table, limits, last)
    return [_candidate(inp, workload, table, i, reason if i == last else BatchLimit.LADDER, spans, handoff)
            for i in np.flatnonzero(ok)]
