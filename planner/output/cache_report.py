"""`planner cache`: the economics of prompt caching for each workload of a problem (claim 9).

For the workload's planned deployment (the prefill price of its layout) and each KV tier of that
accelerator: what holding one cached token costs per hour, the break-even retention beyond which
recomputing is cheaper, how long a reload of the prefix takes, and the discount a cache hit earns
against a miss at the workload's retention (or at 5 minutes and an hour when it declares none).
"""

from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from planner.model.architecture import kv_bytes_per_request
from planner.modes import ServingRole
from planner.physics.kv_cache import (
    KvTier,
    break_even_retention_s,
    hit_discount,
    reload_s,
    tiers_for,
)
from planner.solver.result import SolveResult
from planner.units import (
    SECONDS_PER_HOUR,
    SECONDS_PER_MINUTE,
    TOKENS_PER_MILLION,
    format_duration,
    format_seconds,
    format_usd,
)

__all__ = ["CacheEconomics", "TierEconomics", "cache_economics", "cache_record", "render_cache"]

DEFAULT_RETENTIONS_S = (5 * SECONDS_PER_MINUTE, SECONDS_PER_HOUR)  # the two cache-write durations providers sell


@dataclass(frozen=True)
class TierEconomics:
    tier: KvTier
    usd_per_million_tokens_per_hour: float  # holding a million cached tokens for an hour
    break_even_s: float
    reload_s: float  # the workload's prefix, on its deployment's accelerators
    discounts: tuple[float, ...]  # hit vs miss at each retention


@dataclass(frozen=True)
class CacheEconomics:
    workload: str
    model: str
    rack_id: str
    layout: str
    kv_bytes_per_token: float
    prefix_tokens: int
    recompute_usd_per_million_tokens: float  # prefill of a prompt token on the planned layout
    retentions_s: tuple[float, ...]
    tiers: tuple[TierEconomics, ...]

    def best_tier(self, retention_s: float) -> TierEconomics | None:
        """The cheapest tier to hold a prefix for `retention_s`, if holding beats recomputing."""
        keep = [t for t in self.tiers if t.break_even_s > retention_s]
        return min(keep, key=lambda t: t.tier.usd_per_byte_s) if keep else None


def cache_economics(result: SolveResult, workload: str) -> CacheEconomics:
    """Figures for `workload` of a solved problem (its first prefill-capable deployment)."""
    w = next(w for w in result.problem.workloads if w.name == workload)
    d = next(d for d in result.deployments if d.candidate.workload == workload and d.candidate.role is not ServingRole.DECODE)
    e, inp = d.estimate, d.estimate.inputs
    kv_per_token = kv_bytes_per_request(inp.arch, 1, inp.precisions.kv_bytes)
    prefix = w.prefix_cache.prefix_tokens if w.prefix_cache else w.input_tokens
    prefix_bytes = kv_bytes_per_request(inp.arch, prefix, inp.precisions.kv_bytes)
    recompute = e.usd_per_million_prefill_tokens / TOKENS_PER_MILLION
    retentions = (w.prefix_cache.retention_s,) if w.prefix_cache else DEFAULT_RETENTIONS_S
    tiers = []
    for tier in tiers_for(inp.rack.accelerator):
        tiers.append(TierEconomics(
            tier, kv_per_token * tier.usd_per_byte_s * SECONDS_PER_HOUR * TOKENS_PER_MILLION, break_even_retention_s(kv_per_token, tier.usd_per_byte_s, recompute),
            reload_s(prefix_bytes, inp.layout.n_accelerators, tier),
            tuple(hit_discount(recompute, kv_per_token, tier.usd_per_byte_s, r) for r in retentions)))
    return CacheEconomics(workload, inp.arch.id, inp.rack.id, inp.layout.describe(), kv_per_token, prefix, recompute * TOKENS_PER_MILLION, retentions,
                          tuple(tiers))


def render_cache(items: list[CacheEconomics], console: Console) -> None:
    for c in items:
        console.print(f"[bold]{escape(c.workload)}[/bold]: {c.model} on {c.rack_id} ({c.layout}); {c.kv_bytes_per_token:,.0f} B of KV "
                      f"per token; recomputing a prompt token costs {format_usd(c.recompute_usd_per_million_tokens)}/M (prefill alone)")
        table = Table(title_justify="left")
        for name in ("tier", "$/M tokens held 1 h", "break-even retention", f"reload {c.prefix_tokens:,} tokens",
                     *(f"hit discount at {format_duration(r)}" for r in c.retentions_s)):
            table.add_column(name, justify="left" if name == "tier" else "right")
        for t in c.tiers:
            table.add_row(t.tier.name, format_usd(t.usd_per_million_tokens_per_hour), format_duration(t.break_even_s), format_seconds(t.reload_s),
                          *(f"{x:,.1f}x" if x >= 1 else f"{x:.2f}x (recompute)" for x in t.discounts))
        console.print(table)
        for r in c.retentions_s:
            best = c.best_tier(r)
            if best is None:
                console.print(f"  kept {format_duration(r)}: recomputing beats every tier")
            else:
                console.print(f"  kept {format_duration(r)}: cheapest in {best.tier.name}; a hit costs "
                              f"{1 / best.discounts[c.retentions_s.index(r)]:.1%} of a miss (holding only; reload uses no accelerator time)")


def cache_record(items: list[CacheEconomics]) -> dict:
    return {"workloads": [{
        "workload": c.workload, "model": c.model, "rack": c.rack_id, "layout": c.layout, "kv_bytes_per_token": c.kv_bytes_per_token,
        "recompute_usd_per_million_tokens": c.recompute_usd_per_million_tokens, "retentions_s": list(c.retentions_s),
        "tiers": [{"tier": t.tier.id, "usd_per_million_tokens_per_hour": t.usd_per_million_tokens_per_hour, "break_even_s": t.break_even_s,
                   "reload_s": t.reload_s, "hit_discounts": list(t.discounts)} for t in c.tiers],
    } for c in items]}
