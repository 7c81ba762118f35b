"""`planner prices`: read a provider's public prices backwards through the roofline (claims 7, 8, 9).

1. A price step at a long context S* (e.g. +50% past 200K tokens) marks where KV fetch overtakes
   compute (claim 7): S* = 2 N_active BW / (F kv), so kv = 2 N_active / ((F / BW) S*).
2. Output tokens priced r times input tokens: a decode token occupies r times the accelerator time
   of a prefill token; prefill runs near the compute roofline, so decode runs near 1/r of it: it is
   memory-bound by about r (claim 8).
3. Cache prices: a cache hit at c of the input price p is a p / c discount; a retention option R is
   sound in a tier whose break-even retention (recompute cost / holding cost per token) exceeds R.
   The fastest such tier is the one the option implies (claim 9).

The hardware (F, BW, prices) and the model (N_active, KV bytes) are assumptions the output states.
"""

from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from planner.errors import (
    PlannerInputError,
    issues_from_validation_error,
    load_yaml_file,
    unknown_name_issue,
)
from planner.hardware.catalog import Accelerator, load_hardware_catalog
from planner.model.architecture import kv_bytes_per_request, param_counts
from planner.model.catalog import load_model_catalog
from planner.physics.kv_cache import break_even_retention_s, tiers_for
from planner.physics.roofline import matmul_flops
from planner.precision import FlopsFormat, Precision, bytes_per_value
from planner.schema import EdgeModel
from planner.units import (
    BILLION,
    SECONDS_PER_HOUR,
    SECONDS_PER_MINUTE,
    TB,
    TFLOP,
    TOKENS_PER_MILLION,
    format_duration,
)

__all__ = ["PriceReading", "PriceSheet", "load_price_sheet", "read_prices"]



class LongContextStep(EdgeModel):
    threshold_tokens: int = Field(ge=1, description="prompt length past which the higher prices apply")
    input_usd_per_million: float = Field(gt=0)
    output_usd_per_million: float | None = Field(default=None, gt=0)


class CacheWrite(EdgeModel):
    retention_minutes: float = Field(gt=0, description="how long the provider keeps the entry")
    usd_per_million: float = Field(gt=0, description="price of writing a cached input token with this retention")


class PriceSheet(EdgeModel):
    """A provider's public prices for one model, USD per million tokens."""

    provider: str = Field(description="who sells it, which model, when")
    source: str = Field(description="where the prices come from")
    input_usd_per_million: float = Field(gt=0)
    output_usd_per_million: float = Field(gt=0)
    cached_input_usd_per_million: float | None = Field(default=None, gt=0, description="price of a cache hit")
    long_context: LongContextStep | None = None
    cache_writes: list[CacheWrite] = Field(default_factory=list)


def load_price_sheet(path) -> PriceSheet:
    from pydantic import ValidationError

    try:
        return PriceSheet.model_validate(load_yaml_file(Path(path)))
    except ValidationError as exc:
        raise PlannerInputError(issues_from_validation_error(exc, model=PriceSheet), source=str(path)) from None


@dataclass(frozen=True)
class PriceReading:
    lines: tuple[str, ...]  # the working, step by step
    implied_kv_bytes_per_token: float | None
    memory_bound_factor: float
    hit_discount: float | None
    implied_tiers: tuple[tuple[float, str | None], ...]  # (retention s, tier id or None when recomputing is cheaper)


def _assumptions(model_id: str, accelerator_id: str, precision: str) -> tuple:
    models, hardware = load_model_catalog(), load_hardware_catalog()
    if model_id not in models:
        raise PlannerInputError(unknown_name_issue("--model", "model", model_id, models))
    if accelerator_id not in hardware.accelerators:
        raise PlannerInputError(unknown_name_issue("--accelerator", "accelerator", accelerator_id, hardware.accelerators))
    accel: Accelerator = hardware.accelerators[accelerator_id]
    fmt = FlopsFormat(precision)
    if fmt not in accel.dense_flops_per_s:
        raise PlannerInputError(unknown_name_issue("--precision", f"{accelerator_id} tensor-core format", precision, accel.dense_flops_per_s))
    return models[model_id], accel, fmt


