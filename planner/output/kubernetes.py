"""Kubernetes manifests for a plan: one LeaderWorkerSet (kubernetes-sigs/lws, API
leaderworkerset.x-k8s.io/v1) per deployment, whose groups are its replicas: the leader pod is the
replica's first host and the workers its other hosts, each pod asking for the host's accelerators.

The commands are the ones of the launch scripts (planner/output/engines.py), with the replica's first
host addressed as `$LWS_LEADER_ADDRESS` and per-host numbers computed from `$LWS_WORKER_INDEX`,
both set by the LeaderWorkerSet controller. Files (expert maps, engine YAML) travel in one ConfigMap
mounted as the working directory. A disaggregated workload's router is one more LeaderWorkerSet of
size 1 that reaches the servers through the DNS names the LeaderWorkerSet's headless service gives
every leader (`<name>-<group>.<name>`). Every workload gets a Service over the pods that answer it (its
router, or its servers' leaders); what else a pod needs (`/dev/shm`, credentials, probes, the IMEX
channel on NVL72-class racks) is in planner/output/k8s_pods.py.
"""

import hashlib
import re
import shlex

import yaml

from planner.errors import InputIssue, PlannerInputError
from planner.output.checkpoints import checkpoint
from planner.output.engines import (
    API_PORT,
    ENGINE_VERSIONS,
    host_size,
    vendor_of,
)
from planner.output.k8s_pods import (
    HF_SECRET,
    HF_SECRET_KEY,
    WORKLOAD_LABEL,
    PodNeeds,
    compute_domain,
    container,
    pod_template,
)
from planner.output.launch import HostRef, LaunchScript, RankRef, Server, Word
from planner.output.plan import Plan, PlanDeployment

__all__ = ["group_endpoints", "manifests_text"]

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"  # set by the controller on every pod ("0": the leader)
# The engines' published container images at the releases whose flags the exports were checked against
# (ENGINE_VERSIONS, tests/engine_flags/). TensorRT-LLM's flags were read from main after 1.3.0rc24, which has
# no image of its own: its newest release image is named, with a NOTE (TRTLLM_IMAGE_NOTE).
IMAGES = {("vllm", "NVIDIA"): "vllm/vllm-openai:v0.33.0", ("vllm", "AMD"): "vllm/vllm-openai-rocm:v0.33.0",
          ("sglang", "NVIDIA"): "lmsysorg/sglang:v0.5.23", ("sglang", "AMD"): "lmsysorg/sglang:v0.5.23-rocm",
          ("trtllm", "NVIDIA"): "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24"}
TRTLLM_IMAGE_NOTE = ("the TensorRT-LLM image is release 1.3.0rc24; the flags were checked against main after it, so a "
                     "flag or engine YAML key added since may need a newer image")


# Longest object name: a DNS-1035 label (the LeaderWorkerSet webhook's rule, since its name is also its
# headless Service's) from which the controller derives a StatefulSet `<name>-<group>` per group, and a
# StatefulSet's pods carry `controller-revision-hash: <statefulset>-<10 characters>`, a label value of at
# most 63 characters: `<name>-<group>` <= 52 with groups up to 999999 (the webhook's replica limit).
NAME_MAX = 52 - len("-999999")
HASH_CHARS = 8
TAIL_CHARS = 16


