"""Measured kernel rates per accelerator and serving engine: the parametric curves `planner calibrate`
fits to measured kernel tables (`topologies/kernels.yaml`) with the correction grids that keep the
tables' shape structure (`topologies/kernel_grids/<accelerator>.zip`, read on first use), and the
derived curves of accelerators nobody has published tables for (`topologies/kernel_derivations.yaml`:
a reference part's curves and grids, GEMM efficiencies and HBM fractions scaled, spreads widened).

Every curve carries its spread: the 10th, 50th and 90th percentile of measured over predicted time.
For a curve with a grid these are leave-one-out residuals (each measured row predicted with itself
left out), taken around their median: the grid is the prediction, the spread its range. For a curve
without one (an older kernels.yaml) they are the fit's residuals, and the step model multiplies by
the median.
"""

import functools
from dataclasses import dataclass, field, replace
from pathlib import Path

from planner.errors import (
    InputIssue,
    PlannerInputError,
    issues_from_validation_error,
    load_yaml_file,
)
from planner.hardware.kernel_grids import Grid, GridRef, GridSet
from planner.hardware.kernel_specs import (
    DecodeSpec,
    Derivation,
    DerivationFile,
    EngineSpec,
    KernelFile,
    PrefillSpec,
    RampSpec,
    SpreadFields,
)
from planner.modes import Engine
from planner.paths import data_dir
from planner.precision import FlopsFormat

__all__ = ["AllToAll", "Collective", "DecodeAttention", "Elementwise", "HeadShape", "KernelRates", "PrefillAttention", "Ramp", "Spread", "grid_of",
           "kernel_rates"]

KERNELS_FILE = "kernels.yaml"
DERIVATIONS_FILE = "kernel_derivations.yaml"


@dataclass(frozen=True)
class Spread:
    """Measured over fitted time of a curve's rows: 10th, 50th and 90th percentile."""

    p10: float = 1.0
    p50: float = 1.0
    p90: float = 1.0

    def widened(self, log_factor: float) -> "Spread":
        """The same median with the p10 and p90 ratios raised to `log_factor` around it."""
        return Spread(self.p50 * (self.p10 / self.p50) ** log_factor, self.p50, self.p50 * (self.p90 / self.p50) ** log_factor)


def grid_of(curve, key=None) -> Grid | None:
    """A curve's correction grid (for a grid set, the one measured nearest to `key`); None without one."""
    if curve.grid is None:
        return None
    grid = curve.grid.get()
    return grid.grid(key) if isinstance(grid, GridSet) else grid


@dataclass(frozen=True)
class Ramp:
    """GEMM-like kernel: t = t0 + max(FLOPs / (F eta_max m/(m + m_half)), bytes / (BW eta_m)), where m
    is the rows per weight matrix (tokens for a dense GEMM, tokens per expert for a grouped GEMM);
    eta_stream: the HBM streaming rate of weight-bound shapes, as a fraction of BW (0: not measured)."""

    t0_s: float
    eta_max: float
    m_half: float
    eta_m: float
    spread: Spread = Spread()
    eta_stream: float = 0.0
    grid: GridRef | None = None
    flops_format: FlopsFormat | None = None  # F's format: the measured kernel's math (None: the deployment's compute format)


@dataclass(frozen=True)
class DecodeAttention:
    """t = t0 + KV bytes / (BW eta_kv) + c x (sequences x query heads) per layer and accelerator."""

    t0_s: float
    eta_kv: float
    c_s: float = 0.0
    spread: Spread = Spread()
    grid: GridRef | None = None
    mla: bool = False  # measured on MLA (latent) attention: its grids are by query heads alone


@dataclass(frozen=True)
class HeadShape:
    """Attention heads one tensor-parallel rank runs: query heads, KV heads, head dimension (q.k)."""

    heads: float
    kv_heads: float
    head_dim: float


@dataclass(frozen=True)
class PrefillAttention:
    """t = t0 + causal FLOPs / (F_bf16 eta_max s/(s + s_half)) per layer and accelerator, s the context.
    `mla`: measured on MLA (latent) attention; `shape`: the deployment's heads per rank, when bound."""

    t0_s: float
    eta_max: float
    s_half: float
    spread: Spread = Spread()
    grid: GridRef | None = None
    mla: bool = False
    shape: HeadShape | None = None


