"""Export a solved plan (the JSON `planner solve --json` writes) for serving stacks.

Formats:
- `json`: the placement document (format "llm-deployment-placement", version 1): for every
  deployment its layout and, per replica, one entry per accelerator with its rack, host, role,
  pipeline layers and the experts it holds in each MoE layer; plus the EPLB-style expert map.
- `lws`: Kubernetes LeaderWorkerSet manifests running the same commands (planner/output/kubernetes.py).
- `vllm`, `sglang`, `trtllm`: a launch script run on every host with `--host NAME`, which starts
  that host's servers (planner/output/launch.py; the servers of each engine in
  planner/output/engines.py). What an engine cannot express is written as a `# NOTE` line.

Physical expert slots are numbered rank-major: slot p lives on expert-parallel rank p // slots_per_rank.
"""

import json
from pathlib import Path

from planner import __version__
from planner.errors import InputIssue, PlannerInputError
from planner.output.engine_note import engine_mismatch_notes
from planner.output.engines import (
    ENGINE_BUILDERS,
    ENGINE_VERSIONS,
    ROUTER_PORT,
    Ports,
    host_size,
    hosts_of,
    replicas_of,
    vendor_of,
)
from planner.output.kubernetes import group_endpoints, manifests_text
from planner.output.launch import HostRef, LaunchScript, Server, render_script, word
from planner.output.launch import safe_file_name as safe_name

__all__ = ["SPREAD_ROUTER", "VLLM_ROUTER", "export_plan", "placement_document"]

PLACEMENT_FORMAT = "llm-deployment-placement"
PLACEMENT_FORMAT_VERSION = 1
VLLM_ROUTER = "vllm_pd_router.py"  # the prefill/decode router of vLLM exports, in planner/output/files/
SPREAD_ROUTER = "spread_router.py"  # the router over aggregated replicas of vLLM and TensorRT-LLM scripts, beside it


def _experts_of(d: dict, role: dict) -> dict[str, list[int]]:
    """Logical experts an accelerator holds in each MoE layer of its stage."""
    emap = d.get("expert_map")
    if not emap or role.get("ep_rank") is None:
        return {}
    slots, rank = emap["slots_per_rank"], role["ep_rank"]
    moe_layers = {layer["layer"] for layer in emap["layers"]}
    first, last = role["layers"]
    return {str(layer): emap["physical_to_logical_map"][layer][rank * slots:(rank + 1) * slots]
            for layer in range(first, last) if layer in moe_layers}


def placement_document(record: dict) -> dict:
    """The `json` export: every accelerator of every replica with its role and experts."""
    deployments = []
    for i, d in enumerate(record["deployments"]):
        replicas = []
        for roles in replicas_of(d):
            entries = []
            for role in roles:
                entry = {k: role[k] for k in ("accelerator", "rack", "stage", "layers", "tp_rank", "dp_rank", "ep_rank", "expert_tp_rank")}
                index = int(role["accelerator"].rsplit("/", 1)[1])
                entry["host"] = f"{role['rack']}/host{index // host_size(record, role['rack'])}"
                entry["role"] = _role_text(role)
                entry["experts_per_layer"] = _experts_of(d, role)
                entries.append(entry)
            replicas.append({"replica": roles[0]["replica"], "accelerators": entries})
        emap = d.get("expert_map")
        deployments.append({
            "id": f"{d['workload']}-{i}",
            "workload": d["workload"],
            "model": d["model"],
            "rack": d["rack"],
            "role": d.get("role", "aggregated"),
            "accelerator_type": d["accelerator"],
            "layout": {k: d[k] for k in ("tp", "ep", "pp", "dp_attn", "expert_tp")},
            "batch_per_replica": d["batch_per_replica"],
            "precisions": d["precisions"],
            "replicas": replicas,
            "expert_map": None if emap is None else {
                "num_ep_ranks": emap["n_ranks"], "slots_per_rank": emap["slots_per_rank"],
                "num_physical_experts": emap["n_ranks"] * emap["slots_per_rank"],
                "physical_to_logical_map": emap["physical_to_logical_map"],
            },
        })
    return {
        "format": PLACEMENT_FORMAT,
        "format_version": PLACEMENT_FORMAT_VERSION,
        "generated_by": f"planner {__version__}",
        "problem": record.get("problem"),
        "deployments": deployments,
    }


