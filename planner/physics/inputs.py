"""Everything one replica's evaluation needs: model, rack, layout, batch, lengths, formats, serving
role, prompt cache, engine and step model."""

from dataclasses import dataclass

from planner.hardware.catalog import Overheads, RackType
from planner.model.architecture import ModelArch
from planner.modes import Engine, OverlapPolicy, ServingRole, StepModel
from planner.physics.deployment import Layout, Precisions
from planner.physics.kv_cache import CacheUse
from planner.physics.speculation import Speculation

__all__ = ["DEFAULT_PREFILL_CHUNK_TOKENS", "DeploymentInputs", "expert_slots"]

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
