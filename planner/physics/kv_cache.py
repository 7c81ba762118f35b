"""Prompt caching: where a cached prefix's KV cache waits for its next request, what holding it
costs, and when holding it beats recomputing it (docs/physics.md claim 9).

Tiers (topologies/kv_tiers.yaml): the serving accelerators' spare HBM, host DRAM, local flash,
remote storage. Each has a capacity and a read bandwidth per accelerator and a cost per byte-second.
Holding `b` bytes for `t` seconds costs b * t * cost; recomputing the prefix costs its prefill.
The break-even retention is recompute cost / (bytes * cost per byte-second): above it, dropping the
cache and recomputing is cheaper. A hit is cheaper than a miss by recompute / (holding + reload).
"""

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from planner.errors import (
    PlannerInputError,
    issues_from_validation_error,
    load_yaml_file,
)
from planner.hardware.catalog import Accelerator, check_source_keys
from planner.paths import data_dir
from planner.schema import CatalogId, EdgeModel
from planner.units import GB, HOURS_PER_MONTH, SECONDS_PER_HOUR

__all__ = [
    "CacheUse",
    "KvTier",
    "break_even_retention_s",
    "cache_use",
    "cached_bytes",
    "hit_discount",
    "load_tier_specs",
    "reload_s",
    "tiers_for",
]



class TierSpec(EdgeModel):
    """One KV-cache tier as written in topologies/kv_tiers.yaml: each quantity either from the
    accelerator's catalog figures or a number with a source."""

    id: CatalogId
    name: str
    capacity: Literal["hbm_free", "host_memory", "unlimited"] | None = None
    capacity_gb_per_accelerator: float | None = Field(default=None, gt=0)
    read_bandwidth: Literal["hbm", "host_link", "scale_out"] | None = None
    read_gb_per_s_per_accelerator: float | None = Field(default=None, gt=0)
    read_fraction: float | None = Field(default=None, gt=0, le=1)  # of the link named by read_bandwidth, when measured
    first_byte_latency_ms: float = Field(default=0.0, ge=0)  # paid once per reload, before the bytes flow
    cost: Literal["accelerator_rental"] | None = None
    usd_per_gb_month: float | None = Field(default=None, gt=0)
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_of_each(self) -> "TierSpec":
        for a, b in (("capacity", "capacity_gb_per_accelerator"), ("read_bandwidth", "read_gb_per_s_per_accelerator"),
                     ("cost", "usd_per_gb_month")):
            if (getattr(self, a) is None) == (getattr(self, b) is None):
                raise ValueError(f"give exactly one of {a} and {b}\n    fix: keep one")
        if self.read_fraction is not None and self.read_bandwidth is None:
            raise ValueError("read_fraction is a fraction of a named link\n    fix: give read_bandwidth, or fold it into read_gb_per_s_per_accelerator")
        missing = [n for n in ("capacity_gb_per_accelerator", "read_gb_per_s_per_accelerator", "read_fraction", "usd_per_gb_month")
                   if getattr(self, n) is not None and n not in self.sources]
        if self.first_byte_latency_ms > 0 and "first_byte_latency_ms" not in self.sources:
            missing.append("first_byte_latency_ms")
        if missing:
            raise ValueError(f"numbers without a source: {', '.join(missing)}\n    fix: add sources with keys from topologies/sources.yaml")
        return self


class _TierFile(EdgeModel):
    tiers: list[TierSpec]


@functools.cache
def load_tier_specs(directory: Path | None = None) -> tuple[TierSpec, ...]:
    """The tiers of `directory`/kv_tiers.yaml (default: the built-in topologies/), every number cited."""
    path = (directory or data_dir("topologies")) / "kv_tiers.yaml"
    try:
        tiers = tuple(_TierFile.model_validate(load_yaml_file(path)).tiers)
    except ValidationError as exc:
        raise PlannerInputError(issues_from_validation_error(exc, model=_TierFile), source=str(path)) from None
    check_source_keys(tiers, load_yaml_file(path.parent / "sources.yaml")["sources"], path)
    return tiers