def _role_text(role: dict) -> str:
    text = f"stage {role['stage']} (layers {role['layers'][0]}-{role['layers'][1] - 1}), attention dp {role['dp_rank']} tp {role['tp_rank']}"
    if role.get("ep_rank") is not None:
        text += f", expert rank {role['ep_rank']}"
    return text


# ---------------------------------------------------------------------------------------------
# launch scripts


def _unsupported(record: dict, fmt: str) -> None:
    """Refuse an engine that cannot run on the plan's accelerators, before anything is written."""
    for i, d in enumerate(record["deployments"]):
        vendor = vendor_of(record, d["accelerator"])
        if fmt == "trtllm" and vendor != "NVIDIA":
            raise PlannerInputError(InputIssue(f"deployments[{i}]", f"TensorRT-LLM runs on NVIDIA GPUs only; {d['accelerator']} is {vendor}",
                                               "export --format vllm or sglang (both have ROCm builds)"))
        if vendor not in ("NVIDIA", "AMD"):
            raise PlannerInputError(InputIssue(f"deployments[{i}]", f"no {fmt} launch script for {vendor} {d['accelerator']} accelerators",
                                               "export --format json and start the engine's own TPU / Neuron build from the placement"))


def _routers(record: dict, fmt: str, script: LaunchScript, ports: Ports) -> None:
    """One request router per disaggregated workload, on the host of its first prefill server."""
    for workload in dict.fromkeys(d["workload"] for d in record["deployments"]):
        prefill, decode = script.endpoints.get((workload, "prefill"), []), script.endpoints.get((workload, "decode"), [])
        if not prefill or not decode:
            continue
        host = prefill[0][0]
        port = ports.take(host, ROUTER_PORT)
        if fmt == "sglang":
            argv = [word("python3"), word("-m"), word("sglang_router.launch_router"), word("--pd-disaggregation")]
            for h, p, bootstrap in prefill:
                argv += [word("--prefill"), word("http://", HostRef(h), f":{p}"), word(bootstrap)]
            for h, p, _ in decode:
                argv += [word("--decode"), word("http://", HostRef(h), f":{p}")]
            argv += [word("--host"), word("0.0.0.0"), word("--port"), word(port)]
        elif fmt == "trtllm":
            config = safe_name(f"disagg_config_{workload}.yaml")
            lines = [word("hostname: 0.0.0.0"), word(f"port: {port}"), word("backend: pytorch"), word("context_servers:"),
                     word(f"  num_instances: {len(prefill)}"), word("  urls:")]
            lines += [word('    - "', HostRef(h), f':{p}"') for h, p, _ in prefill]
            lines += [word("generation_servers:"), word(f"  num_instances: {len(decode)}"), word("  urls:")]
            lines += [word('    - "', HostRef(h), f':{p}"') for h, p, _ in decode]
            script.generated_files[config] = lines
            argv = [word("trtllm-serve"), word("disaggregated"), word("-c"), word(config)]
        else:  # our own router (planner/output/files/), shipped with the other files: nothing to copy by hand
            script.files[VLLM_ROUTER] = (Path(__file__).parent / "files" / VLLM_ROUTER).read_text()
            argv = [word("python3"), word(VLLM_ROUTER), word("--host"), word("0.0.0.0"), word("--port"), word(port)]
            argv += [word("--prefiller-hosts"), *(word(HostRef(h)) for h, _, _ in prefill)]
            argv += [word("--prefiller-ports"), *(word(p) for _, p, _ in prefill)]
            argv += [word("--decoder-hosts"), *(word(HostRef(h)) for h, _, _ in decode)]
            argv += [word("--decoder-ports"), *(word(p) for _, p, _ in decode)]
        # the vLLM router answers on /healthcheck (planner/output/files/vllm_pd_router.py)
        script.servers.append(Server(host, f"router-{workload}", argv, port, "/healthcheck" if fmt == "vllm" else "/health"))