def read_prices(sheet: PriceSheet, *, model_id: str = "deepseek-v3", accelerator_id: str = "gb200", precision: str = "bf16",
                active_params: float | None = None) -> PriceReading:
    """The architecture and memory tiers the prices imply, with the working."""
    arch, accel, fmt = _assumptions(model_id, accelerator_id, precision)
    n_active = active_params or param_counts(arch).active_matmul
    f_peak, bw_peak = accel.dense_flops_per_s[fmt], accel.hbm_bandwidth_bytes_per_s
    lines = [(f"assumed: {n_active / BILLION:.1f}B active parameters ({'given' if active_params else arch.id}); {accel.name} at "
             f"{f_peak / TFLOP:,.0f} TFLOP/s {fmt} and {bw_peak / TB:.2f} TB/s HBM, F/BW = {f_peak / bw_peak:.0f} FLOP/byte")]
    implied_kv = None
    if sheet.long_context is not None:
        lc = sheet.long_context
        s_star = lc.threshold_tokens
        implied_kv = 2 * n_active / ((f_peak / bw_peak) * s_star)
        rise = lc.input_usd_per_million / sheet.input_usd_per_million - 1
        actual = kv_bytes_per_request(arch, 1, bytes_per_value(Precision(precision)))
        lines += [
            (f"1. long context: input +{rise:.0%} past {s_star:,} tokens. If that is where KV fetch overtakes compute "
            f"(claim 7: S* = 2 N_active BW / (F kv)), then kv = 2 N_active / ((F/BW) S*) = 2 x {n_active:.3g} / "
            f"({f_peak / bw_peak:.0f} x {s_star:,}) = {implied_kv:,.0f} bytes per token"),
            (f"   for comparison, {arch.id} stores {actual:,.0f} bytes per token in {precision}; a crossover at {s_star:,} "
            f"tokens needs {implied_kv / actual:.2f}x that (KV shared across layers or heads, or fewer KV heads)"),
        ]
    ratio = sheet.output_usd_per_million / sheet.input_usd_per_million
    lines.append(f"2. output / input price = {sheet.output_usd_per_million:g} / {sheet.input_usd_per_million:g} = {ratio:.1f}x: a decode "
                 f"token occupies {ratio:.1f}x the accelerator time of a prefill token; prefill runs near the compute roofline, so "
                 f"decode runs near {1 / ratio:.0%} of peak FLOP/s: memory-bound by about {ratio:.1f}x (claim 8)")
    discount, implied = None, []
    if sheet.cached_input_usd_per_million is not None or sheet.cache_writes:
        kv = implied_kv or kv_bytes_per_request(arch, 1, bytes_per_value(Precision(precision)))
        flops_per_s = accel.achievable_flops_per_s(fmt)
        recompute = float(matmul_flops(n_active, 1)) / flops_per_s * accel.price_usd_per_hour / SECONDS_PER_HOUR
        tiers = sorted(tiers_for(accel), key=lambda t: -t.usd_per_byte_s)  # fastest (dearest) first
        lines.append(f"3. caching, at roofline cost: recomputing a token = 2 N_active / (F x {accel.compute_fraction_by_format[fmt]:.2f}) "
                     f"x ${accel.price_usd_per_hour:.2f}/h = ${recompute * TOKENS_PER_MILLION:.4f}/M; holding it = {kv:,.0f} bytes x tier "
                     "price; break-even retention per tier: "
                     + ", ".join(f"{t.name} {format_duration(break_even_retention_s(kv, t.usd_per_byte_s, recompute))}" for t in tiers))
        if sheet.cached_input_usd_per_million is not None:
            discount = sheet.input_usd_per_million / sheet.cached_input_usd_per_million
            lines.append(f"   a cache hit sells at {sheet.cached_input_usd_per_million:g} vs {sheet.input_usd_per_million:g}: "
                         f"{discount:.0f}x cheaper than a miss (claim 9: ~10x)")
        for write in sheet.cache_writes:
            retention = write.retention_minutes * SECONDS_PER_MINUTE
            tier = next((t for t in tiers if break_even_retention_s(kv, t.usd_per_byte_s, recompute) >= retention), None)
            implied.append((retention, None if tier is None else tier.id))
            premium = write.usd_per_million / sheet.input_usd_per_million - 1
            lines.append(f"   a {format_duration(retention)} cache write costs +{premium:.0%} of input; the fastest tier whose break-even "
                         f"exceeds {format_duration(retention)} is " + (tier.name if tier else "none: recomputing is cheaper"))
    return PriceReading(tuple(lines), implied_kv, ratio, discount, tuple(implied))
