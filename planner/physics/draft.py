"""What speculative decoding with the model's own multi-token-prediction (MTP) module costs: the
verifying step, the draft's passes, its prefill over the prompts, its weights and its KV cache
(docs/step-model.md, "Speculative decoding").

The draft is one MTP module (DeepSeek-V3 technical report, section 2.2: a transformer block like the
model's last layer, a projection joining the previous hidden state with the next token's embedding,
and the main model's shared embedding and output head), run on the last pipeline stage with the
stage's tensor, expert and attention-data parallelism. TensorRT-LLM ("MTP Eagle", its default for a
checkpoint with one module), SGLang (EAGLE over the NextN layer) and vLLM (method mtp) all reuse the
one module autoregressively for k > 1 draft tokens, with one KV cache for it. A step of k draft
tokens is then, per sequence:
  - the main model over 1 + k tokens (GEMM rows and collectives x (1 + k); the same KV read once,
    the attention math x (1 + k): `roofline.verified_attention_factor`);
  - the MTP module over the 1 + k verified positions (its first pass, which also drafts token 1);
  - k - 1 more MTP passes of one token each (drafting tokens 2..k).
Prefill runs the module once over every prompt token (its KV cache and the first draft).
"""

import functools
from dataclasses import replace

import numpy as np

from planner.model.architecture import (
    ModelArch,
    kv_bytes_per_request,
    layer_params,
    mtp_module_params,
)
from planner.modes import StepModel
from planner.physics.deployment import Layout, Precisions
from planner.physics.inputs import DeploymentInputs
from planner.physics.memory import weight_bytes_per_accelerator
from planner.physics.prefill import PrefillPass, prefill_pass
from planner.physics.roofline import step_total_s
from planner.physics.stages import stages
from planner.physics.step import decode_terms
from planner.physics.step_parts import StepContext, StepTerms
from planner.precision import FlopsFormat, Precision

__all__ = ["draft_arch", "draft_context", "draft_memory", "draft_precisions", "prefill_with_draft", "speculative_decode_terms",
           "speculative_note"]

DRAFT_EXTRA_GEMMS = 1  # the projection M joining hidden state and embedding, one GEMM per pass
FOUR_BIT = (Precision.FP4, Precision.NVFP4, Precision.MXFP4)


@functools.lru_cache(maxsize=64)  # one object per formats: what the step model keeps per context is kept by identity
def draft_precisions(prec: Precisions) -> Precisions:
    """The formats the MTP module runs in: the plan's, except under 4-bit weights. NVIDIA's FP4
    DeepSeek checkpoints leave the MTP layer unquantized (TensorRT-LLM tech blog 1's precision table:
    "MTP Layers bf16" beside nvfp4 MoE layers; their quantization config excludes model.layers.61*,
    as SGLang's ModelOpt FP4 loader handles), so a 4-bit plan runs its draft in bf16."""
    if prec.weights in FOUR_BIT or prec.expert_weights in FOUR_BIT:
        return replace(prec, weights=Precision.BF16, expert_weights=None, compute=FlopsFormat.BF16)
    return prec


@functools.lru_cache(maxsize=64)  # one object per model, as draft_precisions
def draft_arch(arch: ModelArch) -> ModelArch:
    """The MTP module as a one-layer model of the same width: its block is the model's last layer."""
    return replace(arch, id=f"{arch.id}-mtp", n_layers=1, layer_is_moe=arch.layer_is_moe[-1:],
                   layer_window_tokens=arch.layer_window_tokens[-1:], published=None, mtp_layers=0, mtp_acceptance=None)


def _extra_params(arch: ModelArch) -> float:
    """The module's parameters beyond its transformer block: the projection M and the norms."""
    per_layer = layer_params(arch)
    return mtp_module_params(arch) - float(per_layer.dense[-1] + per_layer.routed_total[-1])


def draft_context(ctx: StepContext) -> StepContext:
    """The step context of the draft module on the last pipeline stage (same links, rates, formats),
    made once per context."""
    return ctx.memo("draft", lambda: _draft_context(ctx))


def _draft_context(ctx: StepContext) -> StepContext:
    inp = ctx.inp
    arch = draft_arch(inp.arch)
    st = stages(arch, 1)
    st = replace(st, dense_params=st.dense_params + _extra_params(inp.arch), gemm_kernels=st.gemm_kernels + DRAFT_EXTRA_GEMMS)
    lay, prec = inp.layout, draft_precisions(inp.precisions)
    accel, fmt = inp.rack.accelerator, prec.compute
    flops = ctx.flops_per_s if fmt == inp.precisions.compute else accel.achievable_flops_per_s(fmt)
    draft_inputs = replace(inp, arch=arch, layout=Layout(lay.tp, lay.ep, 1, lay.dp_attn), precisions=prec, speculative=None)
    return replace(ctx, inp=draft_inputs, st=st, flops_per_s=flops)


def _model(ctx: StepContext) -> StepModel:
    return StepModel.CALIBRATED if ctx.calibrated else StepModel.ROOFLINE


def _scaled(terms: StepTerms, factor: float) -> StepTerms:
    return terms._replace(compute=terms.compute * factor, weights=terms.weights * factor, kv=terms.kv * factor,
                          comm=terms.comm * factor, overhead=terms.overhead * factor)


