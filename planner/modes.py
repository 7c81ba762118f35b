"""The planner's modes and named choices as enums (a leaf module: the CLI builds its choices from these
without importing the physics)."""

from enum import StrEnum
from typing import Self

__all__ = [
    "EXPERT_ROUTINGS",
    "BatchLimit",
    "CacheTier",
    "Confidence",
    "ConstraintFamily",
    "Engine",
    "ExpertMethod",
    "ExportFormat",
    "FamilyKind",
    "OverlapPolicy",
    "ServingMode",
    "ServingRole",
    "SolveStatus",
    "StageKind",
    "StepModel",
    "StepTerm",
]


class OverlapPolicy(StrEnum):
    """How communication combines with the compute/memory roofline (a stated plan assumption)."""

    SERIAL = "serial"  # max(compute, weights + kv) + comm  (docs/physics.md default)
    OVERLAPPED = "overlapped"  # max(compute, weights + kv, comm): comm fully hidden behind the rest


class ServingRole(StrEnum):
    """What a replica does with a request.

    aggregated: prefills and decodes its own requests; prefill chunks ride in the decode steps
      (mixed batches), so prefill work lengthens every step a user waits for.
    prefill: only prefills prompts and hands their KV cache to a decode replica.
    decode: only decodes; its requests arrive with their KV cache from a prefill replica.
    """

    AGGREGATED = "aggregated"
    PREFILL = "prefill"
    DECODE = "decode"


class ExportFormat(StrEnum):
    """What `planner export` writes: the placement document, or a launch script for an engine."""

    JSON = "json"
    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"
    LWS = "lws"  # Kubernetes LeaderWorkerSet manifests for the plan's engine (or --engine)


class Engine(StrEnum):
    """The serving engine a deployment runs on: its kernels set the calibrated rates, its scheduler
    the per-step token budget and whether expert all-to-alls overlap compute."""

    TRTLLM = "trtllm"
    SGLANG = "sglang"
    VLLM = "vllm"


class StepModel(StrEnum):
    """How a step's time is computed.

    calibrated: a sum of kernel classes (dense GEMM, grouped MoE GEMM, attention, elementwise,
      collectives), each at the rate measured for its shape on the accelerator and engine, plus
      each kernel's fixed time; what an engine is predicted to reach (the default).
    roofline: the ideal model of docs/physics.md, one achievable fraction for all FLOPs and one for
      all bytes, max(compute, memory) + communication; the physical limit the calibrated step is
      compared with.
    """

    CALIBRATED = "calibrated"
    ROOFLINE = "roofline"


class Confidence(StrEnum):
    """Which end of a prediction's range the latency limits are held to when planning.

    median: the calibrated prediction itself (half of real deployments would be slower).
    high: the slow end of the range (p90 of the kernel fits), so that the limits hold there too.
    """

    MEDIAN = "median"
    HIGH = "high"


class StepTerm(StrEnum):
    """The terms a step's time is split into (the calibrated model adds the kernels' fixed times)."""

    COMPUTE = "compute"
    WEIGHTS = "weights"
    KV = "kv"
    COMM = "comm"
    OVERHEAD = "overhead"


class BatchLimit(StrEnum):
    """What stopped a candidate's batch from growing (or why it has the batch it has)."""

    HBM = "hbm"
    TPOT = "tpot"
    TTFT = "ttft"
    NIC = "nic"  # a decode replica's NICs cannot take in its requests' KV caches any faster
    MAX_BATCH = "max_batch"  # solver.max_batch_per_replica
    LADDER = "ladder"  # a smaller batch kept for latency objectives and frontiers
    PEAK = "peak"  # the fastest feasible batch is below the largest: larger ones slow each step more than they add
    PAIRING = "pairing"  # a smaller decode batch kept for its prefill partners (pair TTFT, prefill replicas that feed it)
    PREFILL = "prefill"  # a prefill replica: its batch is the prompts it holds


class FamilyKind(StrEnum):
    """Kinds of constraint family an infeasibility explanation can name."""

    DEMAND = "demand"
    RACKS = "racks"
    SERVE = "serve"
    TTFT = "ttft"
    TPOT = "tpot"
    HBM = "hbm"
    LIMITS = "limits"
    COST_CAP = "cost_cap"


class ConstraintFamily(str):
    """A constraint family and what it is about, e.g. demand of workload 'chat'. It prints (and
    compares) as "demand[chat]", and carries `kind` and `subject` so that nothing parses the text."""

    kind: FamilyKind
    subject: str

    def __new__(cls, kind: FamilyKind | str, subject: str = "") -> Self:
        kind = FamilyKind(kind)
        family = super().__new__(cls, f"{kind}[{subject}]" if subject else str(kind))
        family.kind, family.subject = kind, subject
        return family


class ServingMode(StrEnum):
    """How a workload is served: aggregated replicas, separate prefill and decode pools, or the
    cheaper of the two as the solver finds it."""

    AGGREGATED = "aggregated"
    DISAGGREGATED = "disaggregated"
    AUTO = "auto"


class SolveStatus(StrEnum):
    """How a solve ended (CP-SAT's status names, kept in the plan JSON as they are)."""

    OPTIMAL = "OPTIMAL"  # the plan is proven best
    FEASIBLE = "FEASIBLE"  # a plan, with a gap left to its bound
    INFEASIBLE = "INFEASIBLE"  # proven: no plan meets the limits
    UNKNOWN = "UNKNOWN"  # the time ran out before a plan was found or ruled out
    MODEL_INVALID = "MODEL_INVALID"

    @property
    def has_plan(self) -> bool:
        return self in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE)


class StageKind(StrEnum):
    """How a stage occupies the racks it is packed into: slots of one rack, or whole racks of its own."""

    SLOTS = "slots"  # a block of accelerators inside one rack
    RACKS = "racks"  # a stage wider than a rack: whole racks


class CacheTier(StrEnum):
    """The tier choice a prompt cache may leave to the solver (others name a tier of the catalog)."""

    AUTO = "auto"  # the solver compares no cache and every tier the accelerator has


# Tokens-per-expert skews of the measured grouped-GEMM tables (aiconfigurator-core's `balanced` and
# power-law distributions): the model catalog's `moe.routing` and `planner estimate --expert-routing`.
EXPERT_ROUTINGS = ("balanced", "power_law_1.01", "power_law_1.2")


class ExpertMethod(StrEnum):
    """How experts are assigned to expert-parallel ranks."""

    GREEDY = "greedy"  # heaviest first onto the lightest rank, then swaps
    CPSAT = "cpsat"  # CP-SAT minimising the hottest rank's load
