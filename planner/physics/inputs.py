"""Everything one replica's evaluation needs: model, rack, layout, batch, lengths, formats, serving
role, prompt cache, engine and step model; and `deployment_inputs`, the one builder of it that the
solver's candidates, the plan checker, `planner estimate` and `planner.evaluate` all call, so that a
deployment is checked (layout, fp8 scaling blocks) and filled in the same way on every path."""

from dataclasses import dataclass

from planner.errors import InputIssue, PlannerInputError
from planner.hardware.catalog import Overheads, RackType
from planner.model.architecture import ModelArch
from planner.modes import Engine, OverlapPolicy, ServingRole, StepModel
from planner.physics.deployment import (
    Layout,
    Precisions,
    layout_issues,
    quantization_issues,
)
from planner.physics.kv_cache import CacheUse
from planner.physics.speculation import Speculation

__all__ = ["DEFAULT_PREFILL_CHUNK_TOKENS", "DeploymentInputs", "ExpertFigures", "ServingOptions", "deployment_inputs", "deployment_issues",
           "expert_slots"]

# Tokens per forward pass: the default per-step token budget of the engines (TensorRT-LLM
# max_num_tokens, SGLang chunked_prefill_size, vLLM max_num_batched_tokens), which also packs
# several short prompts into one prefill pass.
DEFAULT_PREFILL_CHUNK_TOKENS = 8192


def expert_slots(n_experts: int, ep: int, redundant_per_rank: int = 0, redundant_total: int = 0) -> int:
    """Expert slots over an expert-parallel group of `ep` ranks: every expert once plus the redundant
    copies, given per rank or as a total (then experts + total must split evenly over the ranks)."""
    if ep <= 1:
        return n_experts
    return n_experts + (redundant_total if redundant_total else redundant_per_rank * ep)


@dataclass(frozen=True)
class DeploymentInputs:
    """Everything one replica's evaluation needs."""

    arch: ModelArch
    rack: RackType
    layout: Layout
    batch_per_replica: int
    input_tokens: int
    output_tokens: int
    precisions: Precisions
    overheads: Overheads
    overlap: OverlapPolicy = OverlapPolicy.SERIAL
    prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS
    notes: tuple[str, ...] = ()  # extra assumptions to state (precision fall-backs, ...)
    expert_imbalance: float = 1.0  # hottest expert-parallel rank's load over the mean (from the expert placement)
    redundant_experts_per_rank: int = 0  # extra expert copies each expert-parallel rank holds
    role: ServingRole = ServingRole.AGGREGATED
    prefix_cache: CacheUse | None = None  # prompt caching in a KV tier (claim 9)
    engine: Engine = Engine.TRTLLM  # whose kernels and scheduler the calibrated step model follows
    step_model: StepModel = StepModel.CALIBRATED
    redundant_experts: int = 0  # extra expert slots over the whole EP group (SGLang's --ep-num-redundant-experts), instead of per rank
    expert_routing: str | None = None  # grouped-GEMM table's routing skew; None: the model's (balanced when an imbalance is measured)
    # each expert group inside one scale-up domain (engines' default contiguous placement is, when the
    # groups split evenly over the domains); False: a token's experts may sit in any domain
    expert_groups_local: bool = True
    speculative: Speculation | None = None  # speculative decoding with the model's MTP modules as the draft (None: off)

    @property
    def tokens_per_step(self) -> float:
        """Mean output tokens a decode step emits per sequence (1 without speculative decoding)."""
        return self.speculative.tokens_per_step if self.speculative is not None else 1.0

    @property
    def step_queries(self) -> int:
        """Tokens each sequence runs through a decode step of the main model (1 + the draft tokens)."""
        return self.speculative.queries if self.speculative is not None else 1

    @property
    def routing(self) -> str:
        """The tokens-per-expert skew the calibrated expert kernels assume: the one given, else the model's."""
        if self.expert_routing is not None or not self.arch.is_moe:
            return self.expert_routing or "balanced"
        return self.arch.moe.routing

    @property
    def prefilled_tokens(self) -> float:
        """Prompt tokens a request needs computed on average: cache hits skip their prefix."""
        if self.prefix_cache is None:
            return float(self.input_tokens)
        return self.input_tokens - self.prefix_cache.hit_rate * self.prefix_cache.prefix_tokens

    @property
    def expert_slot_factor(self) -> float:
        """Expert weights an accelerator holds relative to an even split without redundant copies."""
        if not self.arch.is_moe or self.layout.ep == 1:
            return 1.0
        experts = self.arch.moe.n_routed_experts
        return expert_slots(experts, self.layout.ep, self.redundant_experts_per_rank, self.redundant_experts) / experts


@dataclass(frozen=True)
class ServingOptions:
    """How the engine runs every replica of a problem (its solver block and engine)."""

    overlap: OverlapPolicy = OverlapPolicy.SERIAL
    prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS
    engine: Engine = Engine.TRTLLM
    step_model: StepModel = StepModel.CALIBRATED


@dataclass(frozen=True)
class ExpertFigures:
    """What a replica's expert placement gives its evaluation (the defaults: an even, contiguous split)."""

    imbalance: float = 1.0  # hottest expert-parallel rank's load over the mean
    redundant_per_rank: int = 0  # extra expert copies each rank holds
    redundant_total: int = 0  # or: extra slots over the whole EP group (which must split evenly over the ranks)
    routing: str | None = None  # the expert kernels' routing skew; None: the model's
    groups_local: bool = True  # each expert group inside one scale-up domain


def deployment_issues(arch: ModelArch, layout: Layout, batch_per_replica: int, precisions: Precisions, field: str = "layout",
                      redundant_experts: int = 0) -> list[InputIssue]:
    """Why this deployment cannot serve (empty: it can): its layout, then the fp8 scaling blocks its shards must hold."""
    issues = layout_issues(arch, layout, batch_per_replica, field=field, redundant_experts=redundant_experts)
    return issues or quantization_issues(arch, layout, precisions, field=field)


def deployment_inputs(arch: ModelArch, rack: RackType, layout: Layout, batch_per_replica: int, lengths: tuple[int, int],
                      precisions: Precisions, overheads: Overheads, serving: ServingOptions = ServingOptions(), *,
                      notes: tuple[str, ...] = (), role: ServingRole = ServingRole.AGGREGATED, prefix_cache: CacheUse | None = None,
                      speculative: Speculation | None = None, experts: ExpertFigures = ExpertFigures(),
                      field: str = "layout") -> DeploymentInputs:
    """The DeploymentInputs of one replica of `arch` on `rack` (`lengths`: input and output tokens per
    request); raises PlannerInputError with every issue (fields under `field`) when it cannot serve."""
    spread = arch.is_moe and layout.ep > 1
    issues = deployment_issues(arch, layout, batch_per_replica, precisions, field, experts.redundant_total if spread else 0)
    if issues:
        raise PlannerInputError(issues)
    return DeploymentInputs(arch, rack, layout, batch_per_replica, lengths[0], lengths[1], precisions, overheads, serving.overlap,
                            serving.prefill_chunk_tokens, notes, experts.imbalance, experts.redundant_per_rank if spread else 0, role,
                            prefix_cache, serving.engine, serving.step_model, experts.redundant_total if spread else 0, experts.routing,
                            experts.groups_local, speculative)