@dataclass(frozen=True)
class Collective:
    """t = alpha + algorithm bytes / bus bandwidth (ring factors applied by the caller)."""

    alpha_s: float
    bus_bytes_per_s: float
    spread: Spread = Spread()
    grid: GridRef | None = None


@dataclass(frozen=True)
class AllToAll:
    """An expert all-to-all phase: t = alpha + bytes / rate (dispatch or combine, within a node)."""

    alpha_s: float
    bytes_per_s: float
    spread: Spread = Spread()
    grid: GridRef | None = None


@dataclass(frozen=True)
class Elementwise:
    """Norms, activations and the like: t = t0 per op + bytes / (BW eta_bw) (a probe's measurement)."""

    t0_s: float
    eta_bw: float


@dataclass(frozen=True)
class KernelRates:
    """Every kernel curve of one accelerator under one engine."""

    accelerator: str
    engine: Engine
    source: str
    gemm: dict[str, Ramp] = field(default_factory=dict)  # by GEMM format: bf16, fp8, fp8_block, fp4
    moe: dict[str, Ramp] = field(default_factory=dict)  # by expert-weight format, balanced routing
    moe_routing: dict[str, dict[str, Ramp]] = field(default_factory=dict)  # skewed routing (power_law_1.01, ...) -> by format
    moe_wide_ep: dict[str, dict[str, dict[str, Ramp]]] = field(default_factory=dict)  # DeepEP mode -> routing -> format (SGLang)
    attention_decode: dict[str, DecodeAttention] = field(default_factory=dict)  # by KV format
    attention_prefill: dict[str, PrefillAttention] = field(default_factory=dict)
    mla_decode: dict[str, DecodeAttention] = field(default_factory=dict)
    mla_prefill: dict[str, PrefillAttention] = field(default_factory=dict)
    all_reduce: dict[int, Collective] = field(default_factory=dict)  # the engine's in-domain all-reduce by group size
    all_to_all: dict[str, dict[str, AllToAll]] = field(default_factory=dict)  # low_latency/normal -> dispatch/combine
    elementwise: dict[str, Elementwise] = field(default_factory=dict)  # by activation format (probed parts only)
    derived_from: str | None = None
    heads: HeadShape | None = None  # the deployment's attention heads per rank (`with_heads`), for prefill attention

    @property
    def calibrated(self) -> bool:
        return self.derived_from is None

    def gemm_curve(self, fmt: str) -> Ramp:
        return _first(self.gemm, fmt, ("fp8", "bf16"), f"dense GEMM curve ({self.accelerator})")

    def moe_curve(self, fmt: str, routing: str = "balanced", wide_ep_mode: str | None = None) -> Ramp:
        """Grouped expert GEMM of `fmt` measured under `routing` (balanced when that skew was not measured); behind
        DeepEP (`wide_ep_mode` low_latency or normal) the engine's wide-EP tables wherever it has them, in `fmt` or the
        nearest format there: a rank then runs a masked grouped GEMM over the tokens dispatched to it, while the other
        MoE tables time a fused kernel fed every token of the step (docs/step-model.md, "Expert GEMMs behind DeepEP")."""
        wide = self.moe_wide_ep.get(wide_ep_mode or "", {})
        wide = wide.get(routing) or wide.get("balanced") or {}
        if wide:
            return _first(wide, fmt, WIDE_EP_FORMATS)
        table = self.moe_routing.get(routing) or self.moe
        return _first(table, fmt, ("fp8_block", "fp8", "bf16", "fp4", "mxfp4")) if table else self.gemm_curve(fmt)

    def decode_attention_curve(self, kv_fmt: str, mla: bool) -> DecodeAttention:
        table = (self.mla_decode or self.attention_decode) if mla else self.attention_decode
        return _first(table, kv_fmt, ("bf16", "fp8"), f"decode-attention curve ({self.accelerator})")

    def prefill_attention_curve(self, kv_fmt: str, mla: bool) -> PrefillAttention:
        """The prefill-attention curve, bound to the deployment's heads per rank when known."""
        table = (self.mla_prefill or self.attention_prefill) if mla else self.attention_prefill
        curve = _first(table, kv_fmt, ("bf16", "fp8"), f"prefill-attention curve ({self.accelerator})")
        return replace(curve, shape=self.heads) if self.heads is not None else curve

    def with_heads(self, heads: HeadShape) -> "KernelRates":
        """These rates for a deployment whose tensor-parallel ranks run `heads`."""
        return replace(self, heads=heads)

    def all_reduce_curve(self, n: int) -> Collective | None:
        """The curve measured at the largest group size not above `n` (the smallest one above it if none);
        None when no all-reduce was measured (a part probed on one device, without shipped curves)."""
        sizes = sorted(self.all_reduce)
        if not sizes:
            return None
        below = [s for s in sizes if s <= n]
        return self.all_reduce[below[-1] if below else sizes[0]]

    def all_to_all_curve(self, mode: str, phase: str) -> AllToAll | None:
        return self.all_to_all.get(mode, {}).get(phase)


