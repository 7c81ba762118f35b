"""Evaluate one fixed deployment: TPOT, TTFT, throughput, HBM use and cost, each with its range,
under the calibrated step model beside the roofline bound it is compared with.

Step 1 evaluates the deployment's batch in `batch_table` under the inputs' step model.
Step 2, for a calibrated estimate, evaluates the same deployment under the ideal roofline: the
physical limit, and the fraction of it the engine is predicted to reach.
Step 3 derives ranges (the kernel fits' p10 and p90) and the stated assumptions.
"""

import functools
from dataclasses import dataclass, field, replace

import numpy as np

from planner.modes import OverlapPolicy, ServingRole, StepModel
from planner.physics.batch_table import (
    BatchTable,
    evaluate_batches,
    kv_reservation,
)
from planner.physics.cost import usd_per_million_tokens
from planner.physics.draft import speculative_note
from planner.physics.first_token import TTFT_QUANTILE
from planner.physics.inputs import DeploymentInputs
from planner.physics.links import ReplicaLinks, default_replica_links
from planner.physics.memory import MemoryUse, engine_kv_margin_note, windowed_kv_note
from planner.physics.roofline import StepTime
from planner.units import GB, SECONDS_PER_HOUR, TB, TFLOP, US

__all__ = ["Estimate", "RooflineComparison", "estimate"]


@dataclass(frozen=True)
class RooflineComparison:
    """The calibrated step beside the ideal roofline of the same deployment."""

    tpot_s: float  # the roofline's TPOT (the physical limit)
    fraction: float  # roofline TPOT / calibrated TPOT: how much of the limit the engine reaches
    gap_terms: tuple[tuple[str, float], ...]  # where the extra time goes, largest first (name, seconds)

    def sentence(self) -> str:
        parts = [name for name, seconds in self.gap_terms[:2] if seconds > 0]
        return f"{self.fraction:.0%} of the roofline" + (f"; the gap is mostly {' and '.join(parts)}" if parts else "")


