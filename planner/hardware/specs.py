"""Accelerators and racks as written in the catalog files of `topologies/` and in problem files:
pydantic models in the units datasheets use (GB, TB/s, TFLOP/s), with unit-mistake checks."""

from typing import Annotated, Literal

import networkx as nx
from pydantic import (
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from planner.limits import MAX_ACCELERATORS_PER_RACK
from planner.precision import FlopsFormat
from planner.schema import CatalogId, EdgeModel, Fraction

__all__ = ["LINK_GB_PER_S_CEILING", "AcceleratorSpec", "FullMeshScaleUp", "LinkSpec", "LinksScaleUp", "RackSpec", "ScaleUpSpec", "SwitchedScaleUp", "TorusScaleUp"]

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
    hbm_capacity_gb: float = Field(gt=0, description="HBM capacity in decimal GB (10^9 bytes), as the datasheet names it")
    hbm_capacity_mib_reported: int | None = Field(
        default=None, gt=0, description="HBM the device reports (nvidia-smi memory.total, rocm-smi VRAM total) in MiB; "
        "when given it is the capacity used, since HBM stacks come in binary sizes and datasheet 'GB' are often GiB")
    hbm_bandwidth_tb_per_s: float = Field(gt=0, description="peak HBM bandwidth in TB/s (10^12 bytes/s)")
    dense_tflop_per_s: dict[FlopsFormat, Annotated[float, Field(gt=0)]] = Field(
        description="dense (no 2:4 sparsity) tensor-core TFLOP/s per input format: bf16, fp8, fp4"
    )
    scale_up_gb_per_s: float = Field(gt=0, description="scale-up (NVLink, ICI, xGMI) bandwidth per accelerator, per direction, GB/s")
    scale_out_gb_per_s: float = Field(gt=0, description="scale-out (NIC) bandwidth per accelerator, per direction, GB/s")
    host_memory_gb: float | None = Field(default=None, gt=0, description="host DRAM per accelerator, GB")
    host_link_gb_per_s: float | None = Field(default=None, gt=0, description="accelerator-to-host link (PCIe, NVLink-C2C), GB/s per direction")
    l2_cache_mb: float | None = Field(default=None, gt=0, description="last-level (L2) cache in decimal MB, as the specification names it")
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
            for name in ("hbm_capacity_gb", "hbm_capacity_mib_reported", "hbm_bandwidth_tb_per_s", "dense_tflop_per_s", "scale_up_gb_per_s",
                         "scale_out_gb_per_s", "host_memory_gb", "host_link_gb_per_s", "l2_cache_mb", "price_usd_per_hour", "compute_fraction")
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
    accelerators: int = Field(ge=1, le=MAX_ACCELERATORS_PER_RACK, description="accelerators in one scale-up domain")
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
