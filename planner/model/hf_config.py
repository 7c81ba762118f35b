"""Import a Hugging Face `config.json` as a `ModelSpec`.

Covers the families in the catalog and their relatives: Llama/Mistral/Qwen dense GQA, MLA with
low-rank queries (DeepSeek-V2/V3, Kimi K2), MoE with shared experts, leading dense layers and
interleaved MoE layers (DeepSeek, GLM-4.5, Llama 4, Qwen3-MoE, Mixtral, gpt-oss), and local
attention (gpt-oss `layer_types`, Mistral `sliding_window`, Llama 4 chunked attention).
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.errors import (
    InputIssue,
    PlannerInputError,
    issues_from_validation_error,
    load_json_file,
)
from planner.model.catalog import ModelSpec

__all__ = ["load_hf_config", "spec_from_hf_config"]

LLAMA4_NO_ROPE_LAYER_INTERVAL = 4  # transformers Llama4TextConfig default: every 4th layer is global (NoPE)
OUTPUT_BIAS_FOLLOWS_ATTENTION_BIAS = {"llama", "mistral", "mixtral", "gpt_oss", "llama4_text", "llama4"}
QKV_BIAS_ALWAYS = {"qwen2", "qwen2_moe"}
QK_NORM_FAMILIES = {"qwen3", "qwen3_moe"}
# Every config.json key this module reads as a number, checked before any arithmetic on it.
NUMBER_KEYS = (
    "num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "intermediate_size",
    "moe_intermediate_size", "intermediate_size_mlp", "shared_expert_intermediate_size", "n_routed_experts",
    "num_local_experts", "num_experts", "num_experts_per_tok", "experts_per_token", "n_shared_experts",
    "first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step", "n_group",
    "topk_group", "sliding_window", "attention_chunk_size", "max_position_embeddings", "num_nextn_predict_layers",
)
LIST_KEYS = ("layer_types", "no_rope_layers", "mlp_only_layers")  # per-layer lists this module iterates over


def _flatten(config: Mapping[str, Any]) -> dict[str, Any]:
    """Multimodal configs (Llama 4) keep the language model under `text_config`."""
    flat = dict(config)
    if isinstance(config.get("text_config"), Mapping):
        flat.update(config["text_config"])
    return flat


def _require(cfg: Mapping[str, Any], key: str, path: str) -> Any:
    if cfg.get(key) is None:
        raise PlannerInputError(InputIssue(f"{path}: {key}", "missing from config.json", "use the model's full config.json"))
    return cfg[key]


def _is_whole(value: Any) -> bool:
    return not isinstance(value, bool) and (isinstance(value, int) or (isinstance(value, float) and value.is_integer()))


def _type_issues(cfg: Mapping[str, Any], path: str) -> list[InputIssue]:
    """A number written as text, a list or a fraction, a list or an object of the wrong kind."""
    issues = [InputIssue(f"{path}: {key}", f"{cfg[key]!r} is not a whole number", "write a whole number without quotes, as published config.json files do")
              for key in NUMBER_KEYS if cfg.get(key) is not None and not _is_whole(cfg[key])]
    issues += [InputIssue(f"{path}: {key}", f"{cfg[key]!r} is not a list", "write one entry per layer, e.g. [1, 1, 1, 0]")
               for key in LIST_KEYS if cfg.get(key) is not None and not isinstance(cfg[key], list)]
    quant = cfg.get("quantization_config")
    if quant is not None and not isinstance(quant, Mapping):
        issues.append(InputIssue(f"{path}: quantization_config", f"{quant!r} is not an object", 'write it as published, e.g. {"quant_method": "fp8"}'))
    elif quant is not None and quant.get("weight_block_size") is not None:
        block = quant["weight_block_size"]
        if not isinstance(block, list) or not block or not all(_is_whole(b) for b in block):
            issues.append(InputIssue(f"{path}: quantization_config.weight_block_size", f"{block!r} is not a list of whole numbers",
                                     "write it as published, e.g. [128, 128]"))
    return issues


def _check_types(cfg: Mapping[str, Any], path: str) -> None:
    """Refuse wrongly typed values before anything divides, compares or iterates over them."""
    issues = _type_issues(cfg, path)
    if cfg.get("num_attention_heads") == 0:
        issues.append(InputIssue(f"{path}: num_attention_heads", "is 0", "a model has at least one attention head"))
    if issues:
        raise PlannerInputError(issues)


def _attention(cfg: dict, model_type: str, path: str) -> dict:
    n_heads = _require(cfg, "num_attention_heads", path)
    if cfg.get("kv_lora_rank"):
        return {
            "kind": "mla",
            "n_heads": n_heads,
            "q_lora_rank": cfg.get("q_lora_rank"),
            "kv_lora_rank": cfg["kv_lora_rank"],
            "qk_nope_head_dim": _require(cfg, "qk_nope_head_dim", path),
            "qk_rope_head_dim": _require(cfg, "qk_rope_head_dim", path),
            "v_head_dim": _require(cfg, "v_head_dim", path),
        }
    attention_bias = bool(cfg.get("attention_bias", False))
    return {
        "kind": "gqa",
        "n_heads": n_heads,
        "n_kv_heads": cfg.get("num_key_value_heads") or n_heads,
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
        "qkv_bias": attention_bias or model_type in QKV_BIAS_ALWAYS,
        "output_bias": attention_bias and model_type in OUTPUT_BIAS_FOLLOWS_ATTENTION_BIAS,
        "qk_norm": model_type in QK_NORM_FAMILIES or (bool(cfg.get("use_qk_norm")) and model_type == "glm4_moe"),
        "sinks": model_type == "gpt_oss",
    }


def _moe(cfg: dict, model_type: str, path: str) -> tuple[dict | None, int | None]:
    """The MoE block and the dense-layer FFN width."""
    n_experts = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts")
    if not n_experts:
        return None, _require(cfg, "intermediate_size", path)
    is_llama4 = model_type.startswith("llama4")
    moe: dict[str, Any] = {
        "n_routed_experts": n_experts,
        "experts_per_token": cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 1,
        "expert_intermediate_size": cfg.get("moe_intermediate_size") or _require(cfg, "intermediate_size", path),
        "n_shared_experts": cfg.get("n_shared_experts") or 0,
        "first_dense_layers": cfg.get("first_k_dense_replace") or 0,
        "moe_every": cfg.get("moe_layer_freq") or cfg.get("decoder_sparse_step") or cfg.get("interleave_moe_layer_step") or 1,
        "expert_bias": model_type == "gpt_oss",
        "router_bias": model_type == "gpt_oss",
        "expert_groups": cfg.get("n_group") or 1,  # DeepSeek's group-limited routing (n_group, topk_group)
        "groups_per_token": cfg.get("topk_group") or 1,
        # aiconfigurator-core's routing-skew defaults: 1.01 for DeepSeek-family and Llama 4, 1.2 for other MoE
        "routing": "power_law_1.01" if model_type.startswith(("deepseek", "kimi", "llama4")) else "power_law_1.2",
    }
    if is_llama4:  # Llama4TextMoe always adds one shared expert as wide as the routed ones
        moe["n_shared_experts"] = 1
    if cfg.get("shared_expert_intermediate_size"):  # Qwen2-MoE style
        moe["n_shared_experts"] = max(moe["n_shared_experts"], 1)
        moe["shared_expert_intermediate_size"] = cfg["shared_expert_intermediate_size"]
    if cfg.get("mlp_only_layers"):
        raise PlannerInputError(
            InputIssue(f"{path}: mlp_only_layers", "an irregular list of dense layers is not supported",
                       "describe the model inline with moe.first_dense_layers / moe_every")
        )
    if is_llama4:
        dense = cfg.get("intermediate_size_mlp")
    elif moe["first_dense_layers"] or moe["moe_every"] > 1:
        dense = cfg.get("intermediate_size")
    else:
        dense = None  # every layer is MoE; `intermediate_size` (if any) is unused
    return moe, dense


def _global_every(flags: list[bool], path: str) -> int:
    """Express a per-layer 'is global' pattern as global iff (i + 1) % g == 0 (0 = none global)."""
    n = len(flags)
    if not any(flags):
        return 0
    for g in range(1, n + 1):
        if all(flags[i] == ((i + 1) % g == 0) for i in range(n)):
            return g
    raise PlannerInputError(
        InputIssue(f"{path}: layer_types", "the pattern of sliding and full layers is not periodic",
                   "describe the model inline with attention_window.global_every")
    )


def _window(cfg: dict, model_type: str, n_layers: int, path: str) -> dict | None:
    if isinstance(cfg.get("layer_types"), list):
        kinds = cfg["layer_types"]
        local = [k in ("sliding_attention", "chunked_attention") for k in kinds]
        if not any(local):
            return None
        window = cfg.get("sliding_window") or cfg.get("attention_chunk_size")
        return {"window_tokens": _require({"w": window}, "w", path + ": sliding_window"), "global_every": _global_every([not x for x in local], path),
                "chunked": "chunked_attention" in kinds}
    if model_type.startswith("llama4") and cfg.get("attention_chunk_size"):
        no_rope = cfg.get("no_rope_layers")  # 1 = RoPE + chunked attention, 0 = NoPE global layer
        flags = [not bool(x) for x in no_rope] if no_rope else [(i + 1) % LLAMA4_NO_ROPE_LAYER_INTERVAL == 0 for i in range(n_layers)]
        return {"window_tokens": cfg["attention_chunk_size"], "global_every": _global_every(flags, path), "chunked": True}
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", True):
        return {"window_tokens": cfg["sliding_window"], "global_every": 0}
    return None


def _native_precisions(cfg: dict) -> dict:
    quant = cfg.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        block = quant.get("weight_block_size") or [0]
        return {"native_weights_precision": "fp8", "fp8_block_size": int(block[0])}
    if method == "mxfp4":
        return {"native_weights_precision": "bf16", "native_expert_weights_precision": "mxfp4"}
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return {"native_weights_precision": "fp16" if dtype == "float16" else "bf16"}


def spec_from_hf_config(config: Mapping[str, Any], model_id: str, name: str | None = None, path: str = "config.json") -> ModelSpec:
    """Build a validated ModelSpec from a Hugging Face config dictionary."""
    cfg = _flatten(config)
    _check_types(cfg, path)
    model_type = str(cfg.get("model_type", ""))
    n_layers = _require(cfg, "num_hidden_layers", path)
    moe, dense = _moe(cfg, model_type, path)
    raw = {
        "id": model_id,
        "name": name or model_id,
        "n_layers": n_layers,
        "hidden_size": _require(cfg, "hidden_size", path),
        "vocab_size": _require(cfg, "vocab_size", path),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "attention": _attention(cfg, model_type, path),
        "dense_intermediate_size": dense,
        "moe": moe,
        "attention_window": _window(cfg, model_type, n_layers, path),
        "max_context_tokens": cfg.get("max_position_embeddings") or 4096,
        "sources": {"architecture": path},
        # auto_map names classes in the repository's own Python files, which engines load only when trusted
        "trust_remote_code": bool(config.get("auto_map")),
        "model_type": str(config.get("model_type") or model_type) or None,
        "mtp": {"layers": cfg["num_nextn_predict_layers"]} if cfg.get("num_nextn_predict_layers") else None,
        **_native_precisions(cfg),
    }
    try:
        return ModelSpec.model_validate(raw)
    except ValidationError as exc:
        raise PlannerInputError(issues_from_validation_error(exc, prefix=path)) from None


def load_hf_config(path: Path, model_id: str | None = None) -> ModelSpec:
    """Read a config.json file; the model id defaults to the file's parent directory or stem."""
    config = load_json_file(path, fix="pass a Hugging Face config.json")
    if not isinstance(config, dict):
        raise PlannerInputError(InputIssue(str(path), "not a config.json (the JSON is not an object)", "pass a Hugging Face config.json"))
    default_id = (path.parent.name if path.stem == "config" else path.stem).lower().replace("_", "-")
    default_id = "".join(ch if ch.isalnum() or ch in ".-" else "-" for ch in default_id).strip("-.") or "imported-model"
    return spec_from_hf_config(config, model_id or default_id, path=str(path))
