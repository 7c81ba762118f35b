"""Accelerator and rack catalog: pydantic models for the data files in `topologies/`, converted once
into frozen SI-unit values that the rest of the planner uses."""

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Literal

import networkx as nx
from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from planner.errors import (
    InputIssue,
    PlannerInputError,
    issues_from_validation_error,
    load_yaml_file,
)
from planner.paths import data_dir
from planner.precision import FLOPS_FORMATS_NARROW_TO_WIDE, FlopsFormat
from planner.schema import CatalogId, EdgeModel, Fraction
from planner.units import GB, TB, TFLOP

__all__ = [
    "Accelerator",
    "AcceleratorSpec",
    "HardwareCatalog",
    "Overheads",
    "RackSpec",
    "RackType",
    "ScaleUpTopology",
    "check_source_keys",
    "load_hardware_catalog",
]


LINK_GB_PER_S_CEILING = 100_000.0  # 100 TB/s per accelerator: no link comes near; larger values are bytes/s


def _check_magnitude(value: float, field_name: str, limit: float, likely_unit: str, fix: str) -> None:
    """Catch a value written in the wrong unit (bytes/s where GB/s is asked, and so on)."""
    if value > limit:
        raise ValueError(f"{field_name} = {value:g} looks like {likely_unit}\n    fix: {fix}")


def _check_small(value: float, field_name: str, limit: float, likely_unit: str, fix: str) -> None:
    """Catch a value written in a larger unit than asked (TB/s where GB/s is asked)."""
    if value < limit:
        raise ValueError(f"{field_name} = {value:g} looks like {likely_unit}\n    fix: {fix}")


class AcceleratorSpec(EdgeModel):
    """One accelerator as written in a catalog or problem file (friendly units, named in each field)."""

    id: CatalogId
    name: str = Field(description="full product name")
    vendor: str = Field(description="manufacturer")
    hbm_capacity_gb: float = Field(gt=0, description="HBM capacity in decimal GB (10^9 bytes)")
    hbm_bandwidth_tb_per_s: float = Field(gt=0, description="peak HBM bandwidth in TB/s (10^12 bytes/s)")
    dense_tflop_per_s: dict[FlopsFormat, Annotated[float, Field(gt=0)]] = Field(
        description="dense (no 2:4 sparsity) tensor-core TFLOP/s per input format: bf16, fp8, fp4"
    )
    scale_up_gb_per_s: float = Field(gt=0, description="scale-up (NVLink, ICI, xGMI) bandwidth per accelerator, per direction, GB/s")
    scale_out_gb_per_s: float = Field(gt=0, description="scale-out (NIC) bandwidth per accelerator, per direction, GB/s")
    host_memory_gb: float | None = Field(default=None, gt=0, description="host DRAM per accelerator, GB")
    host_link_gb_per_s: float | None = Field(default=None, gt=0, description="accelerator-to-host link (PCIe, NVLink-C2C), GB/s per direction")
    price_usd_per_hour: float = Field(gt=0, description="rental price per accelerator-hour in USD (an estimate)")
    price_basis: str = Field(description="where the price comes from (provider, date, on-demand or reserved)")
    compute_fraction: dict[FlopsFormat, Fraction] | None = Field(
        default=None, description="achievable fraction of peak FLOP/s per format (measured matmul efficiency)"
    )
    hbm_bandwidth_fraction: Fraction | None = Field(default=None, description="achievable fraction of peak HBM bandwidth")
    scale_up_bandwidth_fraction: Fraction | None = Field(default=None, description="achievable fraction of scale-up bandwidth")
    scale_out_bandwidth_fraction: Fraction | None = Field(default=None, description="achievable fraction of scale-out bandwidth")
    notes: str | None = Field(default=None, description="free text")
    sources: dict[str, str] = Field(
        default_factory=dict, description="citation key (topologies/sources.yaml) for each numeric field"
    )

    # Per-field unit checks (pydantic reports every failing field at once).
    @field_validator("hbm_capacity_gb")
    @classmethod
    def _capacity_unit(cls, value: float) -> float:
        _check_magnitude(value, "hbm_capacity_gb", 1e5, "bytes", "write decimal gigabytes, e.g. 80 for 80 GB")
        _check_small(value, "hbm_capacity_gb", 1.0, "terabytes", "write decimal gigabytes, e.g. 288 for 0.288 TB")
        return value

    @field_validator("hbm_bandwidth_tb_per_s")
    @classmethod
    def _bandwidth_unit(cls, value: float) -> float:
        _check_magnitude(value, "hbm_bandwidth_tb_per_s", 1e3, "GB/s or bytes/s", "write TB/s, e.g. 3.35")
        return value

    @field_validator("dense_tflop_per_s")
    @classmethod
    def _flops_unit(cls, value: dict) -> dict:
        for fmt, tflops in value.items():
            _check_magnitude(tflops, f"dense_tflop_per_s.{fmt}", 1e7, "FLOP/s", "write TFLOP/s, e.g. 989.5")
            _check_small(tflops, f"dense_tflop_per_s.{fmt}", 1.0, "PFLOP/s", "write TFLOP/s, e.g. 5000 for 5 PFLOP/s")
        return value

    @field_validator("scale_up_gb_per_s", "scale_out_gb_per_s")
    @classmethod
    def _link_unit(cls, value: float, info) -> float:
        _check_magnitude(value, info.field_name, LINK_GB_PER_S_CEILING, "bytes/s", "write GB/s per direction, e.g. 450")
        _check_small(value, info.field_name, 0.5, "TB/s", "write GB/s per direction, e.g. 900 for 0.9 TB/s")
        return value

    @model_validator(mode="after")
    def _units_and_sources(self) -> "AcceleratorSpec":
        numeric = [
            name
            for name in ("hbm_capacity_gb", "hbm_bandwidth_tb_per_s", "dense_tflop_per_s", "scale_up_gb_per_s",
                         "scale_out_gb_per_s", "host_memory_gb", "host_link_gb_per_s", "price_usd_per_hour", "compute_fraction")
            if getattr(self, name) is not None
        ]
        missing = [name for name in numeric if name not in self.sources]
        if missing:
            raise ValueError(
                f"numbers without a source: {', '.join(missing)}\n    fix: add `sources: {{{missing[0]}: KEY}}` "
                "with a key from topologies/sources.yaml (or PROJECT_ESTIMATE / DERIVED, explained in notes)"
            )
        return self


