"""The hardware catalog as the planner uses it: accelerators and racks converted once into frozen SI
values, achievable fractions applied, every figure's source key checked against sources.yaml."""

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ValidationError,
)

from planner.errors import (
    InputIssue,
    PlannerInputError,
    issues_from_validation_error,
    load_yaml_file,
)
from planner.hardware.specs import AcceleratorSpec, LinksScaleUp, RackSpec, TorusScaleUp
from planner.paths import data_dir
from planner.precision import FLOPS_FORMATS_NARROW_TO_WIDE, FlopsFormat
from planner.schema import EdgeModel
from planner.units import GB, MB, MIB, TB, TFLOP

__all__ = ["Accelerator", "AchievableDefaults", "HardwareCatalog", "Overheads", "RackType", "ScaleUpTopology", "check_source_keys", "load_hardware_catalog"]

# ---------------------------------------------------------------------------------------------
# Internal values (SI units)


@dataclass(frozen=True)
class Accelerator:
    """An accelerator in SI units, with its achievable fractions resolved."""

    id: str
    name: str
    vendor: str
    hbm_capacity_bytes: float
    hbm_bandwidth_bytes_per_s: float
    dense_flops_per_s: Mapping[FlopsFormat, float]
    scale_up_bandwidth_bytes_per_s: float
    scale_out_bandwidth_bytes_per_s: float
    host_memory_bytes: float | None
    host_link_bytes_per_s: float | None
    price_usd_per_hour: float
    price_basis: str
    compute_fraction_by_format: Mapping[FlopsFormat, float]
    hbm_bandwidth_fraction: float
    scale_up_bandwidth_fraction: float
    scale_out_bandwidth_fraction: float
    sources: Mapping[str, str] = field(default_factory=dict)
    l2_cache_bytes: float | None = None  # last-level cache (calibration: which GEMM shapes stream their weights cold)
    kernels_dir: Path | None = None  # a user catalog's directory holding this part's kernel curves (None: the shipped ones)

    def achievable_flops_per_s(self, fmt: FlopsFormat) -> float:
        """Dense tensor-core FLOP/s in `fmt` at the measured achievable fraction (the roofline's compute rate)."""
        return self.dense_flops_per_s[fmt] * self.compute_fraction_by_format[fmt]

    @property
    def achievable_hbm_bytes_per_s(self) -> float:
        """HBM bandwidth at the achievable fraction (the roofline's memory rate)."""
        return self.hbm_bandwidth_bytes_per_s * self.hbm_bandwidth_fraction

    @property
    def achievable_scale_up_bytes_per_s(self) -> float:
        """One accelerator's scale-up bandwidth at the achievable fraction (traffic inside its domain)."""
        return self.scale_up_bandwidth_bytes_per_s * self.scale_up_bandwidth_fraction

    @property
    def achievable_scale_out_bytes_per_s(self) -> float:
        """One accelerator's NIC bandwidth at the achievable fraction (KV hand-offs, prefix reloads, cross-domain traffic)."""
        return self.scale_out_bandwidth_bytes_per_s * self.scale_out_bandwidth_fraction

    def supported_flops_format(self, wanted: FlopsFormat) -> FlopsFormat | None:
        """`wanted` if the accelerator has tensor cores for it, else the next wider format it has."""
        order = FLOPS_FORMATS_NARROW_TO_WIDE
        for fmt in order[order.index(wanted):]:
            if fmt in self.dense_flops_per_s:
                return fmt
        return None


@dataclass(frozen=True)
class ScaleUpTopology:
    kind: Literal["switched", "full_mesh", "torus", "links"]
    dims: tuple[int, ...] = ()
    wraparound: bool = True
    axis_link_bandwidth_bytes_per_s: tuple[float, ...] | None = None
    switches: tuple[str, ...] = ()
    links: tuple[tuple[int | str, int | str, float], ...] = ()  # (end, end, bytes/s per direction)


@dataclass(frozen=True)
class RackType:
    """A scale-up unit: `n_accelerators` of one accelerator joined by a scale-up topology."""

    id: str
    name: str
    accelerator: Accelerator
    n_accelerators: int
    topology: ScaleUpTopology
    accelerators_per_host: int = 0  # 0: one host drives the whole unit

    @property
    def host_size(self) -> int:
        return self.accelerators_per_host or self.n_accelerators


@dataclass(frozen=True)
class Overheads:
    """Fixed costs that do not scale with bytes or FLOPs (defaults.yaml, with sources)."""

    collective_latency_s: float
    runtime_reserved_bytes: float
    communication_buffer_bytes_by_group_size: tuple[tuple[int, float], ...]

    def communication_buffer_bytes(self, group_size: int) -> float:
        """Collective-library buffers per accelerator for a group of `group_size` ranks."""
        best = 0.0
        for size, n_bytes in self.communication_buffer_bytes_by_group_size:
            if size <= group_size:
                best = n_bytes
        return best