def _label_text(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")


def k8s_name(text: str, tail: str = "", limit: int = NAME_MAX) -> str:
    """A DNS-1035 label of at most `limit` characters (lowercase letters, digits and '-', starting with a
    letter) for `text` followed by `tail`. A text that does not pass unchanged (other characters, too
    long) is cut, keeping up to TAIL_CHARS of the tail (the deployment index and workload: what tells
    objects apart), and gets a hash of the whole text, so that two texts never share a name."""
    whole = f"{text}-{tail}" if tail else text
    name = _label_text(whole)
    if name[:1].isalpha() and name == whole and len(name) <= limit:
        return name
    digest = hashlib.sha256(whole.encode()).hexdigest()[:HASH_CHARS]
    end = _label_text(tail)[:TAIL_CHARS].strip("-")
    head = _label_text(text)
    head = head if head[:1].isalpha() else f"x-{head}"
    head = head[:limit - HASH_CHARS - 1 - (len(end) + 1 if end else 0)].rstrip("-")
    return "-".join(part for part in (head, end, digest) if part)


def _groups(script: LaunchScript) -> dict[int, list[list[Server]]]:
    """Each deployment's replicas (LeaderWorkerSet groups) with their servers, host by host."""
    by_deployment: dict[int, list[list[Server]]] = {}
    for server in script.servers:
        if server.deployment < 0:
            continue
        groups = by_deployment.setdefault(server.deployment, [])
        while len(groups) <= server.replica:
            groups.append([])
        groups[server.replica].append(server)
    return by_deployment


def _names(plan: Plan, engine: str) -> tuple[str, dict[int, str]]:
    """The plan's name (labels, the ConfigMap) and each deployment's LeaderWorkerSet name; each is cut
    from the whole text (problem, engine, deployment index, workload), so distinct texts stay distinct."""
    base = k8s_name(f"{plan.problem}-{engine}")
    return base, {i: k8s_name(f"{plan.problem}-{engine}", f"{i}-{d.workload}") for i, d in enumerate(plan.deployments)}


def group_endpoints(plan: Plan, script: LaunchScript, engine: str) -> dict[tuple[str, str], list[tuple[str, int, int | None]]]:
    """(workload, role) -> (leader DNS name, port, bootstrap port) of every group: every group runs the
    first replica's command, so its ports; the DNS name stands in for a host."""
    _, names = _names(plan, engine)
    out: dict[tuple[str, str], list[tuple[str, int, int | None]]] = {}
    for index, groups in sorted(_groups(script).items()):
        d, leader = plan.deployments[index], groups[0][0]
        flat = ["".join(p for p in w if isinstance(p, str)) for w in leader.argv]
        bootstrap = int(flat[flat.index("--disaggregation-bootstrap-port") + 1]) if "--disaggregation-bootstrap-port" in flat else None
        for g in range(len(groups)):
            out.setdefault((d.workload, d.role), []).append((f"{names[index]}-{g}.{names[index]}", leader.port, bootstrap))
    return out


def _shell_word(w: Word, server: Server, dns: dict[str, str]) -> str:
    """One word for `sh -c`: hosts become the group leader's address (or this pod's own, or another
    group's DNS name for a router), per-host numbers are computed from LWS_WORKER_INDEX."""
    out = []
    for part in w:
        if isinstance(part, HostRef):
            if part.host in dns:
                out.append(shlex.quote(dns[part.host]))
            elif part.host == server.host and server.host_rank > 0:
                out.append('"$(hostname -i)"')
            else:
                out.append('"${LWS_LEADER_ADDRESS}"')
        elif isinstance(part, RankRef):
            if part.value and part.per_host is None:
                raise PlannerInputError(InputIssue("placement", "hosts of one replica hold different numbers of data-parallel ranks",
                                                   "export the launch script instead (--format with an engine)"))
            out.append('"${LWS_WORKER_INDEX}"' if part.per_host == 1 else f'"$((LWS_WORKER_INDEX * {part.per_host}))"')
        elif part:
            out.append(shlex.quote(part))
    return "".join(out) or "''"


def _command(server: Server, dns: dict[str, str] | None = None) -> str:
    """The server's command as one `sh -c` line; the device selection (`*_VISIBLE_DEVICES=`) is
    dropped, since the device plugin hands the pod its accelerators."""
    words = list(server.argv)
    if words and words[0] == ("env",):
        assignments = []
        words = words[1:]
        while words and "=" in "".join(p for p in words[0] if isinstance(p, str)) and not str(words[0][0]).startswith("-"):
            if not re.match(r"^[A-Z_]+_VISIBLE_DEVICES=", str(words[0][0])):
                assignments.append(words[0])
            words = words[1:]
        words = [("env",), *assignments, *words] if assignments else words
    return "exec " + " ".join(_shell_word(w, server, dns or {}) for w in words)


def _leader_worker_set(name: str, labels: dict, groups: list[list[Server]], needs: PodNeeds, serving: dict) -> dict:
    """One deployment's LeaderWorkerSet: a group per replica, the leader pod its first host (the one that
    serves HTTP, labelled `serving` for its workload's Service), the workers its other hosts."""
    first = groups[0]
    leader = pod_template(container("leader", _command(first[0]), needs, first[0].port), needs, serving)
    if len(first) == 1:
        template = {"size": 1, "restartPolicy": "RecreateGroupOnPodRestart", "workerTemplate": leader}
    else:
        template = {"size": len(first), "restartPolicy": "RecreateGroupOnPodRestart", "leaderTemplate": leader,
                    "workerTemplate": pod_template(container("worker", _command(first[1]), needs, None), needs)}
    return {"apiVersion": LWS_API_VERSION, "kind": "LeaderWorkerSet", "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": len(groups), "startupPolicy": "LeaderCreated", "leaderWorkerTemplate": template}}


def _nvlink_across_hosts(plan: Plan, d: PlanDeployment) -> bool:
    """Whether the deployment's rack joins several hosts in one NVLink domain (GB200 NVL72: 18 trays of 4)."""
    rack = d.placement[0].accelerator.rsplit("/", 1)[0]
    info = plan.racks.get(rack)
    return vendor_of(plan, d.accelerator) == "NVIDIA" and (info.accelerators if info else 0) > host_size(plan, rack)


def _service(name: str, base: str, workload_label: str, port: int) -> dict:
    """A Service over the pods that answer a workload (its servers' leaders, or its router), by the label they carry."""
    selector = {"app.kubernetes.io/part-of": base, WORKLOAD_LABEL: workload_label, LWS_WORKER_INDEX_LABEL: "0"}
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": base}},
            "spec": {"selector": selector, "ports": [{"name": "http", "port": port, "targetPort": "http"}]}}


