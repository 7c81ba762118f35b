"""trtllm-bench's own max_batch_size and max_num_tokens, for the fidelity rows it measured.

TensorRT-LLM's perf overview ran `trtllm-bench --tp T --pp P [--ep E] --model M throughput --dataset D --backend
pytorch --extra_llm_api_options Y` with neither --max_batch_size nor --max_num_tokens (docs/source/developer-guide/
perf-overview.md, "Reproducing Benchmarked Results", stored revision 03e27c7d). trtllm-bench then sets both itself. The
rule, as read in github.com/NVIDIA/TensorRT-LLM (our code; the facts carry their file, function and revision):

- tensorrt_llm/bench/benchmark/utils/general.py `get_settings` (revisions 0171265e and c0b2ee6e, same rule): without
  both user limits it calls `get_benchmark_engine_settings(bench ModelConfig, the checkpoint's quant config, --tp, --pp,
  dataset mean ISL, mean OSL, --kv_cache_free_gpu_mem_fraction)`; unless the llm_options.yml sets
  enable_chunked_prefill (no perf-overview one does) it then raises max_num_tokens to at least max ISL + max_batch_size.
  (The runtime's own chunking switch differs by revision: throughput.py 000a01de has --enable_chunked_context, default
  off; 56851033 has --enable_chunked_context/--disable_chunked_context, default on. get_settings reads neither, so the
  floor holds in both, and with it a whole prompt fits one step's budget.)
- tensorrt_llm/bench/build/build.py `get_benchmark_engine_settings` (000a01de, 7eb710fa): `calc_engine_setting` for the quant
  algorithms in TUNED_QUANTS = {NVFP4, FP8, FP8_BLOCK_SCALES, NO_QUANT, None}; any other (gpt-oss's MXFP4 checkpoints
  load as W4A16_MXFP4 on Hopper and W4A8_MXFP4_* on Blackwell, _torch/model_config.py `get_mxfp4_quant_algo`, 1a0dc5f7) gets
  BuildConfig's defaults, max_batch_size 2048 and max_num_tokens 8192 (tensorrt_llm/builder.py BuildConfig, 008b2b8d).
- tensorrt_llm/bench/build/tuning.py `calc_engine_setting` and `finetune_setting` (04cba882 and a7e572fb, and two
  earlier stored versions; the same rule for models without Mamba layers in all four): bytes per element by quant algo (NO_QUANT 2, FP8 and FP8_BLOCK_SCALES 1, NVFP4 0.5,
  anything else 2) for weights and for the KV cache; KV GiB per token = 2 x attention layers x max(tp, KV heads) x
  head_size x KV bytes / 2^30; engine GiB = param_count x weight bytes / 2^30; requests = (device GiB x tp x pp - engine)
  x fraction / (KV GiB per token x (ISL + OSL)); finetune: raw = min(requests, 4096) / pp, tokens = min(raw x (1 + ISL /
  OSL), 32768); batch rounded up to 32 (at least 64) below 256, to 128 below 1024, else to 256; tokens rounded up to 256
  (at least 2048) below 4096, to 512 below 8192, else to 1024.
- tensorrt_llm/bench/build/dataclasses.py `ModelConfig` (04cba882 and 89fd9b74): from the checkpoint's config.json,
  num_attention_layers = num_hidden_layers, num_key_value_heads (or num_attention_heads when absent), head_size =
  head_size / head_dim / attention_head_dim / text_config.head_dim, else hidden_size // num_attention_heads;
  param_count = the sum of the checkpoint's safetensors parameter counts (stored elements: a packed NVFP4 byte holding
  two values counts once).
- tensorrt_llm/bench/build/utils.py `get_device_memory` (7ed07f06): NVML's total memory of GPU 0 / 2^30 (GiB).
- tensorrt_llm/bench/benchmark/throughput.py (000a01de, 56851033): --kv_cache_free_gpu_mem_fraction defaults to 0.90.
  The perf overview says it often ran 0.95 instead ("In many cases, we also use a higher KV cache percentage by setting
  --kv_cache_free_gpu_mem_fraction 0.95 ... We fall back to 0.90 or lower if out-of-memory errors are encountered");
  a row does not say which, so the default is taken and `python benchmarks/trtllm_bench_rule.py` prints both.

How the planner's layout maps onto it: DEP-n columns (attention data parallel + expert parallel) run `--tp n --ep n`
with `enable_attention_dp: true`, so tp_size is the planner's tp x dp_attn; with attention DP each rank schedules its
own requests, and max_batch_size holds per rank ("--max_batch_size: Max batch size in each rank", TensorRT-LLM's
DeepSeek-R1 best-practice guides), so a replica holds at most max_batch_size x dp_attn x pp sequences (PP: one
micro-batch of up to max_batch_size per stage; `finetune_setting` divides the requests by pp for that reason; no
perf-overview row uses pp > 1). max_num_tokens is the per-rank token budget of one step.

Usage: python benchmarks/trtllm_bench_rule.py [--published CSV[,CSV]]   (each rule-mapped row at both fractions)
"""

