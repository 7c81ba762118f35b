"""A candidate deployment, the record the enumeration (`solver.candidates`) yields and the model,
the placement and the plan read: its evaluated inputs and the figures at its batch; and how a
prefill-decode pair of them combines (served rate, KV hand-off, TTFT)."""

from collections.abc import Iterable
from dataclasses import dataclass, field

from planner.modes import BatchLimit, ServingRole, StepTerm
from planner.physics.cost import usd_per_million_tokens
from planner.physics.deployment import Layout, Precisions
from planner.physics.inputs import DeploymentInputs
from planner.physics.links import kv_handoff_s
from planner.units import SECONDS_PER_HOUR

__all__ = ["Candidate", "handoff_s", "pair_ttft_p90_s", "pair_ttft_s", "served_tokens_per_s"]


@dataclass(frozen=True)
class Candidate:
    """One way to serve a workload on a rack type: a layout at one batch size, with its figures.
    Rack, layout, batch, formats, serving role and prompt cache are those of its `inputs`."""

    workload: str
    model_key: str
    inputs: DeploymentInputs = field(repr=False, hash=False)  # the evaluated deployment at its batch
    tpot_s: float
    ttft_s: float  # mean TTFT in this replica at its load
    decode_tokens_per_s: float
    output_tokens_per_s: float  # sustained per replica, prefill included
    usd_per_hour: float  # per replica
    hbm_fill_fraction: float
    dominant_term: StepTerm
    batch_limit: BatchLimit  # what stopped the batch growing
    spans_domains: bool  # a tensor or expert group crosses scale-up domains (its traffic at scale-out speed)
    storage_usd_per_hour: float = 0.0  # holding the prompt cache outside HBM (included in usd_per_hour)
    input_tokens_per_s: float = 0.0  # prompt tokens per second per replica it prefills (or, decoding, receives)
    kv_handoff_bytes: float = 0.0  # prompt KV cache one request carries from a prefill to a decode replica
    nic_bytes_per_s: float = 0.0  # the replica's scale-out bandwidth for that hand-off (achievable)
    ttft_p90_s: float | None = None  # the 90th percentile of TTFT (what TTFT limits hold at); None: ttft_s exactly

    def __post_init__(self) -> None:
        if self.ttft_p90_s is None:
            object.__setattr__(self, "ttft_p90_s", self.ttft_s)

    @property
    def rack_id(self) -> str:
        return self.inputs.rack.id

    @property
    def accelerator_id(self) -> str:
        return self.inputs.rack.accelerator.id

    @property
    def layout(self) -> Layout:
        return self.inputs.layout

    @property
    def batch(self) -> int:
        return self.inputs.batch_per_replica

    @property
    def precisions(self) -> Precisions:
        return self.inputs.precisions

    @property
    def role(self) -> ServingRole:
        return self.inputs.role

    @property
    def kv_tier(self) -> str | None:
        """Where its prompt cache waits between requests (None: no prompt cache)."""
        cache = self.inputs.prefix_cache
        return None if cache is None or self.role is ServingRole.DECODE else cache.tier.id

    @property
    def accelerators(self) -> int:
        return self.layout.n_accelerators

    @property
    def draft_tokens(self) -> int:
        """Draft tokens each decode step verifies (speculative decoding; 0: off)."""
        spec = self.inputs.speculative
        return spec.draft_tokens if spec is not None else 0

    @property
    def stage_size(self) -> int:
        return self.layout.stage_size

    @property
    def stages(self) -> int:
        return self.layout.pp

    @property
    def usd_per_million_output_tokens(self) -> float:
        """All in: replica cost over the output tokens it serves per second (prefill included)."""
        return usd_per_million_tokens(self.usd_per_hour / SECONDS_PER_HOUR, self.output_tokens_per_s)

    @property
    def output_tokens_per_s_per_accelerator(self) -> float:
        return self.output_tokens_per_s / self.accelerators

    def sort_key(self) -> tuple:
        """Canonical order used to break ties deterministically."""
        return (self.role != ServingRole.AGGREGATED, str(self.role), self.rack_id, self.accelerators, self.layout.pp, -self.layout.tp,
                self.layout.ep, self.batch, self.draft_tokens)

    def describe(self) -> str:
        role = "" if self.role is ServingRole.AGGREGATED else f"{self.role} "
        mtp = f", MTP {self.draft_tokens} draft tokens" if self.draft_tokens else ""
        return f"{role}{self.rack_id} {self.layout.describe()}, batch {self.batch}{mtp}"


def served_tokens_per_s(chosen: Iterable[tuple[Candidate, int]]) -> float:
    """Output tokens per second that the replicas `chosen` ((candidate, replicas) of one workload)
    serve: what its aggregated or decode replicas make, or, with prefill and decode pools, the
    smaller of that and what the prefill pool feeds (a pair serves the smaller of its two rates)."""
    made = fed = 0.0
    split = False
    for c, replicas in chosen:
        if c.role is ServingRole.PREFILL:
            fed += replicas * c.output_tokens_per_s
            split = True
        else:
            made += replicas * c.output_tokens_per_s
    return min(made, fed) if split else made


def handoff_s(prefill: Candidate, decode: Candidate) -> float:
    """Time to move one request's prompt KV cache from a prefill replica to a decode replica over
    the slower side's NICs (the planner's bound; a placement in one NVLink domain is faster)."""
    return kv_handoff_s(prefill.kv_handoff_bytes, prefill.nic_bytes_per_s, decode.nic_bytes_per_s)


def pair_ttft_s(prefill: Candidate, decode: Candidate) -> float:
    """Mean TTFT of a disaggregated request: prefill (wait + prompt), KV hand-off, join a decode step."""
    return prefill.ttft_s + handoff_s(prefill, decode) + decode.ttft_s


def pair_ttft_p90_s(prefill: Candidate, decode: Candidate) -> float:
    """The 90th percentile of a disaggregated request's TTFT, bounded above by the sum of its parts'
    90th percentiles (what a TTFT limit holds at)."""
    return prefill.ttft_p90_s + handoff_s(prefill, decode) + decode.ttft_p90_s
