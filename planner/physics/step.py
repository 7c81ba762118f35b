"""The terms of one decode micro-batch step on every pipeline stage, under either step model
(`modes.StepModel`).

roofline: FLOPs at one achievable fraction of peak, bytes at one fraction of HBM bandwidth,
  collectives over the graph's links; combined as max(compute, weights + KV) + comm.
calibrated: kernel classes at their measured rates (`physics.kernels`): dense GEMMs, grouped expert
  GEMMs, attention, elementwise work, the engine's collectives; each kernel's time is attributed to
  the term that bounds it, fixed times go to `overhead`, and the classes add up.

Arrays have shape (n_batches, pp); token counts come in as (n, 1).
"""

import numpy as np

from planner.model.architecture import attention_flops_per_context_token
from planner.physics.memory import weight_bytes_per_accelerator
from planner.physics.roofline import compute_time_s, matmul_flops, memory_time_s
from planner.physics.stages import decode_context_per_layer
from planner.physics.step_calibrated import calibrated_decode
from planner.physics.step_parts import (
    StepContext,
    StepTerms,
    decode_kv_bytes,
    roofline_comm,
    touch_fraction,
)

__all__ = ["decode_terms"]


def _roofline_decode(ctx: StepContext, micro_batch: np.ndarray, per_rank: np.ndarray, extra: np.ndarray,
                     rank_extra: np.ndarray, queries: float = 1.0) -> tuple[StepTerms, np.ndarray]:
    inp, st = ctx.inp, ctx.st
    arch, lay, prec = inp.arch, inp.layout, inp.precisions
    context = decode_context_per_layer(arch, inp.input_tokens, inp.output_tokens)
    attention = st.per_stage(attention_flops_per_context_token(arch, absorbed=True) * context)
    flops = (matmul_flops(st.dense_params + st.head_params, per_rank * queries) + attention * per_rank * queries) / lay.tp
    flops = flops + matmul_flops(st.routed_active_params, micro_batch * queries) / lay.stage_size * inp.expert_imbalance
    touch = touch_fraction(arch, micro_batch * queries + extra)
    weights = weight_bytes_per_accelerator(st.dense_params + st.head_params, st.routed_total_params * touch * inp.expert_slot_factor,
                                           lay.tp, lay.stage_size, prec.weight_bytes, prec.expert_weight_bytes)
    comm = roofline_comm(ctx, per_rank * queries + rank_extra, micro_batch * queries + extra)
    compute, weights, kv = (compute_time_s(flops, ctx.flops_per_s), memory_time_s(weights, ctx.hbm_bytes_per_s),
                            memory_time_s(decode_kv_bytes(ctx, per_rank), ctx.hbm_bytes_per_s))
    one = np.ones_like(compute)
    return StepTerms(compute, weights * one, kv, comm * one, 0.0 * one, one, one), touch[:, 0]


def decode_terms(ctx: StepContext, batches: np.ndarray, riders: np.ndarray | None = None,
                 own: np.ndarray | None = None, queries: float = 1.0) -> tuple[StepTerms, np.ndarray]:
    """Terms of one decode micro-batch step, (n_batches, pp), and the expert touch fraction (n,).
    `riders` (n,): prefill tokens travelling in the same step on each stage, spread evenly over the
    attention ranks. `own` (n,): the prompt tokens of one request that ride on one attention rank on
    top of its share (the step that carries a new prompt; that rank is the slowest). Under the
    roofline the prompt tokens widen the experts touched and the collectives (their FLOPs and KV
    reads are added by the caller); under the calibrated model their GEMM rows ride in the same
    kernels (only their attention is added by the caller). `queries`: tokens each sequence runs
    through the step (1 + the draft tokens a speculative step verifies): GEMM rows, collectives and
    attention queries scale with it, the KV each sequence reads does not."""
    lay = ctx.inp.layout
    micro_batch = (batches / lay.pp)[:, None]
    per_rank = micro_batch / lay.dp_attn
    shared = np.zeros_like(micro_batch) if riders is None else riders[:, None]
    mine = np.zeros_like(micro_batch) if own is None else own[:, None]
    extra, rank_extra = shared + mine, shared / lay.dp_attn + mine
    if ctx.calibrated:
        return calibrated_decode(ctx, micro_batch, per_rank, extra, rank_extra, queries)
    return _roofline_decode(ctx, micro_batch, per_rank, extra, rank_extra, queries)