class SwitchedScaleUp(EdgeModel):
    """Every accelerator has one link of its full scale-up bandwidth into a non-blocking switch."""

    kind: Literal["switched"]


class FullMeshScaleUp(EdgeModel):
    """One direct link per pair of accelerators; each link carries 1/(n-1) of the scale-up bandwidth."""

    kind: Literal["full_mesh"]


class TorusScaleUp(EdgeModel):
    """Accelerators on a torus (TPU ICI, Trainium NeuronLink); links only to grid neighbours."""

    kind: Literal["torus"]
    dims: list[Annotated[int, Field(ge=2)]] = Field(min_length=1, max_length=3, description="torus side lengths")
    wraparound: bool = Field(default=True, description="whether each axis closes into a ring")
    axis_link_gb_per_s: list[Annotated[float, Field(gt=0)]] | None = Field(
        default=None, description="per-link bandwidth per axis, GB/s per direction (default: even split)"
    )

    @model_validator(mode="after")
    def _axes(self) -> "TorusScaleUp":
        if self.axis_link_gb_per_s is not None and len(self.axis_link_gb_per_s) != len(self.dims):
            raise ValueError(
                f"axis_link_gb_per_s has {len(self.axis_link_gb_per_s)} entries for {len(self.dims)} axes"
                "\n    fix: give one bandwidth per axis of dims"
            )
        return self


class LinkSpec(EdgeModel):
    """One scale-up link of an explicitly wired unit. Ends are accelerator indices (0-based) or
    switch names from `switches`."""

    a: int | str = Field(description="accelerator index or switch name")
    b: int | str = Field(description="accelerator index or switch name")
    gb_per_s: float = Field(gt=0, description="link bandwidth, GB/s per direction")


