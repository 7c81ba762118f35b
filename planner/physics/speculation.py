"""Speculative decoding as a serving option: how many draft tokens a step verifies, and how many
tokens a step emits on average (docs/step-model.md, "Speculative decoding").

A speculative step verifies `1 + k` tokens per sequence: the token the last step emitted and `k`
draft tokens, each proposed by the draft from the ones before it. The main model scores all of them
in one pass; the sequence keeps the draft tokens up to the first one it rejects, plus the main
model's own token at that position. With a_i the chance that draft token i is accepted given that
tokens 1..i-1 were, the expected tokens a step emits per sequence is

    L(k) = 1 + sum_{i=1..k} prod_{j<=i} a_j

(the accepted length engines report: TensorRT-LLM's "acceptance rate", SGLang's "accept length",
vLLM's "mean acceptance length"). TPOT = step time / L; output tokens/s = batch x L / step time.
"""

from dataclasses import dataclass

__all__ = ["SPECULATIVE_METHODS", "Speculation", "accepted_length"]

SPECULATIVE_METHODS = ("mtp",)  # the model's own multi-token-prediction modules as the draft


def accepted_length(acceptance_rates: tuple[float, ...], draft_tokens: int) -> float:
    """Expected tokens a step emits per sequence with `draft_tokens` draft tokens and per-position
    conditional acceptance rates (at least `draft_tokens` of them): 1 + sum_i prod_{j<=i} a_j."""
    if draft_tokens > len(acceptance_rates):
        raise ValueError(f"{draft_tokens} draft tokens need {draft_tokens} acceptance rates, {len(acceptance_rates)} given")
    total, chain = 1.0, 1.0
    for rate in acceptance_rates[:draft_tokens]:
        chain *= rate
        total += chain
    return total


@dataclass(frozen=True)
class Speculation:
    """One replica's speculative decoding. `draft_tokens` 0 means the draft module is loaded and runs
    over the prompts (a prefill replica whose requests decode with it elsewhere) but steps verify
    nothing."""

    draft_tokens: int  # k: draft tokens each step verifies per sequence
    acceptance_rates: tuple[float, ...] = ()  # a_i per position (at least k of them unless accepted_tokens is given)
    accepted_tokens: float | None = None  # a measured mean accepted length at this k, instead of the rates
    source: str = ""  # where the acceptance comes from
    method: str = "mtp"

    def __post_init__(self) -> None:
        if self.accepted_tokens is not None and not 1.0 <= self.accepted_tokens <= 1 + self.draft_tokens:
            raise ValueError(f"an accepted length of {self.accepted_tokens:g} is outside [1, {1 + self.draft_tokens}] "
                             f"for {self.draft_tokens} draft tokens")
        if self.accepted_tokens is None and self.draft_tokens > len(self.acceptance_rates):
            raise ValueError(f"{self.draft_tokens} draft tokens need {self.draft_tokens} acceptance rates, "
                             f"{len(self.acceptance_rates)} given")

    @property
    def tokens_per_step(self) -> float:
        """L: the mean tokens a step emits per sequence."""
        if self.accepted_tokens is not None:
            return self.accepted_tokens
        return accepted_length(self.acceptance_rates, self.draft_tokens)

    @property
    def queries(self) -> int:
        """Tokens each sequence runs through a step of the main model: 1 + k."""
        return 1 + self.draft_tokens