import argparse
import csv
import functools
import math
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from planner.hardware.catalog import load_hardware_catalog
from planner.model.architecture import (
    AttentionKind,
    ModelArch,
    layer_params,
    param_counts,
)
from planner.model.catalog import load_model_catalog
from planner.units import GIB

RULE = "trtllm-bench"  # the value of a row's planner_batch_rule column that asks for this rule
KV_FRACTION_DEFAULT = 0.90  # throughput.py --kv_cache_free_gpu_mem_fraction default
KV_FRACTION_OFTEN = 0.95  # what the perf overview says it used "in many cases"

# tuning.py BYTES_PER_ELEM, keyed by the planner's precision names (fp8 covers FP8 and FP8_BLOCK_SCALES; bf16 is
# NO_QUANT or no quant config); build.py TUNED_QUANTS is exactly these algorithms.
BYTES_PER_ELEMENT = {"bf16": 2.0, "fp8": 1.0, "nvfp4": 0.5}
UNLISTED_BYTES_PER_ELEMENT = 2.0  # BYTES_PER_ELEM.get(algo, 2)
UNTUNED_MAX_BATCH_SIZE = 2048  # BuildConfig.max_batch_size
UNTUNED_MAX_NUM_TOKENS = 8192  # BuildConfig.max_num_tokens
MAX_REQUESTS = 4096  # finetune_setting: "Cap total batch size to avoid decoder buffer size becoming too large"
MAX_TOKENS = 32768  # finetune_setting: "Cap num tokens to avoid TRT activation buffer becoming too large"
# finetune_setting's rounding: (below this raw value, round up to a multiple of this), last row for the rest
BATCH_STEPS = ((256, 32), (1024, 128), (math.inf, 256))
MIN_BATCH = 64
TOKEN_STEPS = ((4096, 256), (8192, 512), (math.inf, 1024))
MIN_TOKENS = 2048

NVFP4_ELEMENTS_PER_VALUE = 0.5 + 1 / 16  # safetensors elements per weight: a U8 holds two FP4 values, one FP8 scale per 16

# MLA checkpoints' config.json: num_key_value_heads is given and head_dim is not, so trtllm-bench sees num_key_value_heads
# heads of hidden_size // num_attention_heads values (56 for DeepSeek-V3/R1). Source: deepseek-ai/DeepSeek-V3 config.json
# (num_key_value_heads 128, num_nextn_predict_layers 1, no head_dim; DeepSeek-R1 and -0528 carry the same
# architecture). It is read through the checkpoint's own configuration_deepseek.py (auto_map, trust_remote_code=True),
# which sets no head_dim; transformers' built-in DeepseekV3Config would set head_dim = qk_rope_head_dim = 64 instead.
MLA_CONFIG = {"deepseek-r1": {"num_key_value_heads": 128, "num_nextn_predict_layers": 1},
              "deepseek-v3": {"num_key_value_heads": 128, "num_nextn_predict_layers": 1}}


@dataclass(frozen=True)
class Checkpoint:
    """The checkpoint a row ran and how its weights are stored: `nvfp4_parts` names the parts stored as packed NVFP4
    ("routed" experts, "mlp" = dense MLPs and shared experts, "attention" projections, "attention_output" alone);
    everything else is one element per weight (FP8 or BF16). `fp8_block`: FP8 weights with one FP32 scale per block of
    fp8_block x fp8_block values (config.json quantization_config.weight_block_size), else per-tensor scales (a few
    scalars per layer, left out). `published` is the checkpoint's parameter count as listed, where found: the check."""

    repo: str
    nvfp4_parts: tuple[str, ...] = ()
    published: str = ""
    fp8_block: int = 0