class LinksScaleUp(EdgeModel):
    """A unit wired link by link (a custom board, a partial mesh, a two-level switch tree).
    Parallel links between the same two ends add up."""

    kind: Literal["links"]
    switches: list[CatalogId] = Field(default_factory=list, description="names of the unit's switches")
    links: list[LinkSpec] = Field(min_length=1, description="every scale-up link of the unit")


def _scale_up_kind(value: object) -> str:
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return f"tag:{kind}" if kind in ("switched", "full_mesh", "torus", "links") else "tag:unknown"


ScaleUpSpec = Annotated[
    Annotated[SwitchedScaleUp, Tag("tag:switched")] | Annotated[FullMeshScaleUp, Tag("tag:full_mesh")]
    | Annotated[TorusScaleUp, Tag("tag:torus")] | Annotated[LinksScaleUp, Tag("tag:links")],
    Discriminator(_scale_up_kind, custom_error_type="scale_up_kind",
                  custom_error_message="scale_up.kind must be one of switched, full_mesh, torus, links"),
]


class RackSpec(EdgeModel):
    """One scale-up unit (box, rack, TPU slice) as written in a catalog or problem file."""

    id: CatalogId
    name: str = Field(description="full name")
    accelerator: str = Field(description="accelerator id (catalog or the problem's custom_accelerators)")
    accelerators: int = Field(ge=1, le=100_000, description="accelerators in one scale-up domain")
    accelerators_per_host: int | None = Field(default=None, ge=1, description="accelerators one host (server, compute tray, TPU VM) drives; default: all")
    scale_up: ScaleUpSpec = Field(description="how the accelerators of the unit are linked")
    sources: dict[str, str] = Field(default_factory=dict, description="citation key for each numeric field")

    @model_validator(mode="after")
    def _shape(self) -> "RackSpec":
        if self.accelerators_per_host is not None and self.accelerators % self.accelerators_per_host:
            raise ValueError(f"{self.accelerators} accelerators do not split into hosts of {self.accelerators_per_host}"
                             "\n    fix: accelerators_per_host must divide accelerators")
        if isinstance(self.scale_up, LinksScaleUp):
            self._check_links(self.scale_up)
        if isinstance(self.scale_up, TorusScaleUp):
            product = 1
            for side in self.scale_up.dims:
                product *= side
            if product != self.accelerators:
                raise ValueError(
                    f"torus {'x'.join(map(str, self.scale_up.dims))} holds {product} accelerators, not {self.accelerators}"
                    "\n    fix: make the product of scale_up.dims equal accelerators"
                )
        return self

    def _check_links(self, up: LinksScaleUp) -> None:
        switches = set(up.switches)
        if len(switches) != len(up.switches):
            raise ValueError("scale_up.switches names a switch twice\n    fix: give every switch a distinct name")
        index_of = {name: self.accelerators + i for i, name in enumerate(up.switches)}

        def end(value: int | str, k: int, side: str) -> int:
            if isinstance(value, int):
                if not 0 <= value < self.accelerators:
                    raise ValueError(f"scale_up.links[{k}].{side} = {value} is not an accelerator index"
                                     f"\n    fix: use 0..{self.accelerators - 1}, or a switch name from scale_up.switches")
                return value
            if value not in switches:
                raise ValueError(f"scale_up.links[{k}].{side} = {value!r} is not a switch of this unit"
                                 f"\n    fix: add it to scale_up.switches (now {sorted(switches) or 'empty'}) or use an accelerator index")
            return index_of[value]

        graph = nx.Graph()
        graph.add_nodes_from(range(self.accelerators + len(up.switches)))
        for k, link in enumerate(up.links):
            a, b = end(link.a, k, "a"), end(link.b, k, "b")
            if a == b:
                raise ValueError(f"scale_up.links[{k}] joins {link.a!r} to itself\n    fix: a link needs two different ends")
            graph.add_edge(a, b)
        reached = nx.node_connected_component(graph, 0)
        cut_off = [i for i in range(self.accelerators) if i not in reached]
        if cut_off:
            raise ValueError(f"accelerators {cut_off[:8]} are not linked to accelerator 0: a unit is one scale-up domain"
                             "\n    fix: add links, or describe the parts as separate racks")


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
        hbm_capacity_bytes=spec.hbm_capacity_gb * GB,
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