def _on_last_stage(ctx: StepContext, terms: StepTerms, parts: list[StepTerms]) -> StepTerms:
    """`terms` (n, pp) with the passes `parts` ((n, 1) each, run one after the other) added to the last
    stage. Under the calibrated model the terms add up; the ideal roofline adds them term by term
    too (the bound of the step as if its passes' compute and memory overlapped). The range is the
    time-weighted mean of the parts' ranges."""
    model, overlap = _model(ctx), ctx.inp.overlap
    last = terms.compute.shape[1] - 1
    pieces = [terms] + parts
    totals = [step_total_s(p.compute[:, -1:], p.weights[:, -1:], p.kv[:, -1:], p.comm[:, -1:], overlap, p.overhead[:, -1:], model)
              for p in pieces]
    weight = sum(totals)
    safe = np.where(weight > 0, weight, 1.0)
    low = sum(t * p.low_ratio[:, -1:] for t, p in zip(totals, pieces, strict=True)) / safe
    high = sum(t * p.high_ratio[:, -1:] for t, p in zip(totals, pieces, strict=True)) / safe
    fields = {}
    for name in ("compute", "weights", "kv", "comm", "overhead"):
        column = getattr(terms, name)[:, -1:] + sum(getattr(p, name)[:, -1:] for p in parts)
        fields[name] = np.concatenate([getattr(terms, name)[:, :last], column], axis=1)
    fields["low_ratio"] = np.concatenate([terms.low_ratio[:, :last], np.where(weight > 0, low, 1.0)], axis=1)
    fields["high_ratio"] = np.concatenate([terms.high_ratio[:, :last], np.where(weight > 0, high, 1.0)], axis=1)
    return StepTerms(**fields)


def speculative_decode_terms(ctx: StepContext, batches: np.ndarray, riders: np.ndarray | None = None,
                             own: np.ndarray | None = None) -> tuple[StepTerms, np.ndarray]:
    """`step.decode_terms` of one micro-batch step, with the replica's speculative decoding: the main
    model verifies 1 + k tokens per sequence, and the last stage runs the draft's k passes (the first
    over the 1 + k verified positions and the step's prompt tokens, the others over one token per
    sequence). Without speculation it is `decode_terms` itself."""
    spec = ctx.inp.speculative
    if spec is None or spec.draft_tokens == 0:
        return decode_terms(ctx, batches, riders, own)
    verify, touch = decode_terms(ctx, batches, riders, own, queries=spec.queries)
    dctx = draft_context(ctx)
    micro = np.asarray(batches, dtype=float) / ctx.inp.layout.pp  # one micro-batch's sequences, on the last stage
    first, _ = decode_terms(dctx, micro, riders, own, queries=spec.queries)
    parts = [first]
    if spec.draft_tokens > 1:
        rest, _ = decode_terms(dctx, micro)
        parts.append(_scaled(rest, spec.draft_tokens - 1))
    return _on_last_stage(ctx, verify, parts), touch


def prefill_with_draft(ctx: StepContext, prompts_per_rank) -> PrefillPass:
    """`prefill.prefill_pass`, with the draft module run over the same prompt tokens on the last
    stage when the replica loads it."""
    pf = prefill_pass(ctx, prompts_per_rank)
    if ctx.inp.speculative is None:
        return pf
    draft = prefill_pass(draft_context(ctx), prompts_per_rank)
    attention = pf.attention_s.copy()
    attention[:, -1:] += draft.attention_s
    return replace(pf, step_terms=lambda: _on_last_stage(ctx, pf.terms, [draft.terms]), attention_s=attention)


def draft_memory(inp: DeploymentInputs, context_tokens: float) -> tuple[float, float]:
    """HBM the draft module adds on an accelerator of the last stage: its weights (spread like a
    layer of the model; its embedding and head are shared), and the KV one sequence of
    `context_tokens` holds in its layer. (0, 0) without it."""
    if inp.speculative is None:
        return 0.0, 0.0
    arch, lay, prec = inp.arch, inp.layout, draft_precisions(inp.precisions)
    per_layer = layer_params(arch)
    routed = float(per_layer.routed_total[-1])
    dense = mtp_module_params(arch) - routed
    weights = float(weight_bytes_per_accelerator(dense, routed * inp.expert_slot_factor, lay.tp, lay.stage_size,
                                                 prec.weight_bytes, prec.expert_weight_bytes))
    kv = kv_bytes_per_request(draft_arch(arch), context_tokens, inp.precisions.kv_bytes)
    return weights, kv


def speculative_note(inp: DeploymentInputs) -> str | None:
    """The assumption an estimate states for its speculative decoding (None without it)."""
    spec = inp.speculative
    if spec is None:
        return None
    if spec.draft_tokens == 0:
        return ("speculative decoding: the MTP module is loaded and runs over every prompt (its KV cache and first draft token "
                "go to the decode replica), adding its weights and one layer of KV; this replica verifies no draft tokens")
    k = spec.draft_tokens
    acceptance = (f"a measured accepted length of {spec.accepted_tokens:g} tokens per step" if spec.accepted_tokens is not None
                  else "acceptance " + ", ".join(f"{a:.3g}" for a in spec.acceptance_rates[:k]) + " per draft position")
    return (f"speculative decoding (MTP, {k} draft token{'s' if k > 1 else ''}): each step verifies {1 + k} tokens per sequence "
            f"(GEMM rows and attention math x {1 + k}, the KV read once) and the last stage runs the MTP module {k} time"
            f"{'s' if k > 1 else ''} (first over the {1 + k} verified positions, then one token each), as TensorRT-LLM, SGLang and "
            f"vLLM reuse DeepSeek's one module; with {acceptance} a step emits {spec.tokens_per_step:.3g} tokens per sequence "
            f"(1 + sum of the products of the rates), so TPOT = step / {spec.tokens_per_step:.3g}; acceptance depends on the "
            f"data (source: {spec.source or 'given'}); the module holds its weights and one layer of KV on the last stage "
            f"(weights in {draft_precisions(inp.precisions).weights}), and prefill runs it over every prompt token")
