"""The checkpoint each deployment of a plan serves, named where the user named the model.

A model comes from one of three places in the plan's embedded problem, and each says which
repositories the engines download:

- the catalog (`models/*.yaml`): `serving_repo` (the instruct or chat model) or `hf_repo`, the
  pre-quantized checkpoints of `quantized_repos`, `trust_remote_code` and `gated`;
- an inline model (`inline:` in the problem): the same fields, written in the problem;
- a config.json model: `hf_repo`, `serving_repo`, `quantized_repos`, `trust_remote_code` and `gated` beside
  `config_json`; without a repository the engines load the local path `/models/<id>` (and the export
  says so), and without `trust_remote_code` it follows config.json (an `auto_map` entry names code of
  the repository's own). The checkpoint's native weight format is read from config.json when it is
  readable where the export runs; otherwise the plan's weight format is taken as the checkpoint's.

Where the plan's weight format differs from the native one, a pre-quantized checkpoint for it is
served when one is named, else the native one quantized at load time.
"""

from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import PlannerInputError
from planner.model.catalog import ModelSpec, load_model_specs
from planner.model.hf_config import load_hf_config
from planner.output.launch import safe_file_name
from planner.output.plan import Plan, PlanDeployment
from planner.precision import Precision, bytes_per_value
from planner.units import GB

__all__ = ["Checkpoint", "ModelSource", "checkpoint", "checkpoint_notes", "model_source"]

LOCAL_MODELS_DIR = "/models"


@dataclass(frozen=True)
class ModelSource:
    """Where a deployment's weights come from, as the problem or the catalog names them."""

    repo: str | None  # serving_repo or hf_repo; None: no repository named
    quantized_repos: dict[str, str] = field(default_factory=dict)
    native_weights: str | None = None  # the checkpoint's weight format (None: unknown here)
    trust_remote_code: bool = False
    gated: bool = False
    named_by: str = "the model catalog"
    model_type: str | None = None  # config.json's model_type: the engines' model class


@dataclass(frozen=True)
class Checkpoint:
    repo: str
    online_quantization: str | None  # the weight format the engine must quantize to at load time, if any
    trust_remote_code: bool
    gated: bool = False  # Hugging Face asks for an accepted licence, so downloads need HF_TOKEN
    native_weights: str | None = None

    @property
    def local(self) -> bool:
        """Whether the repository is a path on the hosts rather than a Hugging Face repository."""
        return self.repo.startswith("/")


def _from_spec(spec: ModelSpec, named_by: str) -> ModelSource:
    return ModelSource(spec.serving_repo or spec.hf_repo, {str(k): v for k, v in spec.quantized_repos.items()},
                       spec.native_weights_precision.value, spec.trust_remote_code, spec.gated, named_by, spec.model_type)


def _from_config_json(plan: Plan, ref: dict) -> ModelSource:
    native, remote_code, model_type = None, False, None
    path = Path(ref["config_json"])
    try:  # the plan's problem directory, as the engine-mismatch NOTE resolves it
        imported = load_hf_config(path if path.is_absolute() else Path(plan.problem_dir or ".") / path, ref.get("id"))
        native, remote_code, model_type = imported.native_weights_precision.value, imported.trust_remote_code, imported.model_type
    except (PlannerInputError, OSError):
        pass
    trust = ref.get("trust_remote_code")
    return ModelSource(ref.get("serving_repo") or ref.get("hf_repo"), dict(ref.get("quantized_repos") or {}), native,
                       remote_code if trust is None else bool(trust), bool(ref.get("gated", False)), "the problem's config.json model",
                       model_type)


def model_source(plan: Plan, d: PlanDeployment) -> ModelSource:
    """Where the deployment's model is named: the problem's own entry first, then the catalog."""
    ref = plan.model_entry(d)
    if isinstance(ref, dict) and "inline" in ref:
        return _from_spec(ModelSpec.model_validate(ref["inline"]), "the problem's inline model")
    if isinstance(ref, dict) and "config_json" in ref:
        return _from_config_json(plan, ref)
    spec = load_model_specs().get(ref["catalog"] if isinstance(ref, dict) else str(ref))
    return _from_spec(spec, "the model catalog") if spec else ModelSource(None, named_by="nothing")


def checkpoint(plan: Plan, d: PlanDeployment) -> Checkpoint:
    """The repository to serve: a pre-quantized one for the plan's weight format when one is named, else
    the native checkpoint (quantized at load time when the format differs), else `/models/<id>`."""
    source = model_source(plan, d)
    weights = str(d.precisions.weights)
    native = source.native_weights or weights
    quantized = source.quantized_repos.get(weights) if weights != native else None
    repo = quantized or source.repo or f"{LOCAL_MODELS_DIR}/{safe_file_name(d.model)}"
    online = None if weights == native or quantized else weights
    return Checkpoint(repo, online, source.trust_remote_code, source.gated and not repo.startswith("/"), native)


def checkpoint_notes(d: PlanDeployment, index: int, ckpt: Checkpoint, engine: str) -> list[str]:
    """NOTEs on the checkpoint: a local path to fill, and vLLM quantizing at load time where the full-precision
    weights do not fit in HBM first (SGLang's `--load-format layered` quantizes layer by layer and needs no
    such room; TensorRT-LLM does not quantize at load time and says so itself)."""
    notes = []
    if ckpt.local:
        notes.append(f"deployment {index}: no repository is named for model {d.model}; the engines load {ckpt.repo}: put the "
                     "checkpoint there on every host (or mount it in the pods), or name hf_repo beside the model in the problem")
    if ckpt.online_quantization is None or engine != "vllm" or ckpt.native_weights is None:
        return notes
    memory = d.memory_bytes_per_accelerator
    ratio = bytes_per_value(Precision(ckpt.native_weights)) / bytes_per_value(Precision(ckpt.online_quantization))
    loading = memory.weights * ratio
    if loading > memory.capacity:
        notes.append(f"deployment {index}: {engine} loads {ckpt.repo} in {ckpt.native_weights} before quantizing to "
                     f"{ckpt.online_quantization}: {loading / GB:.0f} GB of weights per accelerator against "
                     f"{memory.capacity / GB:.0f} GB; serve a pre-quantized {ckpt.online_quantization} checkpoint instead")
    return notes
