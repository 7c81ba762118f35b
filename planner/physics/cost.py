"""Money: replica cost rate and cost per token."""

from planner.units import SECONDS_PER_HOUR, TOKENS_PER_MILLION

__all__ = ["usd_per_million_tokens", "usd_per_s"]


def usd_per_s(price_usd_per_hour: float, n_accelerators: int) -> float:
    """Cost rate of `n_accelerators` rented at `price_usd_per_hour` each."""
    return price_usd_per_hour * n_accelerators / SECONDS_PER_HOUR


def usd_per_million_tokens(cost_usd_per_s: float, tokens_per_s: float) -> float:
    """docs/physics.md: cost per token = price_per_s * G * t_step / B, here per million tokens."""
    return cost_usd_per_s / tokens_per_s * TOKENS_PER_MILLION
