"""A model's storage and compute formats on one accelerator: the problem file's precisions with
their defaults filled (the model's native formats, the next wider tensor-core format the
accelerator has)."""

from planner.errors import InputIssue, PlannerInputError
from planner.hardware.catalog import Accelerator
from planner.model.architecture import ModelArch
from planner.physics.deployment import Precisions
from planner.precision import Precision, flops_format
from planner.problem.schema import PrecisionSpec

__all__ = ["resolve_precisions"]


def resolve_precisions(spec: PrecisionSpec, arch: ModelArch, accel: Accelerator, field_name: str = "precisions") -> tuple[Precisions, tuple[str, ...]]:
    """Fill the defaults of `spec` for this model and accelerator. Returns the formats and notes
    for the plan's assumptions (for instance a compute format the accelerator lacks)."""
    weights = spec.weights or arch.native_weights_precision
    expert_weights = spec.expert_weights or (arch.native_expert_weights_precision if spec.weights is None else None)
    wanted = flops_format(spec.compute or weights)
    compute = accel.supported_flops_format(wanted)
    if compute is None:
        raise PlannerInputError(InputIssue(f"{field_name}.compute", f"{accel.id} has no {wanted} or wider tensor-core rate in the catalog",
                                           f"use one of: {', '.join(accel.dense_flops_per_s)}"))
    notes = []
    if compute != wanted:
        notes.append(f"{accel.id} has no {wanted} tensor cores: matmuls run at its {compute} rate")
    precisions = Precisions(
        weights=weights,
        kv_cache=spec.kv_cache or Precision.BF16,
        activations=spec.activations or Precision.BF16,
        compute=compute,
        expert_weights=expert_weights,
    )
    return precisions, tuple(notes)