@dataclass(frozen=True)
class Estimate:
    """The figures of one deployment, read from its one-row batch table. Times in seconds, bytes, USD."""

    inputs: DeploymentInputs
    links: ReplicaLinks
    table: BatchTable = field(compare=False, repr=False)  # the deployment's batch alone (row 0)
    assumptions: tuple[str, ...] = field(default_factory=tuple)
    roofline: RooflineComparison | None = None  # a calibrated estimate's ideal counterpart

    def _at(self, column: np.ndarray) -> float:
        return float(column[0])

    @functools.cached_property
    def decode_step(self) -> StepTime:
        """A pure decode step, all pipeline stages (the TPOT of a decode-only replica)."""
        t = self.table
        return _step(t, t.decode.terms, self.inputs.overlap, self._at(t.decode.low_ratio), self._at(t.decode.high_ratio))

    @functools.cached_property
    def prefill_chunk_step(self) -> StepTime:
        """One prefill pass through the slowest stage (a prefill replica's at its batch; else a full one)."""
        return _prefill_pass_step(self.inputs, self.table)

    @functools.cached_property
    def serving_step(self) -> StepTime:
        """The step users wait on: mixed decode + prefill for an aggregated replica (sums to TPOT)."""
        t = self.table
        ratios = ((self._at(t.tpot_low_s) / self.tpot_s, self._at(t.tpot_high_s) / self.tpot_s)
                  if self.inputs.role is not ServingRole.PREFILL else (self._at(t.ttft_low_ratio), self._at(t.ttft_high_ratio)))
        return _step(t, t.serving_step, self.inputs.overlap, *ratios)

    @property
    def tpot_s(self) -> float:
        return self._at(self.table.tpot_s)

    @property
    def mean_step_per_token_s(self) -> float:
        """The replica's mean step per token emitted (its output rate is batch / it); TPOT but for an
        aggregated replica, whose users do not wait on their own prompts."""
        return self._at(self.table.mean_step_per_token_s)

    @property
    def stage_time_s(self) -> float:
        return self._at(self.table.stage_time_s)

    @property
    def prefill_latency_s(self) -> float:
        """Admission to first token of a cache miss (its prompt's steps or passes)."""
        return self._at(self.table.miss_service_s)

    @property
    def queue_wait_s(self) -> float:
        """The mean wait for the step or pass in progress (the rest of the mean TTFT)."""
        return self._at(self.table.queue_s)

    @property
    def cache_hit_latency_s(self) -> float:
        """Admission to first token of a prompt-cache hit: reload its prefix, prefill the rest (0 without)."""
        return self._at(self.table.hit_service_s)

    @property
    def ttft_s(self) -> float:
        """Mean TTFT at the replica's load (Poisson arrivals)."""
        return self._at(self.table.ttft_s)

    @property
    def ttft_p90_s(self) -> float:
        return self._at(self.table.ttft_p90_s)

    @property
    def decode_tokens_per_s(self) -> float:
        """Per replica, decode alone (batch / pure decode step)."""
        return self._at(self.table.decode_tokens_per_s)

    @property
    def prefill_tokens_per_s(self) -> float:
        """Per replica, prefill alone (full passes back to back)."""
        return self.table.prefill_tokens_per_s

    @property
    def sustained_output_tokens_per_s(self) -> float:
        """Per replica in its role (an aggregated replica also prefills)."""
        return self._at(self.table.sustained_output_tokens_per_s)

    @property
    def sustained_input_tokens_per_s(self) -> float:
        return self._at(self.table.sustained_input_tokens_per_s)

    @property
    def prefill_riders_per_step(self) -> float:
        """Prompt tokens prefilled in each micro-batch step on each stage (aggregated)."""
        return self._at(self.table.prefill_riders)

    @property
    def prompt_cache_bytes_per_accelerator(self) -> float:
        """In the cache's tier (HBM: counted in `memory`)."""
        return self._at(self.table.memory.cache_bytes)

    @property
    def storage_usd_per_hour(self) -> float:
        """Holding the prompt cache outside HBM."""
        return self._at(self.table.storage_usd_per_s) * SECONDS_PER_HOUR

    @functools.cached_property
    def memory(self) -> MemoryUse:
        m = self.table.memory
        return MemoryUse(self._at(m.weights_bytes), self._at(m.kv_bytes), self._at(m.activations_bytes), m.capacity_bytes,
                         self._at(m.cache_bytes) if m.cache_in_hbm else 0.0)

    @property
    def expert_touch_fraction(self) -> float:
        return self._at(self.table.touch)

    @property
    def flops_per_s_effective(self) -> float:
        return self.table.flops_per_s

    @property
    def hbm_bandwidth_bytes_per_s_effective(self) -> float:
        return self.table.hbm_bandwidth_bytes_per_s

    @property
    def kernel_source(self) -> str:
        return self.table.kernel_source

    @property
    def tpot_range_s(self) -> tuple[float, float]:
        """p10, p90 from the kernel fits (equal to tpot_s under the roofline)."""
        return self._at(self.table.tpot_low_s), self._at(self.table.tpot_high_s)

    @property
    def ttft_range_s(self) -> tuple[float, float]:
        ttft, t = self.ttft_s, self.table
        return ttft * self._at(t.ttft_low_ratio), ttft * self._at(t.ttft_high_ratio)

    @property
    def step_model(self) -> StepModel:
        return self.serving_step.model

    @property
    def output_tokens_per_s_per_accelerator_range(self) -> tuple[float, float]:
        low, high = self.tpot_range_s
        rate = self.output_tokens_per_s_per_accelerator
        return (rate * self.tpot_s / high, rate * self.tpot_s / low) if low > 0 else (rate, rate)

    @property
    def input_tokens_per_s_range(self) -> tuple[float, float]:
        """Sustained prompt tokens/s per replica, p10-p90: from the prefill pass for a prefill replica,
        else from TPOT (prompts are taken at the pace of the output)."""
        step = self.prefill_chunk_step if self.inputs.role is ServingRole.PREFILL else self.serving_step
        return self.sustained_input_tokens_per_s / step.high_ratio, self.sustained_input_tokens_per_s / step.low_ratio

    @property
    def prefill_tokens_per_s_range(self) -> tuple[float, float]:
        p = self.prefill_chunk_step
        return self.prefill_tokens_per_s / p.high_ratio, self.prefill_tokens_per_s / p.low_ratio

    @property
    def decode_tokens_per_s_range(self) -> tuple[float, float]:
        d = self.decode_step
        return self.decode_tokens_per_s / d.high_ratio, self.decode_tokens_per_s / d.low_ratio

    @property
    def usd_per_million_output_tokens_range(self) -> tuple[float, float]:
        low, high = self.tpot_range_s
        cost = self.usd_per_million_output_tokens_all_in
        return (cost * low / self.tpot_s, cost * high / self.tpot_s) if self.tpot_s > 0 else (cost, cost)

    @property
    def n_accelerators(self) -> int:
        return self.inputs.layout.n_accelerators

    @property
    def usd_per_hour(self) -> float:
        """The replica's accelerators plus any prompt cache held outside HBM."""
        return self.inputs.rack.accelerator.price_usd_per_hour * self.n_accelerators + self.storage_usd_per_hour

    @property
    def output_tokens_per_s_per_accelerator(self) -> float:
        """Sustained output tokens per second per accelerator in the replica's role."""
        return self.sustained_output_tokens_per_s / self.n_accelerators

    @property
    def usd_per_million_decode_tokens(self) -> float:
        """Replica cost per output token of decode alone (pure decode steps, no prefill): the all-in
        figure is `usd_per_million_output_tokens_all_in`."""
        return usd_per_million_tokens(self.usd_per_hour / SECONDS_PER_HOUR, self.decode_tokens_per_s)

    @property
    def usd_per_million_prefill_tokens(self) -> float:
        """Replica cost per prompt token of prefill alone (full passes back to back)."""
        return usd_per_million_tokens(self.usd_per_hour / SECONDS_PER_HOUR, self.prefill_tokens_per_s)

    @property
    def replica_seconds_per_request(self) -> float:
        """Replica time one request takes in this replica's role."""
        if self.inputs.role is ServingRole.PREFILL:
            return self.inputs.prefilled_tokens / self.sustained_input_tokens_per_s
        return self.inputs.output_tokens / self.sustained_output_tokens_per_s

    @property
    def usd_per_million_output_tokens_all_in(self) -> float:
        """Replica cost per output token of its workload: per token it makes (an aggregated replica's
        prefill included), or for a prefill replica per token its prompts go on to produce."""
        tokens = self.inputs.output_tokens / self.replica_seconds_per_request
        return usd_per_million_tokens(self.usd_per_hour / SECONDS_PER_HOUR, tokens)

    @property
    def requests_per_s(self) -> float:
        return 1.0 / self.replica_seconds_per_request

    @property
    def usd_per_request(self) -> float:
        return self.usd_per_hour / SECONDS_PER_HOUR * self.replica_seconds_per_request

    @property
    def fits(self) -> bool:
        return self.memory.fits


