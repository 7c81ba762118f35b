"""The shapes a probe measures, per kernel class, from the models it is given: every dense GEMM of a
forward pass per tensor-parallel rank (the step model's own list, physics/stages.py) over a range of
token counts, the routed experts over a range of tokens per expert, decode and prefill attention at
each model's heads per rank, elementwise work at its widths; then HBM copies and collectives over a
range of sizes. A class none of the models has (MLA, experts) is measured at a reference model's
shapes, so that every class is measured. Each class's list is ordered coarse to fine, so a time
budget that stops a class early still covers its whole range. `--smoke` shrinks every width and
count to a few values that run on a CPU in seconds."""

from collections.abc import Iterable
from dataclasses import dataclass

from planner.model.architecture import AttentionKind, ModelArch
from planner.physics.memory import kv_shard_fraction
from planner.physics.stages import gemm_shapes

__all__ = ["CLASSES", "Plan", "coarse_to_fine", "plan_shapes"]

CLASSES = ("gemm", "moe", "attention_decode", "attention_prefill", "mla_decode", "mla_prefill", "elementwise", "hbm", "collectives",
           "decode_step")
TENSOR_PARALLEL = (1, 2, 4, 8)
GEMM_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
TOKENS_PER_EXPERT = (0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
MOE_DECODE_TOKENS = (1, 2)  # and these tokens entering a layer, below 1/8 per expert for large expert counts (decode at batch 1-2)
DECODE_BATCH = (1, 4, 16, 64, 256)
DECODE_KV_TOKENS = (256, 1024, 4096, 16384, 65536)
PREFILL_TOKENS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
ELEMENTWISE_TOKENS = (1, 8, 64, 512, 4096, 16384)
HBM_BYTES = tuple(2**e for e in range(20, 33))  # 1 MiB .. 4 GiB
COLLECTIVE_ELEMENTS = tuple(2**e for e in range(10, 29, 2))
EXPERT_WEIGHT_CAP_BYTES = 4 * 2**30  # an expert-parallel degree is chosen so a rank's experts stay under this
MOE_TENSOR_PARALLEL = (1, 8)  # experts whole (split over ranks by EP), and split 8 ways inside (TP 8 without EP)
# The expert class's floor: layers this narrow, one expert per rank, at these token counts, do no work
# worth counting, so their time is the kernels' launch floor, measured first. (The engines' tables
# have such shapes too, e.g. aiconfigurator's H100 vLLM table at EP 256: 0.06 us of work in 33 us.)
MOE_FLOOR_WIDTH = 128
MOE_FLOOR_TOKENS = (1, 2, 4)
KV_CAP_BYTES = 16 * 2**30  # decode shapes whose KV cache would exceed this are left out
MLA_LATENT, MLA_ROPE = 512, 64  # DeepSeek's cached latent and shared rope key per token (576 values)
MLA_QK, MLA_V = 192, 128  # DeepSeek's prefill query/key and value head dims
BF16_BYTES = 2
REFERENCE_MODELS = {"mla": "deepseek-v3", "gqa": "llama-3.1-8b"}  # MLA and routed experts, GQA, when no model given has them

STEP_BATCHES = (1, 16, 64)  # a dense model's whole decode step, measured to check the sum of its kernels
STEP_CONTEXTS = (1024, 4096)
STEP_CAP_BYTES = 60 * 2**30  # weights and KV cache of a measured step stay under this (fits an 80 GB GPU)
SMOKE_STEP_LAYERS = 2

SMOKE_DIVISOR = 64  # --smoke: widths divided by this (at least SMOKE_MIN_WIDTH)...
SMOKE_MIN_WIDTH = 8
SMOKE_ROWS = (1, 2, 4, 8, 16, 32)  # ...and these few token counts, lengths and sizes
SMOKE_LENGTHS = (16, 32, 64, 128)
SMOKE_PREFILL = (8, 16, 32, 64, 96, 128, 192, 256)
SMOKE_BATCH = (1, 2, 4)
SMOKE_BYTES = tuple(2**e for e in range(16, 22))
SMOKE_ELEMENTS = tuple(2**e for e in range(6, 14, 2))


def coarse_to_fine(items: Iterable) -> list:
    """`items` reordered so that every prefix spans the whole list: the ends first, then every
    2^k-th item for falling k."""
    items = list({tuple(sorted(i.items())) if isinstance(i, dict) else i: i for i in items}.values())
    order, seen, step = [], set(), 1
    while step < len(items):
        step *= 2
    for i in [0, len(items) - 1] + [i for s in _halvings(step) for i in range(0, len(items), s)]:
        if 0 <= i < len(items) and i not in seen:
            seen.add(i)
            order.append(items[i])
    return order


def _halvings(step: int) -> list[int]:
    out = []
    while step >= 1:
        out.append(step)
        step //= 2
    return out


@dataclass(frozen=True)
class Plan:
    """Per kernel class, the shapes to measure (dicts of the table's shape columns), coarse to fine."""

    shapes: dict[str, list[dict]]
    models: tuple[str, ...]

    def count(self) -> int:
        return sum(len(v) for v in self.shapes.values())


class _Scale:
    """Full shapes, or --smoke's tiny ones."""

    def __init__(self, smoke: bool):
        self.smoke = smoke

    def width(self, value: float) -> int:
        value = round(value)
        return max(SMOKE_MIN_WIDTH, value // SMOKE_DIVISOR) if self.smoke else value

    def heads(self, value: float) -> int:
        return max(1, round(value) // (16 if self.smoke else 1))

    def pick(self, full: tuple, smoke: tuple) -> tuple:
        return smoke if self.smoke else full


def _gemm(archs: list[ModelArch], s: _Scale) -> list[dict]:
    pairs = sorted({(s.width(g.n), s.width(g.k)) for a in archs for tp in s.pick(TENSOR_PARALLEL, (1, 8))
                    for g in gemm_shapes(a, 1, tp)})
    return coarse_to_fine({"m": m, "n": n, "k": k} for n, k in pairs for m in s.pick(GEMM_ROWS, SMOKE_ROWS))


def _expert_parallel(hidden: int, inter: int, experts: int) -> int:
    """The smallest power-of-two expert-parallel degree whose local bf16 experts fit the weight cap."""
    ep = 1
    while ep < experts and experts / ep * 3 * hidden * inter * BF16_BYTES > EXPERT_WEIGHT_CAP_BYTES:
        ep *= 2
    return ep


def _moe(archs: list[ModelArch], s: _Scale) -> list[dict]:
    """The floor shapes (of the first model's routing), then every model's shapes coarse to fine."""
    rows, floor = [], []
    for a in archs:
        m = a.moe
        hidden, inter, experts = s.width(a.hidden_size), s.width(m.expert_intermediate_size), m.n_routed_experts // (8 if s.smoke else 1)
        experts, topk = max(experts, 2), min(m.experts_per_token, max(experts, 2))
        per_expert = s.pick(TOKENS_PER_EXPERT, (0.5, 1, 2, 4, 8, 16, 32, 64))
        for tp in MOE_TENSOR_PARALLEL:
            ep = _expert_parallel(hidden, inter // tp, experts)
            for tokens in sorted({max(1, round(t * experts / topk)) for t in per_expert} | set(s.pick(MOE_DECODE_TOKENS, ()))):
                rows.append({"num_tokens": tokens, "hidden_size": hidden, "inter_size": inter, "topk": topk, "num_experts": experts,
                             "moe_tp_size": tp, "moe_ep_size": ep})
        width = min(MOE_FLOOR_WIDTH, hidden, inter)
        floor = floor or [{"num_tokens": tokens, "hidden_size": width, "inter_size": width, "topk": topk, "num_experts": experts,
                           "moe_tp_size": 1, "moe_ep_size": experts} for tokens in MOE_FLOOR_TOKENS]
    return floor + coarse_to_fine(rows)


def _gqa_heads(archs: list[ModelArch], s: _Scale) -> list[tuple[int, int, int]]:
    return sorted({(s.heads(a.attention.n_heads / tp), max(1, s.heads(a.attention.n_kv_heads * kv_shard_fraction(a, tp))),
                    a.attention.head_dim // (2 if s.smoke else 1))
                   for a in archs for tp in s.pick(TENSOR_PARALLEL, (1,))})


def _attention(archs: list[ModelArch], s: _Scale) -> tuple[list[dict], list[dict]]:
    decode, prefill = [], []
    for heads, kv_heads, head_dim in _gqa_heads(archs, s):
        head = {"num_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim}
        for batch in s.pick(DECODE_BATCH, SMOKE_BATCH):
            for length in s.pick(DECODE_KV_TOKENS, SMOKE_LENGTHS):
                if batch * length * 2 * kv_heads * head_dim * BF16_BYTES <= KV_CAP_BYTES:
                    decode.append({"batch_size": batch, "isl": length, "step": 0, **head})
        prefill += [{"batch_size": 1, "isl": length, **head} for length in s.pick(PREFILL_TOKENS, SMOKE_PREFILL)]
    return coarse_to_fine(decode), coarse_to_fine(prefill)


def _mla(archs: list[ModelArch], s: _Scale) -> tuple[list[dict], list[dict]]:
    heads = sorted({s.heads(a.attention.n_heads / tp) for a in archs for tp in s.pick(TENSOR_PARALLEL, (1,))})
    latent = MLA_LATENT + MLA_ROPE
    decode = [{"batch_size": b, "isl": n, "step": 0, "num_heads": h} for h in heads for b in s.pick(DECODE_BATCH, SMOKE_BATCH)
              for n in s.pick(DECODE_KV_TOKENS, SMOKE_LENGTHS) if b * n * latent * BF16_BYTES <= KV_CAP_BYTES]
    prefill = [{"batch_size": 1, "isl": n, "num_heads": h} for h in heads for n in s.pick(PREFILL_TOKENS, SMOKE_PREFILL)]
    return coarse_to_fine(decode), coarse_to_fine(prefill)


def _elementwise(archs: list[ModelArch], s: _Scale) -> list[dict]:
    widths = set()
    for a in archs:
        widths.add(("add_norm", s.width(a.hidden_size)))
        inter = a.moe.shared_expert_intermediate_size if a.is_moe and a.moe.n_shared_experts else a.dense_intermediate_size
        if inter:
            widths |= {("activation", s.width(inter / tp)) for tp in s.pick(TENSOR_PARALLEL, (1,))}
    return coarse_to_fine({"op": op, "num_tokens": t, "width": w} for op, w in sorted(widths)
                          for t in s.pick(ELEMENTWISE_TOKENS, SMOKE_ROWS))


def _decode_steps(archs: list[ModelArch], s: _Scale) -> list[dict]:
    """A decode step of each dense, full-attention GQA model whose bf16 weights and KV cache fit
    STEP_CAP_BYTES on one device (the model's dims, then batch and context)."""
    rows = []
    for a in archs:
        if a.is_moe or a.attention.kind is not AttentionKind.GQA or any(w is not None for w in a.layer_window_tokens):
            continue
        att = a.attention
        dims = {"model": a.id, "num_layers": SMOKE_STEP_LAYERS if s.smoke else a.n_layers, "hidden_size": s.width(a.hidden_size),
                "num_heads": s.heads(att.n_heads), "num_key_value_heads": s.heads(att.n_kv_heads), "head_dim": att.head_dim // (2 if s.smoke else 1),
                "inter_size": s.width(a.dense_intermediate_size), "vocab_size": s.width(a.vocab_size)}
        q, kv = dims["num_heads"] * dims["head_dim"], dims["num_key_value_heads"] * dims["head_dim"]
        per_layer = dims["hidden_size"] * (2 * q + 2 * kv + 3 * dims["inter_size"])
        weights = BF16_BYTES * (dims["num_layers"] * per_layer + dims["vocab_size"] * dims["hidden_size"])
        for batch in s.pick(STEP_BATCHES, SMOKE_BATCH):
            for context in s.pick(STEP_CONTEXTS, SMOKE_LENGTHS[:2]):
                if weights + dims["num_layers"] * batch * context * 2 * kv * BF16_BYTES <= STEP_CAP_BYTES:
                    rows.append(dims | {"batch_size": batch, "context": context})
    return rows


def plan_shapes(archs: list[ModelArch], references: dict[str, ModelArch], smoke: bool) -> Plan:
    """Every class's shapes for `archs`; `references["mla"]` stands in for MLA and experts, `references["gqa"]`
    for grouped-query attention, where none of `archs` has them."""
    s = _Scale(smoke)
    mla = [a for a in archs if a.attention.kind is AttentionKind.MLA] or [references["mla"]]
    gqa = [a for a in archs if a.attention.kind is AttentionKind.GQA] or [references["gqa"]]
    moe = [a for a in archs if a.is_moe] or [references["mla"]]
    decode, prefill = _attention(gqa, s)
    mla_decode, mla_prefill = _mla(mla, s)
    shapes = {"gemm": _gemm(archs, s), "moe": _moe(moe, s), "attention_decode": decode, "attention_prefill": prefill,
              "mla_decode": mla_decode, "mla_prefill": mla_prefill, "elementwise": _elementwise(archs, s),
              "hbm": coarse_to_fine({"bytes": b} for b in s.pick(HBM_BYTES, SMOKE_BYTES)),
              "collectives": coarse_to_fine({"message_size": e} for e in s.pick(COLLECTIVE_ELEMENTS, SMOKE_ELEMENTS)),
              "decode_step": _decode_steps(archs or [references["gqa"]], s) or _decode_steps([references["gqa"]], s)}
    return Plan(shapes, tuple(a.id for a in archs))
