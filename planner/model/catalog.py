"""Model catalog: the pydantic `ModelSpec` read from `models/*.yaml` (or inline in a problem), and
its conversion into the frozen `ModelArch` the physics uses."""

import functools
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator

from planner.errors import (
    InputIssue,
    PlannerInputError,
    issues_from_validation_error,
    load_yaml_file,
)
from planner.model.architecture import (
    Attention,
    AttentionKind,
    DraftAcceptance,
    ModelArch,
    MoE,
    PublishedCounts,
)
from planner.modes import EXPERT_ROUTINGS
from planner.paths import data_dir
from planner.precision import Precision
from planner.schema import CatalogId, EdgeModel

__all__ = ["ModelCatalog", "ModelSpec", "arch_from_spec", "load_model_catalog", "load_model_specs"]

PositiveInt = Annotated[int, Field(ge=1)]
# Upper bounds keep a mistyped number from making the planner loop for minutes (10^8 layers did; 10^6 took 6 s):
# each is far beyond every published model (deepest: Llama 3.1 405B, 126 layers; widest: its 16,384 hidden
# and 53,248 FFN; most experts: Kimi K2, 384; largest vocabulary: Gemma 3, 262,144; longest context:
# Llama 4 Scout, 10M tokens).
MAX_LAYERS = 10_000
MAX_WIDTH = 1 << 20  # hidden, FFN, expert and head widths
MAX_HEADS = 1 << 14
MAX_EXPERTS = 1 << 12
MAX_VOCAB = 1 << 24
MAX_CONTEXT_TOKENS = 1 << 27
Layers = Annotated[int, Field(ge=1, le=MAX_LAYERS)]
Width = Annotated[int, Field(ge=1, le=MAX_WIDTH)]
Heads = Annotated[int, Field(ge=1, le=MAX_HEADS)]
Experts = Annotated[int, Field(ge=1, le=MAX_EXPERTS)]


class AttentionSpec(EdgeModel):
    """Attention block. `gqa` covers MHA, GQA and MQA; `mla` is DeepSeek's latent attention."""

    kind: Literal["gqa", "mla"] = Field(description="gqa (also MHA and MQA) or mla")
    n_heads: Heads = Field(description="query heads")
    n_kv_heads: Heads | None = Field(default=None, description="key/value heads (gqa)")
    head_dim: Width | None = Field(default=None, description="head dimension (gqa)")
    q_lora_rank: Width | None = Field(default=None, description="query low-rank dimension (mla; null = full rank)")
    kv_lora_rank: Width | None = Field(default=None, description="cached latent dimension (mla)")
    qk_nope_head_dim: Width | None = Field(default=None, description="non-rotary q/k head dim (mla)")
    qk_rope_head_dim: Width | None = Field(default=None, description="rotary q/k head dim, shared key (mla)")
    v_head_dim: Width | None = Field(default=None, description="value head dim (mla)")
    qkv_bias: bool = Field(default=False, description="biases on the q, k, v projections")
    output_bias: bool = Field(default=False, description="bias on the output projection")
    qk_norm: bool = Field(default=False, description="RMSNorm on queries and keys per head")
    sinks: bool = Field(default=False, description="learned attention-sink logits (gpt-oss)")

    @model_validator(mode="after")
    def _complete(self) -> "AttentionSpec":
        if self.kind == "gqa":
            if self.n_kv_heads is None or self.head_dim is None:
                raise ValueError("gqa attention needs n_kv_heads and head_dim\n    fix: add both fields")
            if self.n_heads % self.n_kv_heads:
                raise ValueError(
                    f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}"
                    "\n    fix: query heads are grouped over KV heads; check both numbers"
                )
        else:
            needed = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
            missing = [name for name in needed if getattr(self, name) is None]
            if missing:
                raise ValueError(f"mla attention needs {', '.join(missing)}\n    fix: add them from the model's config.json")
        return self