# The perf overview's checkpoints ("FP4 Models", "FP8 Models" lists of perf-overview.md 03e27c7d). Which parts an NVFP4
# checkpoint quantizes: DeepSeek's from its model card ("Compared to nvidia/DeepSeek-R1-0528-FP4, this checkpoint
# additionally quantizes the wo module in attention layers": experts, dense MLPs and wo; its MTP module stays 8-bit),
# which reproduces the published 393.6B; the others as TensorRT Model Optimizer quantizes by default (every linear layer
# of the decoder but the routers), which reproduces Llama's 41B. Whether Qwen3's and Maverick's attention is quantized
# changes no row's rule (checked by hand: their requests sit away from the rounding steps).
CHECKPOINTS = {
    ("deepseek-r1", "fp8"): Checkpoint("deepseek-ai/DeepSeek-R1-0528", (), "685B (Hugging Face; 671B + 14B MTP module)",
                                       fp8_block=128),
    ("deepseek-r1", "nvfp4"): Checkpoint("nvidia/DeepSeek-R1-0528-NVFP4-v2", ("routed", "mlp", "attention_output"),
                                         "393.6B (llmrun.dev listing of the checkpoint)"),
    ("llama-3.3-70b", "fp8"): Checkpoint("nvidia/Llama-3.3-70B-Instruct-FP8", (), "71B (Hugging Face listing)"),
    ("llama-3.3-70b", "nvfp4"): Checkpoint("nvidia/Llama-3.3-70B-Instruct-FP4", ("attention", "mlp"),
                                           "41B (Hugging Face listing of nvidia/Llama-3.3-70B-Instruct-NVFP4)"),
    ("qwen3-235b-a22b", "fp8"): Checkpoint("nvidia/Qwen3-235B-A22B-FP8"),
    ("qwen3-235b-a22b", "nvfp4"): Checkpoint("nvidia/Qwen3-235B-A22B-FP4", ("attention", "routed")),
    ("qwen3-30b-a3b", "nvfp4"): Checkpoint("nvidia/Qwen3-30B-A3B-FP4", ("attention", "routed")),
    # text model only: the checkpoints' vision encoder (about 1B elements) is not in the catalog; no row's rule moves
    ("llama-4-maverick", "fp8"): Checkpoint("nvidia/Llama-4-Maverick-17B-128E-Instruct-FP8"),
    ("llama-4-maverick", "nvfp4"): Checkpoint("nvidia/Llama-4-Maverick-17B-128E-Instruct-NVFP4", ("attention", "routed", "mlp")),
}


@dataclass(frozen=True)
class BenchSettings:
    """What trtllm-bench runs with: `max_batch_size` per attention rank and `max_num_tokens` per step and rank;
    `requests` is the KV-limited request count its heuristic rounds (None where it uses the defaults)."""

    max_batch_size: int
    max_num_tokens: int
    requests: float | None
    tuned: bool


@functools.cache
def _catalogs():
    return load_model_catalog(), load_hardware_catalog()


def _mtp_elements(arch: ModelArch) -> tuple[float, float]:
    """DeepSeek's multi-token-prediction module, stored in the checkpoint beside the model (the 14B of 685B): one MoE
    decoder layer plus its own embed_tokens and shared_head.head (vocab x hidden each), eh_proj (2 hidden x hidden) and
    three norms (enorm, hnorm, shared_head.norm), per config.json num_nextn_predict_layers. (all, its linear layers)"""
    n = MLA_CONFIG.get(arch.id, {}).get("num_nextn_predict_layers", 0)
    lp = layer_params(arch)
    moe_layer = float(lp.dense[-1] + lp.routed_total[-1])
    h = arch.hidden_size
    return n * (moe_layer + 2 * arch.vocab_size * h + 2 * h * h + 3 * h), n * (moe_layer + 2 * h * h)


def checkpoint_elements(arch: ModelArch, weights_precision: str) -> float:
    """param_count as trtllm-bench reads it: the safetensors elements of the row's checkpoint."""
    ckpt = CHECKPOINTS[(arch.id, weights_precision)]
    pc, lp = param_counts(arch), layer_params(arch)
    h = arch.hidden_size
    routers = arch.moe.n_routed_experts * h * arch.n_moe_layers if arch.moe else 0
    att = arch.attention
    per_head = att.v_head_dim if att.kind is AttentionKind.MLA else att.head_dim
    parts = {"routed": pc.layers_routed_total,
             "mlp": float(lp.dense.sum() - lp.attention.sum()) - 2 * h * arch.n_layers - routers,
             "attention": float(lp.attention.sum()),
             "attention_output": float(att.n_heads * per_head * h * arch.n_layers)}
    packed = sum(parts[p] for p in ckpt.nvfp4_parts)
    mtp, mtp_linear = _mtp_elements(arch)
    block_scales = (parts["routed"] + parts["mlp"] + parts["attention"] + mtp_linear) / ckpt.fp8_block**2 if ckpt.fp8_block else 0.0
    return pc.total + mtp + block_scales - packed * (1 - NVFP4_ELEMENTS_PER_VALUE)


def kv_view(arch: ModelArch) -> tuple[int, int, int]:
    """(num_attention_layers, num_key_value_heads, head_size) as trtllm-bench's ModelConfig reads config.json. For the
    catalog's GQA models config.json's head_dim (or hidden / heads where it has none) is the catalog's head_dim."""
    att = arch.attention
    if att.kind is AttentionKind.MLA:
        if arch.id not in MLA_CONFIG:
            raise KeyError(f"{arch.id}: no config.json facts for trtllm-bench's view of its MLA cache")
        return arch.n_layers, MLA_CONFIG[arch.id]["num_key_value_heads"], arch.hidden_size // att.n_heads
    return arch.n_layers, att.n_kv_heads, att.head_dim


