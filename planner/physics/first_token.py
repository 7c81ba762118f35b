"""Time to first token from a queueing model of the replica's own load (docs/step-model.md, "TTFT").

Requests arrive as a Poisson stream at the rate the replica serves them. The replica is busy: it
starts a step (aggregated or decode replica) or a prefill pass (prefill replica) every `cycle_s` on
its first pipeline stage and admits new requests only at those starts. A Poisson arrival sees the
cycle in progress at a uniformly random point, so it waits a time uniform on [0, cycle]: mean
cycle / 2, q-quantile q x cycle. Then its own service: the steps or passes that compute its prompt
and emit its first token. Requests take one of several paths (a prompt-cache miss or hit), each
with its probability and service time.

TTFT mean = cycle / 2 + sum_i p_i service_i.
TTFT q-quantile = q x cycle + the service of the slowest path that at least (1 - q) of the requests
take. For one path this is exact; with a cache, the fast path's requests only lower the true
quantile, so the figure is an upper bound.

The worst case is a whole cycle of waiting and then the step that carries the prompt: two
departures (the lecture's claim 3). Arrays have shape (n,) (one value per batch).
"""

from dataclasses import dataclass

import numpy as np

from planner.model.architecture import kv_bytes_per_request
from planner.modes import ServingRole
from planner.physics.inputs import DeploymentInputs
from planner.physics.kv_cache import reload_s

__all__ = ["TTFT_QUANTILE", "FirstToken", "ServicePath", "aggregated_first_token", "decode_first_token", "first_token",
           "prefill_first_token"]

TTFT_QUANTILE = 0.9  # the percentile a plan states beside the mean, and the one TTFT limits hold at


@dataclass(frozen=True)
class ServicePath:
    """One way a request is served: its probability and its time from admission to first token."""

    probability: float
    service_s: np.ndarray


@dataclass(frozen=True)
class FirstToken:
    """TTFT of a replica at each batch: its mean, its quantile and their parts (arrays (n,))."""

    wait_s: np.ndarray  # mean wait for the cycle in progress (cycle / 2)
    service_s: np.ndarray  # mean service over the paths
    quantile_s: np.ndarray  # TTFT_QUANTILE of TTFT

    @property
    def mean_s(self) -> np.ndarray:
        return self.wait_s + self.service_s


def first_token(cycle_s: np.ndarray, paths: list[ServicePath], quantile: float = TTFT_QUANTILE) -> FirstToken:
    """TTFT of Poisson arrivals at a busy replica that admits them every `cycle_s`, served along
    `paths` (probabilities summing to 1; paths of probability 0 are ignored)."""
    cycle = np.asarray(cycle_s, dtype=float)
    taken = [p for p in paths if p.probability > 0]
    service = sum(p.probability * np.asarray(p.service_s, dtype=float) for p in taken)
    tail_paths = [p for p in taken if p.probability >= 1 - quantile] or [max(taken, key=lambda p: p.probability)]
    tails = [np.asarray(p.service_s, dtype=float) * np.ones_like(cycle) for p in tail_paths]
    tail = tails[0] if len(tails) == 1 else np.maximum.reduce(tails)
    return FirstToken(cycle / 2, service + 0.0 * cycle, quantile * cycle + tail)


# ---------------------------------------------------------------------------------------------
# the service paths of each serving role


def _hit_tokens(inp: DeploymentInputs) -> float | None:
    """Prompt tokens a prompt-cache hit still prefills (at least the last one); None without hits."""
    cache = inp.prefix_cache
    if cache is None or cache.hit_rate == 0 or inp.role is ServingRole.DECODE:
        return None
    return float(max(inp.input_tokens - cache.prefix_tokens, 1))


def _hit_reload_s(inp: DeploymentInputs) -> float:
    """Reading a hit's cached prefix back into HBM from its tier."""
    cache = inp.prefix_cache
    prefix_bytes = kv_bytes_per_request(inp.arch, cache.prefix_tokens, inp.precisions.kv_bytes)
    return reload_s(prefix_bytes, inp.layout.n_accelerators, cache.tier)


def _paths(inp: DeploymentInputs, miss_s: np.ndarray, hit_s: np.ndarray | None) -> list[ServicePath]:
    if hit_s is None:
        return [ServicePath(1.0, miss_s)]
    hit_rate = inp.prefix_cache.hit_rate
    return [ServicePath(1.0 - hit_rate, miss_s), ServicePath(hit_rate, hit_s)]


def _chunks(prompt_tokens: float, budget_tokens: int) -> int:
    return -(-int(prompt_tokens) // budget_tokens)


def aggregated_first_token(inp: DeploymentInputs, stage_s: np.ndarray, carrying_s: np.ndarray,
                            own_tokens: float) -> tuple[FirstToken, np.ndarray, np.ndarray | None]:
    """A new request waits for the step in progress, then its prompt rides in the next step of a
    micro-batch (`carrying_s` on the slowest stage: the mixed step plus the prompt on one attention
    rank), chunk after chunk, each chunk a round of all pipeline stages; its first token leaves with
    the last chunk's step. A hit's shorter remainder rides in a step between the mixed step and
    `carrying_s`, in proportion to its tokens."""
    lay, budget = inp.layout, inp.prefill_chunk_tokens
    miss = _chunks(inp.input_tokens, budget) * lay.pp * carrying_s
    rest = _hit_tokens(inp)
    hit = None
    if rest is not None:
        step = stage_s + (carrying_s - stage_s) * min(rest, budget) / own_tokens
        hit = _hit_reload_s(inp) + _chunks(rest, budget) * lay.pp * step
    return first_token(stage_s, _paths(inp, miss, hit)), miss, hit


def prefill_first_token(inp: DeploymentInputs, pass_s: np.ndarray, passes_per_prompt: int) -> tuple[FirstToken, np.ndarray, np.ndarray | None]:
    """A new prompt waits for the pass in progress on the first stage, then runs in the next pass (or
    passes, chunk after chunk) and through the pipeline behind it: (chunks + pp - 1) passes."""
    lay, budget = inp.layout, inp.prefill_chunk_tokens
    miss = (passes_per_prompt + lay.pp - 1) * pass_s
    rest = _hit_tokens(inp)
    hit = None if rest is None else _hit_reload_s(inp) + (_chunks(rest, budget) + lay.pp - 1) * pass_s
    return first_token(pass_s, _paths(inp, miss, hit)), miss, hit


def decode_first_token(inp: DeploymentInputs, stage_s: np.ndarray) -> tuple[FirstToken, np.ndarray, None]:
    """A request arriving with its KV cache waits for the step in progress, then its first step
    through all stages emits its first token."""
    service = inp.layout.pp * stage_s
    return first_token(stage_s, [ServicePath(1.0, service)]), service, None