class MoESpec(EdgeModel):
    """Mixture-of-experts MLP. Layer i is MoE iff i >= first_dense_layers and
    (i - first_dense_layers + 1) % moe_every == 0."""

    n_routed_experts: Experts = Field(description="routed experts per MoE layer")
    experts_per_token: Experts = Field(description="routed experts each token uses (top-k)")
    expert_intermediate_size: Width = Field(description="FFN width of one expert")
    n_shared_experts: int = Field(default=0, ge=0, le=MAX_EXPERTS, description="always-on experts per MoE layer")
    shared_expert_intermediate_size: Width | None = Field(default=None, description="default: expert_intermediate_size")
    first_dense_layers: int = Field(default=0, ge=0, le=MAX_LAYERS, description="leading layers with a dense MLP")
    moe_every: Layers = Field(default=1, description="1 = every layer after the dense ones is MoE; 2 = every other")
    expert_bias: bool = Field(default=False, description="biases on expert projections")
    router_bias: bool = Field(default=False, description="bias on the router")
    expert_groups: Experts = Field(default=1, description="groups the router picks from before choosing experts (config n_group)")
    groups_per_token: Experts = Field(default=1, description="groups a token's experts may come from (config topk_group); "
                                          "with whole groups per node it caps the nodes a token is sent to")
    routing: Literal[EXPERT_ROUTINGS] = Field(  # type: ignore[valid-type]
        default="power_law_1.2",
        description="tokens-per-expert skew of the measured grouped-GEMM tables the calibrated step uses when no expert-load "
                    "profile is given (aiconfigurator's defaults: power_law_1.01 for DeepSeek-family and Llama 4, 1.2 otherwise)")

    @model_validator(mode="after")
    def _top_k(self) -> "MoESpec":
        if self.experts_per_token > self.n_routed_experts:
            raise ValueError(
                f"experts_per_token {self.experts_per_token} exceeds n_routed_experts {self.n_routed_experts}"
                "\n    fix: top-k cannot exceed the number of experts"
            )
        if self.n_routed_experts % self.expert_groups or self.groups_per_token > self.expert_groups:
            raise ValueError(f"{self.expert_groups} expert groups with {self.groups_per_token} per token do not fit "
                             f"{self.n_routed_experts} experts\n    fix: expert_groups must divide n_routed_experts and be >= groups_per_token")
        return self


class WindowSpec(EdgeModel):
    """Sliding-window or chunked local attention. Layer i attends over the full context iff
    global_every > 0 and (i + 1) % global_every == 0; every other layer keeps window_tokens."""

    window_tokens: Annotated[int, Field(ge=1, le=MAX_CONTEXT_TOKENS)] = Field(description="tokens a windowed layer attends to")
    global_every: int = Field(default=0, ge=0, le=MAX_LAYERS, description="0 = every layer is windowed")
    chunked: bool = Field(default=False, description="chunked local attention (Llama 4): a token attends to the tokens of its "
                          "own window_tokens-long chunk, not to the last window_tokens")


class PublishedSpec(EdgeModel):
    total_params: float = Field(gt=0, description="total parameters the authors publish")
    active_params: float = Field(gt=0, description="active parameters per token the authors publish")
    active_includes_input_embedding: bool = Field(description="whether the published active count includes the input embedding")
    source: str = Field(description="where the figures come from")


class MTPSpec(EdgeModel):
    """The model's multi-token-prediction (next-n) modules, which engines run as the draft of
    speculative decoding, and their published acceptance."""

    layers: Layers = Field(description="modules the checkpoint ships (config num_nextn_predict_layers)")
    acceptance_rates: list[Annotated[float, Field(gt=0, le=1)]] | None = Field(
        default=None, min_length=1, max_length=16,
        description="chance that draft token i is accepted given the ones before it were, per position (a published measurement)")
    acceptance_source: str | None = Field(default=None, description="where the acceptance rates come from")

    @model_validator(mode="after")
    def _sourced(self) -> "MTPSpec":
        if self.acceptance_rates is not None and not self.acceptance_source:
            raise ValueError("acceptance_rates need acceptance_source\n    fix: name the measurement they come from")
        return self