def _round_up(value: float, steps: tuple[tuple[float, int], ...]) -> int:
    step = next(s for limit, s in steps if value < limit)
    return step * math.ceil(value / step)


def finetune(requests: float, isl: int, osl: int, pp: int) -> tuple[int, int]:
    """tuning.py finetune_setting (optimistic tuning, the non-Mamba path): (max_batch_size, max_num_tokens)."""
    raw_batch = min(requests, MAX_REQUESTS) / pp
    raw_tokens = min(raw_batch * (1 + isl / osl), MAX_TOKENS)
    return max(MIN_BATCH, _round_up(raw_batch, BATCH_STEPS)), max(MIN_TOKENS, _round_up(raw_tokens, TOKEN_STEPS))


def engine_settings(arch: ModelArch, device_bytes: float, weights_precision: str, kv_precision: str, tp_size: int,
                    pp_size: int, isl: int, osl: int, kv_fraction: float = KV_FRACTION_DEFAULT) -> BenchSettings:
    """get_settings -> get_benchmark_engine_settings -> calc_engine_setting, then the no-chunking floor on the tokens.
    `device_bytes`: one GPU's total memory as NVML reports it; `tp_size`: trtllm-bench's --tp (GPUs per stage)."""
    if weights_precision not in BYTES_PER_ELEMENT:
        batch, tokens, requests = UNTUNED_MAX_BATCH_SIZE, UNTUNED_MAX_NUM_TOKENS, None
    else:
        layers, kv_heads, head_size = kv_view(arch)
        kv_bytes = BYTES_PER_ELEMENT.get(kv_precision, UNLISTED_BYTES_PER_ELEMENT)
        kv_gib_per_token = 2 * layers * max(tp_size, kv_heads) * head_size * kv_bytes / GIB
        engine_gib = checkpoint_elements(arch, weights_precision) * BYTES_PER_ELEMENT[weights_precision] / GIB
        memory_gib = device_bytes / GIB * tp_size * pp_size
        requests = (memory_gib - engine_gib) * kv_fraction / (kv_gib_per_token * (isl + osl))
        if requests < 1:
            raise ValueError(f"{arch.id}: trtllm-bench finds no room for one request ({requests:.2f})")
        batch, tokens = finetune(requests, isl, osl, pp_size)
    return BenchSettings(batch, max(tokens, isl + batch), requests, requests is not None)


def settings_for_row(row: dict, kv_fraction: float = KV_FRACTION_DEFAULT) -> BenchSettings:
    """The rule for a fidelity row (its planner_* columns): the model and GPU from the planner's catalogs."""
    models, hardware = _catalogs()
    arch = models[row["planner_model"]]
    device_bytes = hardware.racks[row["planner_rack"]].accelerator.hbm_capacity_bytes  # nvidia-smi's MiB where known
    tp_size = int(row["planner_tp"]) * int(row["planner_dp_attn"])
    weights = row["planner_weights_precision"] or str(arch.native_expert_weights_precision or arch.native_weights_precision)  # empty: the checkpoint's
    return engine_settings(arch, device_bytes, weights, row["planner_kv_precision"], tp_size,
                           int(row["planner_pp"]), int(row["planner_isl"]), int(row["planner_osl"]), kv_fraction)


def replica_batch_limit(row: dict, settings: BenchSettings) -> int:
    """Sequences a replica holds at most under the rule: max_batch_size on each attention rank and stage."""
    return settings.max_batch_size * int(row["planner_dp_attn"]) * int(row["planner_pp"])


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--published", default=f"{here / 'published.csv'},{here / 'published_perf_overview.csv'}")
    args = parser.parse_args(argv)
    print(f"{'id':<40} {'GPUs':>4} {'requests':>9} {'batch/rank':>10} {'tokens':>6} | at {KV_FRACTION_OFTEN}: "
          f"{'requests':>9} {'batch/rank':>10} {'tokens':>6}")
    for path in args.published.split(","):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("planner_batch_rule") != RULE:
                    continue
                one, often = settings_for_row(row), settings_for_row(row, KV_FRACTION_OFTEN)
                gpus = int(row["planner_tp"]) * int(row["planner_dp_attn"]) * int(row["planner_pp"])
                req = ["default" if s.requests is None else f"{s.requests:.1f}" for s in (one, often)]
                moved = "" if (one.max_batch_size, one.max_num_tokens) == (often.max_batch_size, often.max_num_tokens) else "  *"
                print(f"{row['id']:<40} {gpus:>4} {req[0]:>9} {one.max_batch_size:>10} {one.max_num_tokens:>6} | "
                      f"{'':>8}{req[1]:>9} {often.max_batch_size:>10} {often.max_num_tokens:>6}{moved}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