def _model_notes(inp: DeploymentInputs, t: BatchTable, flops_per_s: float, bw: float) -> list[str]:
    accel, fmt = inp.rack.accelerator, inp.precisions.compute
    roofline = [
        (f"roofline: compute at {fmt} tensor-core rate x achievable fraction {accel.compute_fraction_by_format[fmt]:.3f} = "
         f"{flops_per_s / TFLOP:.0f} TFLOP/s per accelerator; HBM at {accel.hbm_bandwidth_fraction:.2f} of peak = {bw / TB:.2f} TB/s; "
         f"scale-up links at {accel.scale_up_bandwidth_fraction:.2f}, scale-out at {accel.scale_out_bandwidth_fraction:.2f} of peak"),
    ]
    overlap = "overlapped with the rest (two micro-batches)" if inp.overlap is OverlapPolicy.OVERLAPPED else "added to the rest"
    if t.step_model is StepModel.ROOFLINE:
        return roofline + [f"step model: roofline (ideal); communication {overlap}"]
    calibrated = (f"step model: calibrated for {inp.engine} from measured kernel rates ({t.kernel_source}); every kernel class "
                  f"at its shape's rate plus its fixed time, communication {overlap}; the range (p10-p90) is the wider of the kernel "
                  "rates' spread and the end-to-end spread of such predictions on published measurements (topologies/model_spread.yaml)")
    return [calibrated, *roofline]


QUEUEING = (f"TTFT for Poisson arrivals at this load: the mean wait for the step or pass in progress is half of it, "
            f"the {TTFT_QUANTILE:.0%} percentile {TTFT_QUANTILE:g} of it")


def _role_note(inp: DeploymentInputs, chunk: float) -> str:
    if inp.role is ServingRole.PREFILL:
        return (f"prefill-only replica: each pass takes the {chunk:g} prompt tokens per attention rank that arrived during the "
                f"pass before (the budget of {inp.prefill_chunk_tokens} holds whole prompts; longer ones are chunked), pipelined over "
                f"{inp.layout.pp} stage(s); {QUEUEING}, then the prompt's own pass(es); the KV cache leaves for a decode replica")
    if inp.role is ServingRole.DECODE:
        return (f"decode-only replica: requests arrive with their KV cache and join the next step; TPOT is the pure decode step; "
                f"{QUEUEING}, then one step through all stages")
    return (f"aggregated replica: prompts ({inp.prefilled_tokens:g} tokens per {inp.output_tokens} output tokens) are prefilled in "
            f"the decode steps as they arrive, whole or in chunks of at most {inp.prefill_chunk_tokens} tokens, on every attention rank "
            "at once (the ideal roofline spreads them evenly over the steps); the mean step, which sets the output rate, carries them "
            f"all, and TPOT the other requests' prompts only; {QUEUEING}; then the request's prompt rides in "
            f"the next step of a micro-batch on one attention rank (chunks of at most {inp.prefill_chunk_tokens} tokens, one "
            f"round of the {inp.layout.pp} stage(s) each); the worst case, a whole step waited and the step that carries the "
            "prompt, is two departures (claim 3)")