def _server_docs(plan: Plan, script: LaunchScript, engine: str, vendors: dict[int, str], configmap: str, routed: set[str]) -> list[dict]:
    """Per deployment its LeaderWorkerSet, and a ComputeDomain before it where its groups span NVLink trays."""
    base, names = _names(plan, engine)
    problem, docs = plan.problem, []
    for index, groups in sorted(_groups(script).items()):
        d, first = plan.deployments[index], groups[0]
        if engine == "trtllm" and first[0].argv[0] == ("mpirun",):
            raise PlannerInputError(InputIssue(f"deployments[{index}]", "a TensorRT-LLM replica over several hosts starts with mpirun, "
                                               "which needs an MPI launcher between pods", "export --format trtllm (scripts) or use sglang or vllm"))
        claim = None
        if len(first) > 1 and _nvlink_across_hosts(plan, d):
            claim = k8s_name(f"{problem}-{engine}", f"{index}-imex-channel")
            docs.append(compute_domain(k8s_name(f"{problem}-{engine}", f"{index}-imex"), claim, {"app.kubernetes.io/part-of": base}))
        ckpt = checkpoint(plan, d)
        needs = PodNeeds(IMAGES.get((engine, vendors[index]), IMAGES[(engine, "NVIDIA")]), vendors[index],
                         d.accelerators_per_replica // len(first), configmap, ckpt.repo, claim, ckpt.gated)
        serving = None if d.workload in routed else {"app.kubernetes.io/part-of": base, WORKLOAD_LABEL: _workload_label(d.workload)}
        docs.append(_leader_worker_set(names[index], {"app.kubernetes.io/part-of": base, "app.kubernetes.io/component": "server"},
                                       groups, needs, serving))
    return docs


def _workload_label(workload: str) -> str:
    return k8s_name(workload, limit=63)


def manifests_text(plan: Plan, script: LaunchScript, engine: str, vendors: dict[int, str]) -> str:
    """Multi-document YAML: a ConfigMap with the files, per deployment a LeaderWorkerSet (and a ComputeDomain
    for groups across NVLink trays), a router LeaderWorkerSet per disaggregated workload, a Service per workload."""
    base, _ = _names(plan, engine)
    problem = plan.problem
    configmap = k8s_name(f"{problem}-{engine}", "files")
    docs: list[dict] = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": configmap, "labels": {"app.kubernetes.io/part-of": base}},
                         "data": dict(script.files)}]
    routers = [s for s in script.servers if s.deployment < 0]
    routed = {s.label.removeprefix("router-") for s in routers}
    docs += _server_docs(plan, script, engine, vendors, configmap, routed)
    leaders = {e[0]: e[0] for endpoints in script.endpoints.values() for e in endpoints}  # router endpoints are DNS names already
    for file_name, rows in script.generated_files.items():  # router configs: hosts by their leaders' DNS names
        docs[0]["data"][file_name] = "\n".join("".join(leaders[p.host] if isinstance(p, HostRef) else str(p) for p in row) for row in rows)
    for server in routers:
        workload = server.label.removeprefix("router-")
        needs = PodNeeds(IMAGES[(engine, "NVIDIA")], "none", 0, configmap)  # SGLang's image carries its router (docker/Dockerfile)
        serving = {"app.kubernetes.io/part-of": base, WORKLOAD_LABEL: _workload_label(workload)}
        router = pod_template(container("router", _command(server, leaders), needs, server.port, server.health_path), needs, serving)
        docs.append({"apiVersion": LWS_API_VERSION, "kind": "LeaderWorkerSet",
                     "metadata": {"name": k8s_name(f"{problem}-{engine}", server.label),
                                  "labels": {"app.kubernetes.io/part-of": base, "app.kubernetes.io/component": "router"}},
                     "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 1, "workerTemplate": router}}})
    for workload in dict.fromkeys(d.workload for d in plan.deployments):
        docs.append(_service(k8s_name(f"{problem}-{engine}", f"svc-{workload}"), base, _workload_label(workload), API_PORT))
    return "\n".join(_header(script)) + "\n" + yaml.safe_dump_all(docs, sort_keys=False, width=1 << 16)


def _header(script: LaunchScript) -> list[str]:
    header = [f"# {script.header[0]}", "# Kubernetes: LeaderWorkerSet manifests (kubernetes-sigs/lws v0.10.0 API): kubectl apply -f THIS_FILE.",
              f"# Images: the engine releases the flags were checked against ({ENGINE_VERSIONS[script.engine]}).",
              f"# Hugging Face downloads read HF_TOKEN from the secret '{HF_SECRET}' (required for models the catalog or the problem",
              f"# marks gated): kubectl create secret generic {HF_SECRET} --from-literal={HF_SECRET_KEY}=<your token>.",
              f"# Each workload is reached through its Service (port {API_PORT}), which spreads requests over its replicas;",
              "# groups across NVLink trays claim an IMEX channel from a ComputeDomain (needs NVIDIA's DRA driver for GPUs).",
              *(f"# NOTE: {n}" for n in script.notes + ([TRTLLM_IMAGE_NOTE] if script.engine == "trtllm" else []))]
    return [re.sub(r"[\x00-\x1f\x7f]", " ", line) for line in header]