def _spreaders(record: dict, fmt: str, script: LaunchScript, ports: Ports) -> None:
    """A router per aggregated workload of several replicas, on its first replica's host, spreading requests
    over every replica: SGLang's own (sglang_router, regular mode), else ours (planner/output/files/)."""
    for workload in dict.fromkeys(d["workload"] for d in record["deployments"]):
        heads = [s for s in script.servers if s.deployment >= 0 and s.port is not None and s.host_rank == 0
                 and record["deployments"][s.deployment]["workload"] == workload
                 and record["deployments"][s.deployment].get("role", "aggregated") == "aggregated"]
        if len(heads) < 2:
            continue
        host, port = heads[0].host, ports.take(heads[0].host, ROUTER_PORT)
        if fmt == "sglang":
            argv = [word("python3"), word("-m"), word("sglang_router.launch_router"), word("--worker-urls")]
            argv += [word("http://", HostRef(s.host), f":{s.port}") for s in heads]
        else:
            script.files[SPREAD_ROUTER] = (Path(__file__).parent / "files" / SPREAD_ROUTER).read_text()
            argv = [word("python3"), word(SPREAD_ROUTER), word("--server-hosts"), *(word(HostRef(s.host)) for s in heads)]
            argv += [word("--server-ports"), *(word(s.port) for s in heads)]
            argv += [word("--server-batches"), *(word(record["deployments"][s.deployment]["batch_per_replica"]) for s in heads)]
        argv += [word("--host"), word("0.0.0.0"), word("--port"), word(port)]
        script.servers.append(Server(host, f"router-{workload}", argv, port, "/health"))
        script.header.append(f"workload {workload}: send requests to its router on {host} port {port}, which spreads them over its "
                             f"{len(heads)} replicas")


def build_launch(record: dict, fmt: str, routers: bool = True) -> LaunchScript:
    """The servers, files and notes of the plan for engine `fmt` (see planner/output/launch.py)."""
    _unsupported(record, fmt)
    hosts = list(dict.fromkeys(h.name for d in record["deployments"] for roles in replicas_of(d) for h in hosts_of(record, roles)))
    header = [f"{ENGINE_VERSIONS[fmt]} launch script for plan '{record.get('problem')}', generated by planner {__version__}.",
              "Run it on every host of the plan: ./launch.sh --host NAME (--list-hosts shows the names); it reads the hosts'",
              "addresses from hosts.txt ('NAME ADDRESS' per line), starts that host's servers, waits for them and stops them together."]
    for i, d in enumerate(record["deployments"]):
        header.append(f"deployment {i}: {d['workload']} ({d['model']}) on {d['rack']}, {d['replicas']} {d.get('role', 'aggregated')} "
                      f"replica(s), TP{d['tp']} DPattn{d['dp_attn']} EP{d['ep']} PP{d['pp']}, batch {d['batch_per_replica']}")
    script, ports = LaunchScript(fmt, header, hosts, []), Ports()
    script.notes += engine_mismatch_notes(record, fmt)
    for i, d in enumerate(record["deployments"]):
        ENGINE_BUILDERS[fmt](record, d, i, script, ports)
    if routers:
        _routers(record, fmt, script, ports)
        _spreaders(record, fmt, script, ports)
    return script


def export_plan(record: dict, fmt: str, engine: str | None = None) -> str:
    """The plan in `fmt` (an ExportFormat value) as text; `engine` picks the engine of `lws`
    manifests (default: the plan's)."""
    if fmt == "json":
        return json.dumps(placement_document(record), indent=2, allow_nan=False) + "\n"
    if fmt == "lws":  # routers address each group's leader by its DNS name, at the template's ports
        engine = engine or record["deployments"][0].get("engine", "trtllm")
        script = build_launch(record, engine, routers=False)
        script.endpoints = group_endpoints(record, script, engine)
        _routers(record, engine, script, Ports())
        vendors = {i: vendor_of(record, d["accelerator"]) for i, d in enumerate(record["deployments"])}
        return manifests_text(record, script, engine, vendors)
    return render_script(build_launch(record, fmt))
