"""`planner lifecycle`: pre-training, RL and inference over a model's life, and where they balance
(docs/physics.md claim 11).

Compute per token: pre-training 6 N (forward and backward), RL k N with k between 2 (rollouts
only) and 6 (a backward pass on every rollout), inference 2 N (forward), with N the active
parameters. The lecture's heuristic: total cost is lowest near where the three are equal. Equal
FLOPs give D_pretrain = D_inference / 3 and D_RL = 2 D_inference / k; equal *cost* weighs each
token by what it costs on the hardware (inference decode is memory-bound, so an inference token
costs more than 2 N FLOPs at training efficiency). Chinchilla-optimal is about 20 tokens per
parameter; the ratio is how far past it the balance puts pre-training.

Training layouts pay the pipeline bubble: with P stages and M micro-batches per step, a 1F1B or
GPipe schedule idles (P - 1) / (M + P - 1) of the time.
"""

from dataclasses import dataclass

from planner.physics.roofline import matmul_flops
from planner.units import SECONDS_PER_DAY, SECONDS_PER_HOUR, TFLOP, TOKENS_PER_MILLION

__all__ = ["CHINCHILLA_TOKENS_PER_PARAM", "Lifecycle", "TrainingLayout", "lifecycle", "pipeline_bubble_fraction"]

CHINCHILLA_TOKENS_PER_PARAM = 20.0  # Hoffmann et al. 2022, compute-optimal tokens per parameter
TRAINING_FLOPS_PER_PARAM_PER_TOKEN = 6.0  # forward (2) + backward (4)


def pipeline_bubble_fraction(stages: int, micro_batches: int) -> float:
    """Share of a training step the pipeline idles: (P - 1) / (M + P - 1)."""
    return (stages - 1) / (micro_batches + stages - 1)


@dataclass(frozen=True)
class TrainingLayout:
    accelerator_id: str
    accelerators: int
    flops_per_s: float  # achievable per accelerator (peak x measured matmul fraction)
    usd_per_hour: float  # per accelerator
    pipeline_stages: int
    micro_batches: int

    @property
    def bubble(self) -> float:
        return pipeline_bubble_fraction(self.pipeline_stages, self.micro_batches)

    def seconds_for(self, flops: float) -> float:
        return flops / (self.accelerators * self.flops_per_s * (1 - self.bubble))

    def usd_for(self, flops: float) -> float:
        return self.seconds_for(flops) * self.accelerators * self.usd_per_hour / SECONDS_PER_HOUR


@dataclass(frozen=True)
class Lifecycle:
    active_params: float
    inference_tokens: float
    inference_usd_per_token: float
    rl_flops_per_param_per_token: float
    pretrain_tokens_equal_flops: float
    rl_tokens_equal_flops: float
    pretrain_tokens_equal_cost: float
    training: TrainingLayout
    pretrain_tokens_given: float | None
    lines: tuple[str, ...]

    @property
    def chinchilla_tokens(self) -> float:
        return CHINCHILLA_TOKENS_PER_PARAM * self.active_params


def lifecycle(active_params: float, serving_tokens_per_s: float, lifetime_s: float, inference_usd_per_token: float,
              training: TrainingLayout, rl_flops_per_param_per_token: float = 4.0, pretrain_tokens: float | None = None,
              inference_basis: str = "") -> Lifecycle:
    n = active_params
    d_inf = serving_tokens_per_s * lifetime_s
    inference_flops = float(matmul_flops(n, d_inf))
    inference_usd = d_inf * inference_usd_per_token
    d_pre_flops = inference_flops / (TRAINING_FLOPS_PER_PARAM_PER_TOKEN * n)
    d_rl_flops = inference_flops / (rl_flops_per_param_per_token * n)
    train_usd_per_token = training.usd_for(TRAINING_FLOPS_PER_PARAM_PER_TOKEN * n)
    d_pre_cost = inference_usd / train_usd_per_token
    chinchilla = CHINCHILLA_TOKENS_PER_PARAM * n
    lines = [
        (f"inference: {serving_tokens_per_s:.3g} tokens/s for {lifetime_s / SECONDS_PER_DAY:g} days = {d_inf:.3g} tokens; "
        f"2 N D = {inference_flops:.3g} FLOPs; at ${inference_usd_per_token * TOKENS_PER_MILLION:.4g}/M tokens ({inference_basis}) ${inference_usd:,.0f}"),
        (f"equal FLOPs: pre-training 6 N D_pre = 2 N D_inf gives D_pre = D_inf / 3 = {d_pre_flops:.3g} tokens; "
        f"RL at {rl_flops_per_param_per_token:g} N per token gives D_RL = {d_rl_flops:.3g} tokens"),
        (f"equal cost: a pre-training token costs 6 N FLOPs on {training.accelerators:,} x {training.accelerator_id} at "
        f"{training.flops_per_s / TFLOP:,.0f} TFLOP/s each with a {training.bubble:.1%} pipeline bubble (PP{training.pipeline_stages}, "
        f"{training.micro_batches} micro-batches) = ${train_usd_per_token * TOKENS_PER_MILLION:.4g}/M; matching the inference bill takes "
        f"D_pre = {d_pre_cost:.3g} tokens"),
        (f"Chinchilla-optimal: {CHINCHILLA_TOKENS_PER_PARAM:g} x {n:.3g} = {chinchilla:.3g} tokens; the balance puts pre-training "
        f"{d_pre_flops / chinchilla:.0f}x (equal FLOPs) to {d_pre_cost / chinchilla:.0f}x (equal cost) past it"),
        (f"pre-training D_pre = {d_pre_cost:.3g} tokens takes {training.seconds_for(6 * n * d_pre_cost) / SECONDS_PER_DAY:,.1f} days "
        f"on the training layout"),
    ]
    if pretrain_tokens is not None:
        lines.append(f"given pre-training of {pretrain_tokens:.3g} tokens: {pretrain_tokens / chinchilla:.0f}x Chinchilla; its cost "
                     f"${training.usd_for(6 * n * pretrain_tokens):,.0f} is {training.usd_for(6 * n * pretrain_tokens) / inference_usd:.2f}x "
                     "the lifetime inference bill")
    return Lifecycle(n, d_inf, inference_usd_per_token, rl_flops_per_param_per_token, d_pre_flops, d_rl_flops, d_pre_cost, training,
                     pretrain_tokens, tuple(lines))