@dataclass(frozen=True)
class KvTier:
    """A tier as one accelerator type sees it, SI units. `in_hbm`: the cache shares HBM with the
    batch (its capacity is whatever the batch leaves free, and it needs no reload)."""

    id: str
    name: str
    capacity_bytes_per_accelerator: float  # inf when unlimited; HBM tier: the accelerator's HBM
    read_bytes_per_s_per_accelerator: float
    usd_per_byte_s: float
    in_hbm: bool
    first_byte_latency_s: float = 0.0


def tiers_for(accel: Accelerator) -> tuple[KvTier, ...]:
    """The tiers an accelerator type can use (host DRAM only where the catalog knows its host memory
    and host link)."""
    out = []
    for spec in load_tier_specs():
        capacity = {"hbm_free": accel.hbm_capacity_bytes, "host_memory": accel.host_memory_bytes, "unlimited": math.inf}.get(
            spec.capacity or "", None if spec.capacity_gb_per_accelerator is None else spec.capacity_gb_per_accelerator * GB)
        # a link named by the tier runs at the tier's measured fraction, else at the accelerator's own
        links = {"hbm": (accel.hbm_bandwidth_bytes_per_s, accel.hbm_bandwidth_fraction), "host_link": (accel.host_link_bytes_per_s, 1.0),
                 "scale_out": (accel.scale_out_bandwidth_bytes_per_s, accel.scale_out_bandwidth_fraction)}
        if spec.read_bandwidth is not None:
            peak, fraction = links[spec.read_bandwidth]
            bandwidth = None if peak is None else peak * (spec.read_fraction or fraction)
        else:
            bandwidth = spec.read_gb_per_s_per_accelerator * GB
        if capacity is None or bandwidth is None:
            continue
        if spec.cost == "accelerator_rental":
            cost = accel.price_usd_per_hour / SECONDS_PER_HOUR / accel.hbm_capacity_bytes
        else:
            cost = spec.usd_per_gb_month / GB / (HOURS_PER_MONTH * SECONDS_PER_HOUR)
        out.append(KvTier(spec.id, spec.name, capacity, bandwidth, cost, spec.capacity == "hbm_free", spec.first_byte_latency_ms / 1e3))
    return tuple(out)


@dataclass(frozen=True)
class CacheUse:
    """A workload's prompt cache on one replica: `hit_rate` of requests find their first
    `prefix_tokens` cached; an entry lives `retention_s` after its last use in `tier`."""

    hit_rate: float
    prefix_tokens: int
    retention_s: float
    tier: KvTier


def cached_bytes(requests_per_s, hit_rate: float, retention_s: float, prefix_bytes: float):
    """Bytes a replica holds in its cache (Little's law): misses write new entries at
    (1 - hit_rate) x requests/s, each kept `retention_s` (hits refresh entries already held)."""
    return requests_per_s * (1.0 - hit_rate) * retention_s * prefix_bytes


def reload_s(prefix_bytes: float, n_accelerators: int, tier: KvTier) -> float:
    """Time to read a cached prefix back into HBM: the tier's first-byte latency, then the bytes spread
    over the replica's accelerators (zero when it never left HBM)."""
    if tier.in_hbm:
        return 0.0
    return tier.first_byte_latency_s + prefix_bytes / (n_accelerators * tier.read_bytes_per_s_per_accelerator)


def break_even_retention_s(kv_bytes_per_token: float, usd_per_byte_s: float, recompute_usd_per_token: float) -> float:
    """How long a cached token can be held before holding it costs more than recomputing it."""
    return recompute_usd_per_token / (kv_bytes_per_token * usd_per_byte_s)


def hit_discount(recompute_usd_per_token: float, kv_bytes_per_token: float, usd_per_byte_s: float, retention_s: float) -> float:
    """Cost of a miss (recompute) over the cost of a hit (holding its KV for the retention time)."""
    return recompute_usd_per_token / (kv_bytes_per_token * usd_per_byte_s * retention_s)


def cache_use(request, tier_id: str | None, accel: Accelerator) -> CacheUse | None:
    """The CacheUse of a workload's prefix-cache request (problem.PrefixCacheRequest) in tier
    `tier_id` on `accel` (None: no prompt cache)."""
    if request is None or tier_id is None:
        return None
    tier = next((t for t in tiers_for(accel) if t.id == tier_id), None)
    if tier is None:
        raise ValueError(f"tier {tier_id!r} is not available on {accel.id}")
    return CacheUse(request.hit_rate, request.prefix_tokens, request.retention_s, tier)
