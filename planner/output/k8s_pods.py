"""The pods of the Kubernetes export (planner/output/kubernetes.py): what a serving pod needs beyond its
command, each choice with where it comes from.

- `/dev/shm`: a container gets 64 MiB of it unless a volume says otherwise, and the engines' processes
  pass tensors and queues through it (NCCL's shared-memory transport, vLLM's and SGLang's worker queues).
  It is a memory-backed emptyDir of SHM_GIB_PER_ACCELERATOR GiB per accelerator of the pod: SGLang's
  install guide starts its image on an 8-GPU host with `--shm-size 32g` (docs/get_started/install.md),
  which is 4 GiB per GPU; vLLM's guide runs with `--ipc=host` (no bound) or a `--shm-size` of the
  user's choice, so the same rate serves it. The emptyDir counts against the pod's memory.
- Model credentials: `HF_TOKEN` from the secret HF_SECRET (key HF_SECRET_KEY), required for gated models
  (the catalog's or the problem's `gated` field: their licence must be accepted on Hugging Face, and
  downloads without a token fail) and optional for other Hugging Face repositories; a local path
  (`/models/...`) needs none.
- Probes on the engine's health endpoint: a startup probe that allows as long as the launch scripts wait
  (START_TIMEOUT_S_DEFAULT: a large checkpoint loads in tens of minutes), then readiness and liveness.
- The IMEX channel: on a rack whose NVLink domain spans several hosts (GB200 NVL72), pods of one group
  reach each other's GPU memory over NVLink only through an IMEX channel, which the NVIDIA DRA driver
  for GPUs (github.com/NVIDIA/k8s-dra-driver-gpu) hands out through a ComputeDomain
  (COMPUTE_DOMAIN_API_VERSION, kind ComputeDomain): the domain names a ResourceClaimTemplate, every pod
  of the group claims a channel from it. Without it NCCL falls back to the NICs the plan did not price.
"""

from dataclasses import dataclass

from planner.output.launch import START_TIMEOUT_S_DEFAULT

__all__ = ["PodNeeds", "compute_domain", "container", "pod_template"]

FILES_MOUNT = "/planner"
GPU_RESOURCE = {"NVIDIA": "nvidia.com/gpu", "AMD": "amd.com/gpu"}
SHM_GIB_PER_ACCELERATOR = 4  # SGLang's --shm-size 32g on an 8-GPU host (see the module docstring)
HF_SECRET, HF_SECRET_KEY = "hf-token", "HF_TOKEN"
# NVIDIA DRA driver for GPUs: ComputeDomain CRD (api/nvidia.com/resource/v1beta1 in k8s-dra-driver-gpu); numNodes
# is deprecated there and 0 with its default IMEXDaemonsWithDNSNames feature gate.
COMPUTE_DOMAIN_API_VERSION = "resource.nvidia.com/v1beta1"
IMEX_CLAIM = "imex-channel"
PROBE_PERIOD_S = 10
WORKLOAD_LABEL = "planner/workload"  # on the pods that answer a workload's requests; its Service selects them


@dataclass(frozen=True)
class PodNeeds:
    """What the pods of one LeaderWorkerSet need besides their commands."""

    image: str
    vendor: str
    accelerators: int  # per pod (one host's)
    configmap: str
    repo: str | None = None  # the Hugging Face repository the engine downloads (None: a local path, or no model)
    imex_template: str | None = None  # the ComputeDomain's ResourceClaimTemplate, for groups across NVLink trays
    gated: bool = False  # the repository needs an accepted licence, so HF_TOKEN is required


def _env(needs: PodNeeds) -> list[dict]:
    if not needs.repo or needs.repo.startswith("/"):
        return []
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": HF_SECRET, "key": HF_SECRET_KEY, "optional": not needs.gated}}}]


def _probes(port: int, path: str) -> dict:
    check = {"httpGet": {"path": path, "port": port}, "periodSeconds": PROBE_PERIOD_S}
    return {"startupProbe": {**check, "failureThreshold": START_TIMEOUT_S_DEFAULT // PROBE_PERIOD_S},
            "readinessProbe": {**check, "failureThreshold": 3}, "livenessProbe": {**check, "failureThreshold": 6}}


def container(name: str, command: str, needs: PodNeeds, port: int | None, health_path: str = "/health") -> dict:
    """One container: the command from the files' directory, the pod's accelerators, `/dev/shm`, the
    model credentials, and probes where it serves HTTP."""
    out: dict = {"name": name, "image": needs.image, "command": ["/bin/sh", "-c", command], "workingDir": FILES_MOUNT,
                 "volumeMounts": [{"name": "planner-files", "mountPath": FILES_MOUNT}]}
    if env := _env(needs):
        out["env"] = env
    if needs.accelerators:
        resource = GPU_RESOURCE.get(needs.vendor, "nvidia.com/gpu")
        out["resources"] = {"limits": {resource: needs.accelerators}, "requests": {resource: needs.accelerators}}
        out["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
        if needs.imex_template:
            out["resources"]["claims"] = [{"name": IMEX_CLAIM}]
    if port:
        out["ports"] = [{"containerPort": port, "name": "http"}]
        out.update(_probes(port, health_path))
    return out


def pod_template(main: dict, needs: PodNeeds, labels: dict[str, str] | None = None) -> dict:
    """A pod template around `main`, with its volumes and (for groups across NVLink trays) the IMEX claim."""
    volumes: list[dict] = [{"name": "planner-files", "configMap": {"name": needs.configmap}}]
    if needs.accelerators:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{SHM_GIB_PER_ACCELERATOR * needs.accelerators}Gi"}})
    spec: dict = {"containers": [main], "volumes": volumes}
    if needs.imex_template:
        spec["resourceClaims"] = [{"name": IMEX_CLAIM, "resourceClaimTemplateName": needs.imex_template}]
    out: dict = {"spec": spec}
    if labels:
        out["metadata"] = {"labels": dict(labels)}
    return out


def compute_domain(name: str, claim_template: str, labels: dict[str, str]) -> dict:
    """The ComputeDomain whose channels the pods of one LeaderWorkerSet claim."""
    return {"apiVersion": COMPUTE_DOMAIN_API_VERSION, "kind": "ComputeDomain", "metadata": {"name": name, "labels": labels},
            "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": claim_template}}}}