# behind DeepEP, the format a missing one is read in: the nearest wider first (SGLang's wide-EP tables hold fp8_block)
WIDE_EP_FORMATS = ("fp8_block", "fp8", "bf16")


def _first(table: dict, key: str, fallbacks: tuple[str, ...], what: str = "a kernel class every step needs"):
    for k in (key, *fallbacks):
        if k in table:
            return table[k]
    if not table:  # a hand-edited user catalog: `planner calibrate` writes none without these classes
        raise PlannerInputError(InputIssue("kernel_catalog", f"the kernel curves have no {what}",
                                           "write the catalog with `planner calibrate` and leave it unedited"))
    return next(iter(table.values()))


# ---------------------------------------------------------------------------------------------
# The files


def _spread(spec: SpreadFields) -> Spread:
    """The spread of a fit; with a grid, its leave-one-out percentiles taken around their median."""
    p10, p50, p90 = spec.spread
    return Spread(p10 / p50, 1.0, p90 / p50) if spec.grid else Spread(p10, p50, p90)


def _engine_rates(accel: str, engine: Engine, spec: EngineSpec, nccl: dict, source: str, grids: Path | None) -> KernelRates:
    def ref(s: SpreadFields) -> GridRef | None:
        return GridRef(grids, s.grid) if grids is not None and s.grid else None

    def ramp(r: RampSpec) -> Ramp:
        return Ramp(r.t0_s, r.eta_max, r.m_half, r.eta_m, _spread(r), r.eta_stream, ref(r), r.flops_format)

    def decode(a: DecodeSpec, mla: bool) -> DecodeAttention:
        return DecodeAttention(a.t0_s, a.eta_kv, a.c_s, _spread(a), ref(a), mla)

    def prefill(a: PrefillSpec, mla: bool) -> PrefillAttention:
        return PrefillAttention(a.t0_s, a.eta_max, a.s_half, _spread(a), ref(a), mla)

    reduce = spec.all_reduce or nccl.get("all_reduce", {})
    return KernelRates(
        accelerator=accel, engine=engine, source=source,
        gemm={k: ramp(r) for k, r in spec.gemm.items()}, moe={k: ramp(r) for k, r in spec.moe.items()},
        moe_routing={d: {k: ramp(r) for k, r in fits.items()} for d, fits in spec.moe_routing.items()},
        moe_wide_ep={m: {d: {k: ramp(r) for k, r in fits.items()} for d, fits in by.items()} for m, by in spec.moe_wide_ep.items()},
        attention_decode={k: decode(a, False) for k, a in spec.attention_decode.items()},
        attention_prefill={k: prefill(a, False) for k, a in spec.attention_prefill.items()},
        mla_decode={k: decode(a, True) for k, a in spec.mla_decode.items()},
        mla_prefill={k: prefill(a, True) for k, a in spec.mla_prefill.items()},
        all_reduce={n: Collective(c.alpha_s, c.bus_bytes_per_s, _spread(c), ref(c)) for n, c in reduce.items()},
        all_to_all={mode: {phase: AllToAll(p.alpha_s, p.bytes_per_s, _spread(p), ref(p)) for phase, p in phases.items()}
                    for mode, phases in spec.all_to_all.items()},
        elementwise={k: Elementwise(e.t0_s, e.eta_bw) for k, e in spec.elementwise.items()},
    )