class ModelSpec(EdgeModel):
    """A model architecture as written in `models/*.yaml` or inline in a problem file."""

    id: CatalogId = Field(description="lowercase kebab-case id, e.g. llama-3.1-70b")
    name: str = Field(description="display name")
    hf_repo: str | None = Field(default=None, description="Hugging Face repository the architecture is read from")
    model_type: str | None = Field(default=None, description="config.json model_type (llama4, deepseek_v3, ...): the engines' model class, "
                                   "which decides what an export can ask of it")
    serving_repo: str | None = Field(default=None, description="repository exports serve (the instruct or chat model); default hf_repo")
    quantized_repos: dict[Precision, str] = Field(
        default_factory=dict, description="pre-quantized checkpoints by weight format (fp8, nvfp4), so exports need no online quantization")
    trust_remote_code: bool = Field(default=False, description="whether the engines need --trust-remote-code to load it")
    gated: bool = Field(default=False, description="whether Hugging Face gates its repositories (a licence to accept first), so "
                        "that exports require the HF_TOKEN secret")
    n_layers: Layers = Field(description="transformer blocks")
    hidden_size: Width = Field(description="model width d")
    vocab_size: Annotated[int, Field(ge=1, le=MAX_VOCAB)] = Field(description="tokenizer vocabulary")
    tie_word_embeddings: bool = Field(default=False, description="the LM head reuses the input embedding")
    attention: AttentionSpec = Field(description="attention block")
    dense_intermediate_size: Width | None = Field(default=None, description="FFN width of dense layers")
    moe: MoESpec | None = Field(default=None, description="mixture-of-experts MLP (omit for a dense model)")
    attention_window: WindowSpec | None = Field(default=None, description="sliding-window / chunked attention layers")
    max_context_tokens: Annotated[int, Field(ge=1, le=MAX_CONTEXT_TOKENS)] = Field(description="longest context the model supports")
    native_weights_precision: Precision = Field(default=Precision.BF16, description="format the weights ship in")
    native_expert_weights_precision: Precision | None = Field(default=None, description="if experts ship in another format")
    fp8_block_size: int = Field(default=0, ge=0, description="weight_block_size of the published fp8 checkpoint's quantization_config "
                                "(128 for DeepSeek-style block scaling; 0 for per-tensor scales or none)")
    published: PublishedSpec | None = Field(default=None, description="the authors' parameter counts, to check ours against")
    mtp: MTPSpec | None = Field(default=None, description="multi-token-prediction modules (speculative decoding's draft); omit for none")
    sources: dict[str, str] = Field(default_factory=dict, description="where the numbers come from")

    @model_validator(mode="after")
    def _consistent(self) -> "ModelSpec":
        has_dense_layers = self.moe is None or self.moe.first_dense_layers > 0 or self.moe.moe_every > 1
        if has_dense_layers and self.dense_intermediate_size is None:
            raise ValueError("the model has dense layers but no dense_intermediate_size\n    fix: add the dense FFN width")
        if self.moe is not None and self.moe.first_dense_layers >= self.n_layers:
            raise ValueError("first_dense_layers covers every layer\n    fix: lower it or drop the moe block")
        return self


def _layer_is_moe(spec: ModelSpec) -> tuple[bool, ...]:
    moe = spec.moe
    if moe is None:
        return (False,) * spec.n_layers
    return tuple(
        i >= moe.first_dense_layers and (i - moe.first_dense_layers + 1) % moe.moe_every == 0 for i in range(spec.n_layers)
    )


def _layer_windows(spec: ModelSpec) -> tuple[int | None, ...]:
    win = spec.attention_window
    if win is None:
        return (None,) * spec.n_layers
    return tuple(
        None if win.global_every and (i + 1) % win.global_every == 0 else win.window_tokens for i in range(spec.n_layers)
    )


