"""A fixed deployment of one replica: parallel layout, batch, precisions, and the rules a layout
must satisfy for a given model."""

from dataclasses import dataclass

import numpy as np

from planner.errors import InputIssue
from planner.model.architecture import AttentionKind, ModelArch
from planner.precision import FlopsFormat, Precision, bytes_per_value

__all__ = ["Layout", "Precisions", "layout_issues", "quantization_issues", "stage_of_layer"]


@dataclass(frozen=True, order=True)
class Layout:
    """How one replica is split over accelerators.

    Each of `pp` pipeline stages holds `tp * dp_attn` accelerators. Attention (and every dense
    weight) is tensor-parallel over `tp` and replicated over `dp_attn` data-parallel attention ranks,
    each serving its own share of the batch. Routed experts are spread over `ep` expert-parallel
    ranks of `expert_tp = tp * dp_attn / ep` accelerators each (tensor-parallel inside an expert).
    """

    tp: int = 1
    ep: int = 1
    pp: int = 1
    dp_attn: int = 1

    @property
    def stage_size(self) -> int:
        return self.tp * self.dp_attn

    @property
    def expert_tp(self) -> int:
        return self.stage_size // self.ep

    @property
    def n_accelerators(self) -> int:
        return self.stage_size * self.pp

    @property
    def name(self) -> str:
        """"TP1 x DPattn8 x EP8": the degrees that are not 1. Where attention and the experts are split
        differently (attention data parallelism, or expert parallelism), the expert split is named
        in full: EP, and ETP where each expert is also cut across ranks (stage / EP > 1)."""
        parts = [f"TP{self.tp}"]
        if self.dp_attn > 1:
            parts.append(f"DPattn{self.dp_attn}")
        if self.ep > 1 or self.dp_attn > 1:
            parts.append(f"EP{self.ep}")
            if self.expert_tp > 1:
                parts.append(f"ETP{self.expert_tp}")
        if self.pp > 1:
            parts.append(f"PP{self.pp}")
        return " x ".join(parts)

    def describe(self) -> str:
        return f"{self.name} = {self.n_accelerators} accelerator{'s' if self.n_accelerators > 1 else ''}"

    @staticmethod
    def with_default_dp_attn(tp: int, ep: int, pp: int) -> "Layout":
        """Attention data-parallel ranks that make the stage as wide as the expert-parallel group."""
        return Layout(tp=tp, ep=ep, pp=pp, dp_attn=ep // tp if ep > tp and ep % tp == 0 else 1)


@dataclass(frozen=True)
class Precisions:
    """Storage formats and the tensor-core format matmuls run in."""

    weights: Precision
    kv_cache: Precision
    activations: Precision
    compute: FlopsFormat
    expert_weights: Precision | None = None  # default: same as weights

    def __post_init__(self) -> None:
        if self.expert_weights == self.weights:  # one record per choice of formats: experts in the weights' format are the default
            object.__setattr__(self, "expert_weights", None)

    @property
    def weight_bytes(self) -> float:
        return bytes_per_value(self.weights)

    @property
    def expert_weight_bytes(self) -> float:
        return bytes_per_value(self.expert_weights or self.weights)

    @property
    def kv_bytes(self) -> float:
        return bytes_per_value(self.kv_cache)

    @property
    def activation_bytes(self) -> float:
        return bytes_per_value(self.activations)


def layout_issues(arch: ModelArch, layout: Layout, batch_per_replica: int, field: str = "layout",
                  redundant_experts: int = 0) -> list[InputIssue]:
    """Every reason `layout` cannot serve `arch` with this batch (empty list: the layout is valid)."""
    issues = []
    att = arch.attention
    for name in ("tp", "ep", "pp", "dp_attn"):
        if getattr(layout, name) < 1:
            issues.append(InputIssue(f"{field}.{name}", "must be at least 1", f"set {name} to 1 or more"))
    if issues:
        return issues
    if att.n_heads % layout.tp:
        issues.append(InputIssue(f"{field}.tp", f"{arch.id} has {att.n_heads} attention heads, not divisible by tp={layout.tp}",
                                 "use a tp that divides the head count"))
    if att.kind is AttentionKind.GQA and att.n_kv_heads % layout.tp and layout.tp % att.n_kv_heads:
        issues.append(InputIssue(f"{field}.tp", f"tp={layout.tp} neither divides nor is a multiple of the {att.n_kv_heads} KV heads",
                                 "use a tp that divides the KV-head count, or a multiple of it"))
    if not arch.is_moe:
        if layout.ep > 1:
            issues.append(InputIssue(f"{field}.ep", f"{arch.id} is dense: it has no experts to spread", "use ep=1"))
        if layout.dp_attn > 1:
            issues.append(InputIssue(f"{field}.dp_attn", "attention data parallelism only pays for MoE models",
                                     "use dp_attn=1 and more replicas instead"))
    else:
        slots = arch.moe.n_routed_experts + redundant_experts
        if slots % layout.ep:
            spare = -slots % layout.ep
            issues.append(InputIssue(f"{field}.ep", f"{slots} expert slots do not split evenly over ep={layout.ep}",
                                     f"use an ep that divides the expert count, or add {spare} redundant experts "
                                     f"({arch.moe.n_routed_experts + redundant_experts + spare} slots, "
                                     f"{(slots + spare) // layout.ep} per rank)"))
        if layout.stage_size % layout.ep:
            issues.append(InputIssue(f"{field}.ep", f"ep={layout.ep} does not divide the stage's {layout.stage_size} accelerators (tp x dp_attn)",
                                     "make tp * dp_attn a multiple of ep"))
    if layout.pp > arch.n_layers:
        issues.append(InputIssue(f"{field}.pp", f"pp={layout.pp} exceeds the {arch.n_layers} layers", "use at most one stage per layer"))
    if batch_per_replica < 1:
        issues.append(InputIssue(f"{field}.batch", "batch must be at least 1", "use a positive batch"))
    elif batch_per_replica % (layout.pp * layout.dp_attn):
        issues.append(InputIssue(f"{field}.batch", f"batch {batch_per_replica} does not split into pp x dp_attn = "
                                 f"{layout.pp * layout.dp_attn} equal micro-batches",
                                 f"use a multiple of {layout.pp * layout.dp_attn}"))
    return issues


def quantization_issues(arch: ModelArch, layout: Layout, precisions: Precisions, field: str = "layout") -> list[InputIssue]:
    """Shards that block-quantised fp8 weights cannot be cut into: every tensor-parallel slice of an
    fp8 checkpoint with square scaling blocks must hold whole blocks (the engines refuse others)."""
    block = arch.fp8_block_size
    if not block:
        return []
    issues = []
    checks = [("tp", layout.tp, arch.dense_intermediate_size, "dense MLP", precisions.weights)]
    if arch.is_moe:
        checks.append(("expert_tp", layout.expert_tp, arch.moe.expert_intermediate_size, "expert MLP",
                       precisions.expert_weights or precisions.weights))
    for name, ways, width, what, weights in checks:
        if weights is not Precision.FP8 or not width or ways == 1:
            continue
        if width % ways or (width // ways) % block:
            issues.append(InputIssue(f"{field}.{name}", f"the {what} width {width} split {ways} ways is not a whole number of "
                                     f"{block}-wide fp8 scaling blocks", f"shard it into at most {width // block} slices of whole blocks "
                                     f"({name} = {ways} now; expert_tp = tp x dp_attn / ep), or use bf16 weights"))
    return issues


def stage_of_layer(n_layers: int, pp: int) -> np.ndarray:
    """Pipeline stage of every layer: contiguous ranges, the first n_layers % pp stages one longer."""
    sizes = [n_layers // pp + (1 if s < n_layers % pp else 0) for s in range(pp)]
    return np.repeat(np.arange(pp), sizes)