def _derive(rates: KernelRates, d: Derivation) -> KernelRates:
    """`rates` of the reference part carried to `d.accelerator`: GEMM-like efficiencies scaled by
    `compute_scale`, the HBM fractions of memory-bound work (a GEMM form's memory side and its weights
    streamed, KV read, elementwise traffic) by `memory_scale`, spreads widened."""
    w, mem = d.spread_log_factor, d.memory_scale

    def ramp(r: Ramp) -> Ramp:
        return replace(r, eta_max=r.eta_max * d.compute_scale, eta_m=r.eta_m * mem, eta_stream=r.eta_stream * mem, spread=r.spread.widened(w))

    def widen(table: dict) -> dict:
        return {k: replace(v, spread=v.spread.widened(w)) for k, v in table.items()}

    def kv_read(table: dict) -> dict:
        return {k: replace(v, eta_kv=v.eta_kv * mem) for k, v in widen(table).items()}

    return replace(
        rates, accelerator=d.accelerator, derived_from=d.reference,
        source=f"derived from {d.reference} ({rates.source}): {d.basis}",
        gemm={k: ramp(r) for k, r in rates.gemm.items()}, moe={k: ramp(r) for k, r in rates.moe.items()},
        moe_routing={skew: {k: ramp(r) for k, r in fits.items()} for skew, fits in rates.moe_routing.items()},
        moe_wide_ep={m: {skew: {k: ramp(r) for k, r in fits.items()} for skew, fits in by.items()} for m, by in rates.moe_wide_ep.items()},
        attention_decode=kv_read(rates.attention_decode), attention_prefill=widen(rates.attention_prefill),
        mla_decode=kv_read(rates.mla_decode), mla_prefill=widen(rates.mla_prefill), all_reduce=widen(rates.all_reduce),
        all_to_all={m: widen(p) for m, p in rates.all_to_all.items()},
        elementwise={k: replace(e, eta_bw=e.eta_bw * mem) for k, e in rates.elementwise.items()},
    )


def _parse(model, path: Path):
    from pydantic import ValidationError

    try:
        return model.model_validate(load_yaml_file(path, catalog=True))
    except ValidationError as exc:
        raise PlannerInputError(issues_from_validation_error(exc, str(path))) from None


@functools.lru_cache(maxsize=4)
def _load(directory: Path) -> dict[tuple[str, Engine], KernelRates]:
    out: dict[tuple[str, Engine], KernelRates] = {}
    kernels_path = directory / KERNELS_FILE
    if not kernels_path.exists():
        return out
    spec: KernelFile = _parse(KernelFile, kernels_path)
    package = f"{spec.source.get('package', '?')} {spec.source.get('version', '')}".strip()
    for accel, a in spec.accelerators.items():
        grids = directory / a.grids if a.grids else None
        for engine, e in a.engines.items():
            versions = ", ".join(f"{k} {v}" for k, v in e.versions.items())
            out[(accel, engine)] = _engine_rates(accel, engine, e, a.nccl, f"{package}, {a.system} {engine} ({versions})", grids)
    derivations_path = directory / DERIVATIONS_FILE
    if derivations_path.exists():
        for d in _parse(DerivationFile, derivations_path).derivations:
            for engine in Engine:
                if (d.reference, engine) in out and (d.accelerator, engine) not in out:
                    out[(d.accelerator, engine)] = _derive(out[(d.reference, engine)], d)
    return out


@functools.lru_cache(maxsize=256)  # asked once per evaluated layout: 13.6k times when a 40-workload fleet is enumerated
def kernel_rates(accelerator: str, engine: Engine, directory: Path | None = None) -> KernelRates | None:
    """The curves of `accelerator` under `engine`, else another engine's there (TensorRT-LLM, SGLang, vLLM); None if none covers it."""
    table = _load((directory or data_dir("topologies")).resolve())
    for e in (engine, Engine.TRTLLM, Engine.SGLANG, Engine.VLLM):
        if (accelerator, e) in table:
            return table[(accelerator, e)]
    return None