def arch_from_spec(spec: ModelSpec) -> ModelArch:
    a = spec.attention
    attention = Attention(
        kind=AttentionKind(a.kind),
        n_heads=a.n_heads,
        n_kv_heads=a.n_kv_heads or 0,
        head_dim=a.head_dim or 0,
        q_lora_rank=a.q_lora_rank,
        kv_lora_rank=a.kv_lora_rank or 0,
        qk_nope_head_dim=a.qk_nope_head_dim or 0,
        qk_rope_head_dim=a.qk_rope_head_dim or 0,
        v_head_dim=a.v_head_dim or 0,
        qkv_bias=a.qkv_bias,
        output_bias=a.output_bias,
        qk_norm=a.qk_norm,
        sinks=a.sinks,
    )
    moe = None
    if spec.moe is not None:
        m = spec.moe
        moe = MoE(
            n_routed_experts=m.n_routed_experts,
            experts_per_token=m.experts_per_token,
            expert_intermediate_size=m.expert_intermediate_size,
            n_shared_experts=m.n_shared_experts,
            shared_expert_intermediate_size=m.shared_expert_intermediate_size or m.expert_intermediate_size,
            expert_bias=m.expert_bias,
            router_bias=m.router_bias,
            routing=m.routing,
            expert_groups=m.expert_groups,
            groups_per_token=m.groups_per_token,
        )
    published = None
    if spec.published is not None:
        p = spec.published
        published = PublishedCounts(p.total_params, p.active_params, p.active_includes_input_embedding, p.source)
    return ModelArch(
        id=spec.id,
        name=spec.name,
        n_layers=spec.n_layers,
        hidden_size=spec.hidden_size,
        vocab_size=spec.vocab_size,
        tie_word_embeddings=spec.tie_word_embeddings,
        attention=attention,
        dense_intermediate_size=spec.dense_intermediate_size or 0,
        moe=moe,
        layer_is_moe=_layer_is_moe(spec),
        layer_window_tokens=_layer_windows(spec),
        window_chunked=bool(spec.attention_window and spec.attention_window.chunked),
        max_context_tokens=spec.max_context_tokens,
        native_weights_precision=spec.native_weights_precision,
        native_expert_weights_precision=spec.native_expert_weights_precision,
        fp8_block_size=spec.fp8_block_size,
        published=published,
        mtp_layers=spec.mtp.layers if spec.mtp else 0,
        mtp_acceptance=DraftAcceptance(tuple(spec.mtp.acceptance_rates), spec.mtp.acceptance_source)
        if spec.mtp and spec.mtp.acceptance_rates else None,
    )


class _ModelFile(EdgeModel):
    models: list[ModelSpec]


class ModelCatalog(dict[str, ModelArch]):
    """Built-in models by id."""


@functools.lru_cache(maxsize=4)
def load_model_specs(directory: Path | None = None) -> dict[str, ModelSpec]:
    """Every model entry of the `*.yaml` files under `directory` (default: the built-in models/), as written."""
    root = directory or data_dir("models")
    specs: dict[str, ModelSpec] = {}
    for path in sorted(root.glob("*.yaml")):
        try:
            parsed = _ModelFile.model_validate(load_yaml_file(path))
        except ValidationError as exc:
            raise PlannerInputError(issues_from_validation_error(exc, model=_ModelFile), source=str(path)) from None
        for spec in parsed.models:
            if spec.id in specs:
                raise PlannerInputError(InputIssue(spec.id, f"model defined twice ({path.name})", "keep one entry"))
            specs[spec.id] = spec
    return specs


@functools.lru_cache(maxsize=4)
def load_model_catalog(directory: Path | None = None) -> ModelCatalog:
    """The architectures of `load_model_specs(directory)` by id."""
    return ModelCatalog({model_id: arch_from_spec(spec) for model_id, spec in load_model_specs(directory).items()})