@dataclass(frozen=True)
class AchievableDefaults:
    compute_fraction: float
    hbm_bandwidth_fraction: float
    scale_up_bandwidth_fraction: float
    scale_out_bandwidth_fraction: float


@dataclass(frozen=True)
class HardwareCatalog:
    accelerators: Mapping[str, Accelerator]
    racks: Mapping[str, RackType]
    overheads: Overheads
    defaults: AchievableDefaults
    sources: Mapping[str, str]

    def with_overrides(
        self,
        *,
        accelerators: Iterable[AcceleratorSpec] = (),
        racks: Iterable[RackSpec] = (),
        price_usd_per_hour: Mapping[str, float] | None = None,
        achievable: Mapping[str, Mapping[str, float]] | None = None,
        field_prefix: str = "cluster",
    ) -> "HardwareCatalog":
        """A copy with problem-specific accelerators, racks, prices and achievable fractions."""
        accel = dict(self.accelerators)
        for spec in accelerators:
            accel[spec.id] = _accelerator_from_spec(spec, self.defaults, self.sources)
        issues = []
        for accel_id, price in (price_usd_per_hour or {}).items():
            if accel_id not in accel:
                issues.append(_unknown_accelerator(f"{field_prefix}.price_overrides_usd_per_hour.{accel_id}", accel_id, accel))
                continue
            accel[accel_id] = replace(accel[accel_id], price_usd_per_hour=price, price_basis="set in the problem file")
        for accel_id, fractions in (achievable or {}).items():
            if accel_id not in accel:
                issues.append(_unknown_accelerator(f"{field_prefix}.achievable_overrides.{accel_id}", accel_id, accel))
                continue
            accel[accel_id] = _apply_fractions(accel[accel_id], fractions)
        rack_map = {rid: replace(r, accelerator=accel[r.accelerator.id]) for rid, r in self.racks.items()}
        for i, spec in enumerate(racks):
            if spec.accelerator not in accel:
                issues.append(_unknown_accelerator(f"{field_prefix}.custom_racks[{i}].accelerator", spec.accelerator, accel))
                continue
            rack_map[spec.id] = _rack_from_spec(spec, accel)
        if issues:
            raise PlannerInputError(issues)
        return replace(self, accelerators=accel, racks=rack_map)


def _unknown_accelerator(field_name: str, name: str, accel: Mapping[str, Accelerator]) -> InputIssue:
    from planner.errors import unknown_name_issue

    return unknown_name_issue(field_name, "accelerator", name, accel)


def _apply_fractions(accel: Accelerator, fractions: Mapping[str, float]) -> Accelerator:
    updates: dict = {}
    for name, value in fractions.items():
        if name == "compute_fraction":
            updates["compute_fraction_by_format"] = {fmt: value for fmt in accel.dense_flops_per_s}
        else:
            updates[name] = value
    return replace(accel, **updates)


def _compute_fractions(spec: AcceleratorSpec, default: float) -> dict[FlopsFormat, float]:
    """Measured fraction per format; an unmeasured format takes the same part's nearest measured
    format (wider first: the same silicon and software stack), and only then the global default."""
    measured = spec.compute_fraction or {}
    order = list(FLOPS_FORMATS_NARROW_TO_WIDE)
    fractions = {}
    for fmt in spec.dense_tflop_per_s:
        i = order.index(fmt)
        nearest = [f for f in order[i:] + order[:i][::-1] if f in measured]
        fractions[fmt] = measured[nearest[0]] if nearest else default
    return fractions


def _accelerator_from_spec(spec: AcceleratorSpec, defaults: AchievableDefaults, sources: Mapping[str, str]) -> Accelerator:
    compute_fraction = _compute_fractions(spec, defaults.compute_fraction)
    return Accelerator(
        id=spec.id,
        name=spec.name,
        vendor=spec.vendor,
        hbm_capacity_bytes=spec.hbm_capacity_mib_reported * MIB if spec.hbm_capacity_mib_reported else spec.hbm_capacity_gb * GB,
        hbm_bandwidth_bytes_per_s=spec.hbm_bandwidth_tb_per_s * TB,
        dense_flops_per_s={fmt: tflops * TFLOP for fmt, tflops in spec.dense_tflop_per_s.items()},
        scale_up_bandwidth_bytes_per_s=spec.scale_up_gb_per_s * GB,
        scale_out_bandwidth_bytes_per_s=spec.scale_out_gb_per_s * GB,
        host_memory_bytes=None if spec.host_memory_gb is None else spec.host_memory_gb * GB,
        host_link_bytes_per_s=None if spec.host_link_gb_per_s is None else spec.host_link_gb_per_s * GB,
        price_usd_per_hour=spec.price_usd_per_hour,
        price_basis=spec.price_basis,
        compute_fraction_by_format=compute_fraction,
        hbm_bandwidth_fraction=spec.hbm_bandwidth_fraction or defaults.hbm_bandwidth_fraction,
        scale_up_bandwidth_fraction=spec.scale_up_bandwidth_fraction or defaults.scale_up_bandwidth_fraction,
        scale_out_bandwidth_fraction=spec.scale_out_bandwidth_fraction or defaults.scale_out_bandwidth_fraction,
        sources={name: sources.get(key, key) for name, key in spec.sources.items()},
        l2_cache_bytes=None if spec.l2_cache_mb is None else spec.l2_cache_mb * MB,
    )