def _assumptions(inp: DeploymentInputs, t: BatchTable, links: ReplicaLinks) -> tuple[str, ...]:
    chunk, touch, flops_per_s, bw = float(t.pass_tokens[0]), float(t.touch[0]), t.flops_per_s, t.hbm_bandwidth_bytes_per_s
    accel = inp.rack.accelerator
    notes = _model_notes(inp, t, flops_per_s, bw) + [
        (f"decode KV reads use the mean context {inp.input_tokens + inp.output_tokens / 2:g} tokens (input + output/2); "
        f"{kv_reservation(inp)[1]}"),
        *filter(None, [windowed_kv_note(inp.arch, inp.engine, inp.step_model), engine_kv_margin_note(inp.engine, inp.step_model)]),
        _role_note(inp, chunk),
        f"price ${accel.price_usd_per_hour:.2f}/h per {accel.id} (estimate: {accel.price_basis})",
        ("the scale-out network is a non-blocking fabric; collectives pay "
        f"{links.latency_s / US:.0f} us fixed latency each"),
    ]
    notes.extend(inp.notes)
    if (spec := speculative_note(inp)) is not None:
        notes.append(spec)
    if inp.prefix_cache is not None and inp.role is not ServingRole.DECODE:
        c = inp.prefix_cache
        notes.append(f"prompt cache: {c.hit_rate:.0%} of requests find their first {c.prefix_tokens} tokens in {c.tier.name}, kept "
                     f"{c.retention_s / 60:g} min after last use; misses write new entries (Little's law); hits reload at "
                     f"{c.tier.read_bytes_per_s_per_accelerator / GB:g} GB/s per accelerator"
                     + ("" if c.tier.in_hbm else f" and cost {c.tier.usd_per_byte_s * GB * SECONDS_PER_HOUR:.3g} USD per GB-hour held"))
    if inp.arch.is_moe:
        notes.append(f"a decode step touches {touch:.1%} of each MoE layer's experts (1-(1-k/E)^b, routing independent per token)")
        notes.append(f"expert load: the hottest expert-parallel rank carries {inp.expert_imbalance:.3f}x the mean"
                     + (f"; {inp.redundant_experts_per_rank} redundant expert copies per rank" if inp.redundant_experts_per_rank else "")
                     + ("" if inp.step_model is StepModel.ROOFLINE else
                        f"; expert kernels at {inp.routing.replace('_', ' ')} routing (their measured tables' skew"
                        + (", the model's default" if inp.expert_routing is None else "") + ")"))
    return tuple(notes)


def _roofline(inp: DeploymentInputs, t: BatchTable, links: ReplicaLinks) -> RooflineComparison | None:
    if t.step_model is not StepModel.CALIBRATED:
        return None
    ideal = evaluate_batches(replace(inp, step_model=StepModel.ROOFLINE), [inp.batch_per_replica], links)
    gap = {"kernel floors and elementwise work": float(t.serving_step[4][0]),
           "GEMM and expert kernels below peak": float(t.serving_step[0][0] + t.serving_step[1][0] - ideal.serving_step[0][0] - ideal.serving_step[1][0]),
           "attention kernels": float(t.serving_step[2][0] - ideal.serving_step[2][0]),
           "communication": float(t.serving_step[3][0] - ideal.serving_step[3][0])}
    terms = tuple(sorted(gap.items(), key=lambda item: -item[1]))
    return RooflineComparison(float(ideal.tpot_s[0]), float(ideal.tpot_s[0] / t.tpot_s[0]), terms)


def _step(t: BatchTable, terms, overlap: OverlapPolicy, low: float = 1.0, high: float = 1.0) -> StepTime:
    return StepTime(*(float(term[0]) for term in terms[:4]), overlap, float(terms[4][0]) if len(terms) > 4 else 0.0,
                    t.step_model, low, high)


def _prefill_pass_step(inp: DeploymentInputs, t: BatchTable) -> StepTime:
    """The prefill pass to report: a prefill replica's own pass at its batch, else a full pass."""
    if inp.role is not ServingRole.PREFILL:
        return t.prefill_step
    return _step(t, t.serving_step, inp.overlap, float(t.ttft_low_ratio[0]), float(t.ttft_high_ratio[0]))


def estimate(inp: DeploymentInputs, links: ReplicaLinks | None = None) -> Estimate:
    """Evaluate `inp`. Links default to a replica filling instances of `inp.rack` in order."""
    links = links or default_replica_links(inp.rack, inp.layout, inp.overheads.collective_latency_s)
    t = evaluate_batches(inp, [inp.batch_per_replica], links)
    return Estimate(inp, links, t, _assumptions(inp, t, links), _roofline(inp, t, links))
