"""One-call evaluation of a catalog model on a catalog rack, for scripts and notebooks.

    from planner.quick import evaluate
    e = evaluate("llama-3.1-70b", "hgx-h100", batch=64, input_tokens=2048, output_tokens=128, tp=8)
    e.tpot_s, e.usd_per_million_output_tokens_all_in, e.serving_step.dominant_term

Precisions resolve as in a problem file (weights default to the model's native format, compute to
the weights' format or the next wider one the accelerator has); bad names, layouts and shards that
cut fp8 scaling blocks raise PlannerInputError with the field and the fix, as `planner estimate` refuses them.
"""

from planner.errors import PlannerInputError, unknown_name_issue
from planner.hardware.catalog import load_hardware_catalog
from planner.model.catalog import load_model_catalog
from planner.modes import Engine, OverlapPolicy, ServingRole, StepModel
from planner.physics.deployment import Layout
from planner.physics.estimate import Estimate, estimate
from planner.physics.inputs import DeploymentInputs, ServingOptions, deployment_inputs
from planner.problem.resolve import resolve_precisions, resolve_speculative
from planner.problem.schema import PrecisionSpec, SpeculativeSpec

__all__ = ["evaluate", "inputs_for"]


def inputs_for(model: str, rack: str, batch: int, input_tokens: int, output_tokens: int, *, tp: int = 1, ep: int = 1, pp: int = 1,
               dp_attn: int | None = None, weights: str | None = None, kv_cache: str = "bf16", compute: str | None = None,
               overlap: OverlapPolicy = OverlapPolicy.SERIAL, engine: Engine = Engine.TRTLLM,
               step_model: StepModel = StepModel.CALIBRATED, speculative_tokens: int = 0) -> DeploymentInputs:
    """The DeploymentInputs of one replica (see `evaluate`); `speculative_tokens`: MTP draft tokens per
    step, at the model catalog's published acceptance."""
    hardware, models = load_hardware_catalog(), load_model_catalog()
    if model not in models:
        raise PlannerInputError(unknown_name_issue("model", "model", model, models))
    if rack not in hardware.racks:
        raise PlannerInputError(unknown_name_issue("rack", "rack", rack, hardware.racks))
    arch, rack_type = models[model], hardware.racks[rack]
    layout = Layout(tp, ep, pp, dp_attn) if dp_attn else Layout.with_default_dp_attn(tp, ep, pp)
    spec = PrecisionSpec(weights=weights, kv_cache=kv_cache, compute=compute)
    precisions, notes = resolve_precisions(spec, arch, rack_type.accelerator)
    request = resolve_speculative(SpeculativeSpec(draft_tokens=speculative_tokens), arch, "speculative_tokens") if speculative_tokens else None
    serving = ServingOptions(OverlapPolicy(overlap), engine=Engine(engine), step_model=StepModel(step_model))
    return deployment_inputs(arch, rack_type, layout, batch, (input_tokens, output_tokens), precisions, hardware.overheads, serving,
                             notes=notes, speculative=request.speculation(speculative_tokens, ServingRole.AGGREGATED) if request else None)


def evaluate(model: str, rack: str, batch: int, input_tokens: int, output_tokens: int, **layout_and_formats) -> Estimate:
    """Evaluate `model` on one replica of `rack`: keyword arguments tp, ep, pp, dp_attn, weights,
    kv_cache, compute, overlap, speculative_tokens as in `inputs_for`."""
    return estimate(inputs_for(model, rack, batch, input_tokens, output_tokens, **layout_and_formats))