def _rack_from_spec(spec: RackSpec, accelerators: Mapping[str, Accelerator]) -> RackType:
    up = spec.scale_up
    if isinstance(up, TorusScaleUp):
        axis = None if up.axis_link_gb_per_s is None else tuple(b * GB for b in up.axis_link_gb_per_s)
        topology = ScaleUpTopology("torus", tuple(up.dims), up.wraparound, axis)
    elif isinstance(up, LinksScaleUp):
        topology = ScaleUpTopology("links", switches=tuple(up.switches),
                                   links=tuple((link.a, link.b, link.gb_per_s * GB) for link in up.links))
    else:
        topology = ScaleUpTopology(up.kind)
    return RackType(spec.id, spec.name, accelerators[spec.accelerator], spec.accelerators, topology, spec.accelerators_per_host or 0)


class _AcceleratorFile(EdgeModel):
    accelerators: list[AcceleratorSpec]


class _RackFile(EdgeModel):
    racks: list[RackSpec]


def _parse(model: type[BaseModel], path: Path) -> BaseModel:
    try:
        return model.model_validate(load_yaml_file(path))
    except ValidationError as exc:
        raise PlannerInputError(issues_from_validation_error(exc, model=model), source=str(path)) from None


def _load_defaults(path: Path) -> tuple[AchievableDefaults, Overheads]:
    raw = load_yaml_file(path)
    ach = {name: entry["value"] for name, entry in raw["achievable"].items()}
    over = {name: entry["value"] for name, entry in raw["overheads"].items()}
    buffers = tuple(sorted((int(k), float(v)) for k, v in over["communication_buffer_bytes_by_group_size"].items()))
    return (
        AchievableDefaults(**ach),
        Overheads(float(over["collective_latency_s"]), float(over["runtime_reserved_bytes"]), buffers),
    )


def check_source_keys(specs: Iterable, sources: Mapping[str, str], path: Path) -> None:
    """Every citation key of every spec (anything with `id` and `sources`) is in topologies/sources.yaml."""
    issues = [
        InputIssue(f"{spec.id}.sources.{name}", f"unknown source key '{key}'", "add it to topologies/sources.yaml or fix the key")
        for spec in specs
        for name, key in spec.sources.items()
        if key not in sources
    ]
    if issues:
        raise PlannerInputError(issues, source=str(path))


@functools.lru_cache(maxsize=4)
def load_hardware_catalog(directory: Path | None = None) -> HardwareCatalog:
    """Read every accelerator and rack file under `directory` (default: the built-in topologies/)."""
    root = directory or data_dir("topologies")
    sources = load_yaml_file(root / "sources.yaml")["sources"]
    defaults, overheads = _load_defaults(root / "defaults.yaml")
    accelerators: dict[str, Accelerator] = {}
    for path in sorted((root / "accelerators").glob("*.yaml")):
        parsed = _parse(_AcceleratorFile, path)
        check_source_keys(parsed.accelerators, sources, path)
        for spec in parsed.accelerators:
            if spec.id in accelerators:
                raise PlannerInputError(InputIssue(spec.id, f"accelerator defined twice ({path.name})", "keep one entry"))
            accelerators[spec.id] = _accelerator_from_spec(spec, defaults, sources)
    racks: dict[str, RackType] = {}
    for path in sorted((root / "racks").glob("*.yaml")):
        parsed = _parse(_RackFile, path)
        check_source_keys(parsed.racks, sources, path)
        for spec in parsed.racks:
            if spec.accelerator not in accelerators:
                raise PlannerInputError(_unknown_accelerator(f"{spec.id}.accelerator", spec.accelerator, accelerators), str(path))
            racks[spec.id] = _rack_from_spec(spec, accelerators)
    return HardwareCatalog(accelerators, racks, overheads, defaults, sources)
