"""The schemas of the kernel catalog files: `topologies/kernels.yaml` (each accelerator's fitted curves
per engine, as `planner calibrate` writes them) and `topologies/kernel_derivations.yaml` (accelerators
without published tables, derived from a calibrated reference part). `planner.hardware.kernels` reads
them into curves."""

from pydantic import Field

from planner.modes import Engine
from planner.precision import FlopsFormat
from planner.schema import EdgeModel

__all__ = ["AcceleratorSpec", "AllToAllSpec", "CollectiveSpec", "DecodeSpec", "Derivation", "DerivationFile", "ElementwiseSpec", "EngineSpec",
           "KernelFile", "PrefillSpec", "RampSpec", "SpreadFields"]


class SpreadFields(EdgeModel):
    spread: tuple[float, float, float] = (1.0, 1.0, 1.0)
    rows: int | None = None
    grid: str | None = None  # name in the accelerator's grid file
    loo_error: tuple[float, float] | None = None  # leave-one-out [median, p90] of |predicted / measured - 1|
    loo_rows: int | None = None
    smoothed: bool = False  # the grid is a running median along its first axis (planner/hardware/calibrate_grids.py)
    fit_spread: tuple[float, float, float] | None = None


class RampSpec(SpreadFields):
    t0_s: float = Field(ge=0)
    eta_max: float = Field(gt=0)
    m_half: float = Field(ge=0)
    eta_m: float = Field(gt=0)
    eta_stream: float = Field(default=0.0, ge=0)
    stream_rows: int | None = None
    flops_format: FlopsFormat | None = None  # eta_max is a fraction of this format's peak (the measured kernel's math)


class DecodeSpec(SpreadFields):
    t0_s: float = Field(ge=0)
    eta_kv: float = Field(gt=0)
    c_s: float = Field(default=0.0, ge=0)


class PrefillSpec(SpreadFields):
    t0_s: float = Field(ge=0)
    eta_max: float = Field(gt=0)
    s_half: float = Field(ge=0)


class CollectiveSpec(SpreadFields):
    alpha_s: float = Field(ge=0)
    bus_bytes_per_s: float = Field(gt=0)


class AllToAllSpec(SpreadFields):
    alpha_s: float = Field(ge=0)
    bytes_per_s: float = Field(gt=0)
    nodes: int | None = None


class ElementwiseSpec(EdgeModel):
    t0_s: float = Field(ge=0)
    eta_bw: float = Field(gt=0)
    fit_spread: tuple[float, float, float] | None = None
    rows: int | None = None


class EngineSpec(EdgeModel):
    versions: dict[str, str] = Field(default_factory=dict)
    gemm: dict[str, RampSpec] = Field(default_factory=dict)
    moe: dict[str, RampSpec] = Field(default_factory=dict)
    moe_routing: dict[str, dict[str, RampSpec]] = Field(default_factory=dict)
    moe_wide_ep: dict[str, dict[str, dict[str, RampSpec]]] = Field(default_factory=dict)
    attention_decode: dict[str, DecodeSpec] = Field(default_factory=dict)
    attention_prefill: dict[str, PrefillSpec] = Field(default_factory=dict)
    mla_decode: dict[str, DecodeSpec] = Field(default_factory=dict)
    mla_prefill: dict[str, PrefillSpec] = Field(default_factory=dict)
    all_reduce: dict[int, CollectiveSpec] = Field(default_factory=dict)
    all_to_all: dict[str, dict[str, AllToAllSpec]] = Field(default_factory=dict)
    elementwise: dict[str, ElementwiseSpec] = Field(default_factory=dict)
    suspect: list[str] = Field(default_factory=list)


class AcceleratorSpec(EdgeModel):
    system: str
    grids: str | None = None  # grid file, relative to kernels.yaml
    nccl: dict[str, dict[int, CollectiveSpec]] = Field(default_factory=dict)
    engines: dict[Engine, EngineSpec] = Field(default_factory=dict)


class KernelFile(EdgeModel):
    source: dict[str, str]
    accelerators: dict[str, AcceleratorSpec]


class Derivation(EdgeModel):
    accelerator: str
    reference: str = Field(description="a calibrated accelerator whose curves are taken")
    compute_scale: float = Field(default=1.0, gt=0, description="multiplies eta_max of GEMM-like kernels")
    memory_scale: float = Field(default=1.0, gt=0, description="multiplies the HBM fractions of memory-bound work (GEMM eta_m and "
                                "eta_stream, decode attention eta_kv, elementwise eta_bw): the part's measured fraction of its HBM peak over the "
                                "reference's, one microbenchmark run on both")
    spread_log_factor: float = Field(ge=1.0, description="widens the reference spreads: p10 and p90 ratios raised to it")
    basis: str


class DerivationFile(EdgeModel):
    derivations: list[Derivation]
